"""`python -m flashcheck.reports.bench.attention_ceiling`: how fast can Triton attention get on this GPU?

Issue 20 asks for attention at or above cuDNN. This bench measures the ceiling that Triton itself
reaches on the main table's shapes, so a gap can be split into two parts: what our kernel gives up
for its generality, and what Triton cannot reach at all.

The probe is the simplest fast forward Triton can express:
- dense, contiguous (B, H, S, D) inputs with S a multiple of every tile, so there are no masks, no
  key tail, no strides and no varlen;
- host TMA descriptors (`triton.tools.tensor_descriptor`);
- the scale folded into exp2's FMA;
- the unrounded row sum (FlashAttention's convention, outside our contract);
- a causal diagonal in its own loop;
- for each tile, with and without `tl.range(..., warp_specialize=True)`, Triton 3.6's automatic
  warp specialisation.

It is a yardstick, never shipped to users: no checks, no fallbacks. Each probe output is compared
with SDPA's, and the largest difference is printed. The table shows, per case, the best probe tile
against cuDNN and against our kernel, all timed in one run (triton.testing.do_bench, median).
`--quick`: one shape. `--all-tiles`: every tile's TFLOP/s, not just the best.
"""
from __future__ import annotations

import argparse
import json

import torch

from flashcheck import kernels  # noqa: F401  (kernels: runtime switch first)
from flashcheck.kernels._common import tl, triton
from flashcheck.reports.bench.attention import SHAPES
from flashcheck.reports.bench.common import DTYPES, bench_ms, command_line, flops, no_gpu, sdpa_call

PROG = "python -m flashcheck.reports.bench.attention_ceiling"
# (BLOCK_M, BLOCK_N, num_warps, num_stages), each with and without warp specialisation
TILES = {64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 4, 2),
              (256, 64, 8, 2), (256, 128, 8, 2)],
         128: [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3),
               (128, 64, 8, 2), (256, 64, 8, 2)]}


@triton.jit
def _probe_kernel(desc_q, desc_k, desc_v, desc_o, sm_scale, N_CTX, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WS: tl.constexpr,
                  IS_BF16: tl.constexpr):
    DT: tl.constexpr = tl.bfloat16 if IS_BF16 else tl.float16
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # causal: the longest rows first
    y0 = tl.program_id(1) * N_CTX
    qy = y0 + start_m * BLOCK_M
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.44269504
    q = desc_q.load([qy, 0])
    hi = start_m * BLOCK_M if CAUSAL else N_CTX
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        qk = tl.dot(q, desc_k.load([y0 + start_n, 0]).T)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(DT), desc_v.load([y0 + start_n, 0]), acc * alpha[:, None])
        m_i = m_ij
    if CAUSAL:
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        for start_n in tl.range(start_m * BLOCK_M, (start_m + 1) * BLOCK_M, BLOCK_N):
            qk = tl.dot(q, desc_k.load([y0 + start_n, 0]).T)
            keep = offs_m[:, None] >= (start_n + tl.arange(0, BLOCK_N))[None, :]
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = tl.dot(p.to(DT), desc_v.load([y0 + start_n, 0]), acc * alpha[:, None])
            m_i = m_ij
    desc_o.store([qy, 0], (acc / l_i[:, None]).to(DT))


def probe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tile: tuple, ws: bool) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, warps, stages = tile
    b, h, s, d = q.shape
    o = torch.empty_like(q)

    def desc(t, rows):
        return TensorDescriptor.from_tensor(t.view(-1, d), [rows, d])

    _probe_kernel[(s // bm, b * h)](desc(q, bm), desc(k, bn), desc(v, bn), desc(o, bm), d ** -0.5, s,
                                    HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, WS=ws,
                                    IS_BF16=q.dtype == torch.bfloat16, num_warps=warps, num_stages=stages)
    return o


def run_case(b: int, h: int, s: int, d: int, dtype: torch.dtype, causal: bool) -> dict:
    from torch.nn.attention import SDPBackend

    from flashcheck.kernels.attention import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    fl = flops(b, h, s, d, causal)

    def tflops(fn) -> float:
        return fl / bench_ms(fn) / 1e9

    ref = sdpa_call(SDPBackend.FLASH_ATTENTION, q, k, v, causal)()
    row = {"dtype": str(dtype).replace("torch.", ""), "shape": (b, h, s, d), "causal": causal,
           "cudnn": tflops(sdpa_call(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)),
           "ours": tflops(lambda: attention(q, k, v, causal=causal)), "tiles": {}}
    for tile in TILES[d]:
        for ws in (False, True):
            name = f"{tile}{' ws' if ws else ''}"
            try:
                diff = float((probe(q, k, v, causal, tile, ws).float() - ref.float()).abs().max())
                row["tiles"][name] = (tflops(lambda: probe(q, k, v, causal, tile, ws)), diff)
            except Exception as e:  # noqa: BLE001  (Triton refuses some tiles with warp specialisation)
                row["tiles"][name] = (None, f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:80]}"
                                      if str(e).strip() else type(e).__name__)
    ok = {n: t for n, (t, _) in row["tiles"].items() if t is not None}
    row["best"] = max(ok, key=ok.get)
    return row


def to_markdown(rows: list[dict], command: str) -> str:
    gpu = torch.cuda.get_device_name()
    lines = [f"{gpu}; torch {torch.__version__}, triton {triton.__version__}; `{command}`. TFLOP/s, one run.", "",
             "| dtype | B, H, S, D | causal | SDPA cuDNN | ours | probe, best tile | tile (M, N, warps, stages) "
             "| probe / cuDNN | ours / cuDNN | ours / probe | max abs(probe - SDPA flash) |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        best, diff = r["tiles"][r["best"]]
        lines.append(f"| {r['dtype']} | {', '.join(map(str, r['shape']))} | {r['causal']} | {r['cudnn']:.0f} "
                     f"| {r['ours']:.0f} | {best:.0f} | {r['best']} | {best / r['cudnn']:.2f}x "
                     f"| {r['ours'] / r['cudnn']:.2f}x | {r['ours'] / best:.2f}x | {diff:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one shape only")
    p.add_argument("--all-tiles", action="store_true", help="print every tile's TFLOP/s and difference")
    args = p.parse_args(argv)
    if no_gpu(PROG):
        return 2
    rows = []
    for dtype in DTYPES:
        for shape in SHAPES[:1] if args.quick else SHAPES:
            for causal in (False, True):
                r = run_case(*shape, dtype, causal)
                rows.append(r)
                print(f"{r['dtype']} {shape} causal={causal}: cudnn {r['cudnn']:.0f}, ours {r['ours']:.0f}, "
                      f"probe {r['tiles'][r['best']][0]:.0f} at {r['best']}", flush=True)
                if args.all_tiles:
                    print(json.dumps(r["tiles"]), flush=True)
    print(to_markdown(rows, command_line(PROG, argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
