"""`python -m flashcheck.reports.bench.attention`: forward attention speed on the GPU, ours against SDPA.

fp16 and bf16; (B, H, S, D) = (4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 16384, 128); causal
and not. TFLOP/s of kernels.attention, of SDPA's flash backend and of SDPA's cuDNN backend, all
measured in the same run with triton.testing.do_bench. Prints a Markdown table (GPU name, date,
torch and triton versions, the command) and writes it to reports/records/attention_bench.md, as that file's
`main` section: the file is made of sections between `<!-- bench:NAME -->` markers, and a run
rewrites only the sections it measured (`write_sections`), so the feature tables of
reports/bench/attention_features.py (GQA, decode, varlen, window/softcap) live beside this one.

FLOPs: 4 B H S^2 D for the two matrix products, halved when causal (the usual convention).

`--sweep` also times alternative launch configurations of ours per case and prints the best (used
to fill the launch table in kernels/attention.py); `--quick` runs one shape; `--features` runs the
feature sections instead of this table, `--all` both.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .common import (
    DTYPES, HEAD, OUT, bench_ms, command_line, flops, max_diff, no_gpu, run_info, time_sdpa, write_sections,
)

SHAPES = [(4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 16384, 128)]
SWEEP = [  # (block_m, block_n, num_warps, num_stages, rowsum of the fp32 P as FlashAttention)
    (128, 64, 8, 3, False), (128, 64, 8, 4, False), (64, 64, 4, 3, False), (128, 128, 8, 3, False),
    (128, 128, 8, 2, False), (64, 128, 4, 3, False), (128, 64, 4, 3, False),
    (128, 64, 8, 3, True), (128, 128, 8, 3, True),
]


def run_case(b, h, s, d, dtype, causal, *, sweep: bool = False, log=print) -> dict:
    from flashcheck.kernels.attention import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    fl = flops(b, h, s, d, causal)
    row = {"dtype": str(dtype).removeprefix("torch."), "shape": (b, h, s, d), "causal": causal}
    times, ref = time_sdpa(q, k, v, causal, ("flash", "cudnn"), log=log)
    for name, ms in times.items():
        row[name] = None if ms is None else fl / (ms * 1e-3) / 1e12
    ours = attention(q, k, v, causal=causal)
    if ref is not None:
        row["max_abs_diff_vs_sdpa"] = max_diff(ours, ref)
    row["ours"] = fl / (bench_ms(lambda: attention(q, k, v, causal=causal)) * 1e-3) / 1e12
    if sweep:
        best = (row["ours"], None)
        for bm, bn, w, st, r32 in SWEEP:
            try:
                t = fl / (bench_ms(lambda: attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=w,
                                                   num_stages=st, _rowsum_fp32=r32), rep=150) * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001  (out of shared memory, say)
                log(f"    sweep {(bm, bn, w, st, r32)} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            log(f"    sweep {(bm, bn, w, st, r32)}: {t:.0f} TFLOP/s")
            if t > best[0]:
                best = (t, (bm, bn, w, st, r32))
        row["best_sweep"] = best
    return row


def to_markdown(rows: list[dict], command: str = "python -m flashcheck.reports.bench.attention") -> str:
    name = torch.cuda.get_device_name()
    lines = [f"## Attention forward speed, {name}", "",
             f"{run_info(command)}. "
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
    prog = "python -m flashcheck.reports.bench.attention"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true", help="also time alternative launch configurations")
    p.add_argument("--quick", action="store_true", help="one shape only (fewer cases in the feature sections)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--features", action="store_true",
                       help="only the feature sections (GQA, decode, varlen, window/softcap; "
                            "python -m flashcheck.reports.bench.attention_features)")
    which.add_argument("--all", action="store_true", help="the main table and the feature sections")
    p.add_argument("--out", type=Path, default=OUT, help="Markdown file, only its measured sections rewritten")
    args = p.parse_args(argv)
    if no_gpu(prog):
        return 2
    command = command_line(prog, argv)
    if not args.features:
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
        md = to_markdown(rows, command)
        print(md)
        write_sections(args.out, {"main": md}, HEAD)
        print(f"wrote {args.out}")
    if args.features or args.all:
        from .attention_features import SECTIONS, run_sections

        run_sections(SECTIONS, quick=args.quick, out=args.out, command=command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
