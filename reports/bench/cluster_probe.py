"""`python -m flashcheck.reports.bench.cluster_probe`: can Triton hold one softmax row across a cluster?

Issue 20 asks for 64K-1M-column rows at 0.85 of copy and suggests keeping a row on chip across a
thread-block cluster (Hopper's distributed shared memory): one read and one write, where one CTA
per row must either re-read the row (three passes) or hold it in one SM's registers, which at 64K
16-bit columns leaves no room for a second CTA to overlap its load with another's store.

Triton exposes clusters only through the `num_ctas` launch option, which spreads one program's
tensors over the cluster's CTAs. This probe compiles the simplest whole-row softmax (load, max,
exp2, sum, store) for sm_90 on this CPU, no GPU needed, at each `num_ctas`, and reports whether it
compiles and how many cluster instructions (`mapa`, `shared::cluster`, `barrier.cluster`) its PTX
holds. With Triton 3.6 every num_ctas > 1 fails in the plan-CTA pass: a reduction across the
cluster's CTAs is not supported, whatever the tensor's rank.
"""
from __future__ import annotations

import argparse
import re

from flashcheck.reports.bench.kernel_resources import offline_child

PROG = "python -m flashcheck.reports.bench.cluster_probe"
CLUSTER_OPS = re.compile(r"shared::cluster|\bmapa\b|barrier\.cluster")
ROWS, WARPS = 64, 32  # the row as a (64, n / 64) tile (a 1-D row fails the same way), 32 warps a CTA


def probe(n: int, num_ctas: int) -> str:
    """One line: the outcome of compiling the probe for sm_90 (needs the interpreter off)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def _row_softmax_kernel(x_ptr, y_ptr, N: tl.constexpr, R: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * N
        offs = tl.arange(0, R)[:, None] * (N // R) + tl.arange(0, N // R)[None, :]
        x = tl.load(x_ptr + base + offs).to(tl.float32)
        m = tl.max(tl.max(x, 1, keep_dims=True), 0, keep_dims=True)
        e = tl.exp2((x - m) * 1.4426950408889634)
        s = tl.sum(tl.sum(e, 1, keep_dims=True), 0, keep_dims=True)
        tl.store(y_ptr + base + offs, (e / s).to(tl.float16))

    src = ASTSource(_row_softmax_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "N": "constexpr", "R": "constexpr"},
                    {(2,): n, (3,): ROWS}, {})
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=WARPS, num_ctas=num_ctas))
    except Exception as e:  # noqa: BLE001  (the outcome is the finding)
        return f"num_ctas={num_ctas}: does not compile ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    ops = len(CLUSTER_OPS.findall(kernel.asm["ptx"]))
    return f"num_ctas={num_ctas}: compiles, {ops} cluster instructions in the PTX"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=65536, help="row length, a power of two (default 65536)")
    p.add_argument("--ctas", default="1,2,4", help="comma-separated num_ctas values (default 1,2,4)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.n < 128 or args.n & (args.n - 1):
        p.error(f"--n must be a power of two >= 128, got {args.n}")
    try:
        ctas = [int(c) for c in args.ctas.split(",") if c.strip()]
    except ValueError:
        p.error(f"--ctas must be comma-separated integers, got {args.ctas!r}")
    if not ctas or any(c < 1 or c & (c - 1) for c in ctas):
        p.error(f"--ctas must be powers of two >= 1, got {args.ctas!r}")
    if not args.child:  # stderr carries MLIR's pass dumps of each failure; the verdicts are on stdout
        return offline_child(PROG, "flashcheck.reports.bench.cluster_probe", ["--n", str(args.n), "--ctas", args.ctas])
    print(f"whole-row softmax, fp16, {args.n} columns, {WARPS} warps a CTA, sm_90 (Triton "
          f"{__import__('triton').__version__}):")
    for c in ctas:
        print("  " + probe(args.n, c), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
