"""`python -m flashcheck.reports.bench_attention`: forward attention speed on the GPU, ours against SDPA.

fp16 and bf16; (B, H, S, D) = (4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 16384, 128); causal
and not. TFLOP/s of kernels.attention, of SDPA's flash backend and of SDPA's cuDNN backend, all
measured in the same run with triton.testing.do_bench. Prints a Markdown table (GPU name, date,
torch and triton versions) and writes it to reports/attention_bench.md.

FLOPs: 4 B H S^2 D for the two matrix products, halved when causal (the usual convention).

`--sweep` also times alternative launch configurations of ours per case and prints the best (used
to fill the launch table in kernels/attention.py); `--quick` runs one shape.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import torch

from flashcheck import kernels  # noqa: F401  (runtime switch first)
from flashcheck.kernels._runtime import INTERPRET

OUT = Path(__file__).resolve().parent / "attention_bench.md"
SHAPES = [(4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 16384, 128)]
DTYPES = [torch.float16, torch.bfloat16]
SWEEP = [  # (block_m, block_n, num_warps, num_stages, rowsum of the fp32 P as FlashAttention)
    (128, 64, 8, 3, False), (128, 64, 8, 4, False), (64, 64, 4, 3, False), (128, 128, 8, 3, False),
    (128, 64, 8, 3, True), (128, 128, 8, 3, True),
]


def flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def _bench(fn, rep: int = 400) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=min(100, rep // 4), rep=rep)  # ms


def _sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def run_case(b, h, s, d, dtype, causal, *, sweep: bool = False, log=print) -> dict:
    from torch.nn.attention import SDPBackend

    from flashcheck.kernels.attention import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    fl = flops(b, h, s, d, causal)
    row = {"dtype": str(dtype).removeprefix("torch."), "shape": (b, h, s, d), "causal": causal}
    ref = None
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            fn = _sdpa(backend, q, k, v, causal)
            out = fn()
            ref = out if ref is None else ref
            row[name] = fl / (_bench(fn) * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001  (a backend that refuses this input)
            row[name] = None
            log(f"  {name} unavailable: {type(e).__name__}: {str(e)[:120]}")
    ours = attention(q, k, v, causal=causal)
    if ref is not None:
        row["max_abs_diff_vs_sdpa"] = float((ours.float() - ref.float()).abs().max())
    row["ours"] = fl / (_bench(lambda: attention(q, k, v, causal=causal)) * 1e-3) / 1e12
    if sweep:
        best = (row["ours"], None)
        for bm, bn, w, st, r32 in SWEEP:
            try:
                t = fl / (_bench(lambda: attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=w,
                                                   num_stages=st, _rowsum_fp32=r32), rep=150) * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001  (out of shared memory, say)
                log(f"    sweep {(bm, bn, w, st, r32)} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            log(f"    sweep {(bm, bn, w, st, r32)}: {t:.0f} TFLOP/s")
            if t > best[0]:
                best = (t, (bm, bn, w, st, r32))
        row["best_sweep"] = best
    return row


def to_markdown(rows: list[dict]) -> str:
    import triton

    name = torch.cuda.get_device_name()
    lines = [f"# Attention forward speed, {name}", "",
             f"{dt.date.today().isoformat()}; torch {torch.__version__}, triton {triton.__version__}. "
             "TFLOP/s = 4 B H S^2 D / time (halved when causal), time from triton.testing.do_bench "
             "(median), all in one run. `flash` / `cudnn`: torch SDPA with that backend forced.", "",
             "| dtype | B, H, S, D | causal | ours | SDPA flash | SDPA cuDNN | ours / flash | ours / cuDNN |",
             "|---|---|---|---|---|---|---|---|"]

    def f(x):
        return "-" if x is None else f"{x:.0f}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    for r in rows:
        lines.append(f"| {r['dtype']} | {', '.join(map(str, r['shape']))} | {r['causal']} | {f(r['ours'])} | "
                     f"{f(r['flash'])} | {f(r['cudnn'])} | {ratio(r['ours'], r['flash'])} | "
                     f"{ratio(r['ours'], r['cudnn'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.reports.bench_attention", description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="also time alternative launch configurations")
    p.add_argument("--quick", action="store_true", help="one shape only")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if INTERPRET or not torch.cuda.is_available():
        print("bench_attention needs a GPU (the interpreter is far too slow to time)", file=sys.stderr)
        return 2
    rows = []
    shapes = SHAPES[:1] if args.quick else SHAPES
    for dtype in DTYPES:
        for shape in shapes:
            for causal in (False, True):
                r = run_case(*shape, dtype, causal, sweep=args.sweep and shape[2] <= 4096
                             and (shape[3] == 64 or dtype == torch.bfloat16))
                rows.append(r)
                print(f"{r['dtype']} {shape} causal={causal}: ours {r['ours']:.0f}, flash {r['flash']}, "
                      f"cudnn {r['cudnn']} TFLOP/s; max |ours - sdpa| {r.get('max_abs_diff_vs_sdpa')}"
                      + (f"; best sweep {r['best_sweep']}" if "best_sweep" in r else ""), flush=True)
    md = to_markdown(rows)
    print(md)
    args.out.write_text(md)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
