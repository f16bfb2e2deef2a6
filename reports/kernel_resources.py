"""`python -m flashcheck.reports.kernel_resources`: registers, spills and shared memory of the
production attention kernel's main variants, compiled for Hopper (sm_90) with no GPU at all.

Triton compiles to a cubin without a device. ptxas and cuobjdump ship with Triton's NVIDIA backend,
so on a CPU machine this reads what the GPU will run. Every variant's launch arguments come from the
real launcher (`kernels.attention_plan.launch_plan`, the GPU tile table), and each argument is
specialised as Triton 3.6's JIT specialises it at launch: an int equal to 1 becomes a constant, a
multiple of 16 is marked divisible unless the kernel opts out, and pointers are 16-byte aligned.

Why it exists: on an H200 the attention kernel lost 30% of its prefill speed with its output bits
unchanged (reports/attention_bench.md). The cause was registers: 210 instead of 103 for the fp16 D64
tile, so a 256-thread CTA no longer shared its SM, and every D128 variant spilled. A run of this tool
shows that in seconds, where a profile would need the GPU.

The kernels must be imported with the interpreter off, so the work runs in a child process with
TRITON_INTERPRET=0. `--cases` picks rows by name.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

PROG = "python -m flashcheck.reports.kernel_resources"
SHAPE = (4, 16, 4096)  # B, H, S: contiguous (B, H, S, D) tensors, as the benches use
CASES = {f"{dt} D{d}{' causal' if c else ''}": (dt, d, c)
         for dt in ("fp16", "bf16", "fp32") for d in (64, 128) for c in (False, True)}
REGS_PER_SM, SMEM_PER_SM = 65536, 233472  # Hopper: 64K 32-bit registers, 228 KiB shared memory per SM
_PTR = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}


def _args(plan, dtype_name: str, fn) -> tuple[dict, dict, dict]:
    """Triton's (signature, constexprs, attrs) for `_attn_fwd_kernel` launched with `plan` on
    contiguous tensors of this dtype, no mask, no lse, no split (the launcher's stand-ins)."""
    ptr = _PTR[dtype_name]
    # q, k, v, o, lse (o's stand-in), kv_lens, cu_q, cu_k (int32 stand-ins), mask, m, l, l32 (o's)
    pointers = [ptr] * 5 + ["*i32"] * 3 + [ptr] * 4
    values = dict(zip((p.name for p in fn.params), [*pointers, *plan.args]))
    values.update({k: v for k, v in plan.meta.items() if k != "num_warps"})
    sig, consts, attrs = {}, {}, {}
    for p in fn.params:
        v = values[p.name]
        if p.is_constexpr:
            sig[p.name], consts[(p.num,)] = "constexpr", v
        elif isinstance(v, str):
            sig[p.name] = v
            if not p.do_not_specialize_on_alignment:
                attrs[(p.num,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        elif not p.do_not_specialize and v == 1:
            sig[p.name], consts[(p.num,)] = "constexpr", 1
        else:
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
            if not p.do_not_specialize and not p.do_not_specialize_on_alignment and v % 16 == 0:
                attrs[(p.num,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def _usage(cubin: bytes) -> dict:
    """Registers, stack (spill) bytes and static shared memory from cuobjdump's resource line."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "REG:" in ln)
    fields = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
    return {"regs": int(fields["REG"]), "stack": int(fields["STACK"])}


def measure(names) -> list[dict]:
    """In a process with the interpreter off: compile each case and read its resources."""
    import importlib

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attn = importlib.import_module("flashcheck.kernels.attention")
    plan_of = importlib.import_module("flashcheck.kernels.attention_plan").launch_plan
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    rows = []
    for name in names:
        dt, d, causal = CASES[name]
        b, h, s = SHAPE
        shape, stride = torch.Size((b, h, s, d)), (h * s * d, s * d, d, 1)
        plan = plan_of(dtypes[dt], shape, stride, shape, stride, shape, stride, shape, stride, None, None,
                       batch=b, m_max=s, n_max=s, varlen=False, causal=causal, scale=None, has_kv_lens=False,
                       window=(-1, -1), softcap=0.0, causal_align="top_left", return_lse=False, num_splits=1,
                       pack_gqa=None, block_m=None, block_n=None, num_warps=None, num_stages=None, rowsum_fp32=False)
        sig, consts, attrs = _args(plan, dt, attn._attn_fwd_kernel)
        cfg = plan.cfg
        kernel = triton.compile(ASTSource(attn._attn_fwd_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        use = _usage(kernel.asm["cubin"])
        threads = 32 * cfg.num_warps
        smem = kernel.metadata.shared
        by_regs = REGS_PER_SM // (max(use["regs"], 1) * threads)
        by_smem = SMEM_PER_SM // smem if smem else by_regs
        rows.append({"case": name, "tile": (cfg.block_m, cfg.block_n), "warps": cfg.num_warps,
                     "stages": cfg.num_stages, **use, "shared": smem, "ctas_per_sm": min(by_regs, by_smem)})
    return rows


def to_markdown(rows: list[dict]) -> str:
    head = "| case | tile (M, N) | warps | stages | registers | spill stack (bytes) | shared (bytes) | CTAs per SM (est.) |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['tile'][0]}, {r['tile'][1]} | {r['warps']} | {r['stages']} | {r['regs']} | "
              f"{r['stack']} | {r['shared']} | {r['ctas_per_sm']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated, from: {', '.join(CASES)} (default: all)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {', '.join(map(repr, bad))}; choose from {', '.join(CASES)}")
    if not args.child:
        env = {**os.environ, "TRITON_INTERPRET": "0"}
        done = subprocess.run([sys.executable, "-m", "flashcheck.reports.kernel_resources", "--child",
                               "--cases", ",".join(names)], env=env, capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{PROG}: compiling for sm_90 failed: {last}", file=sys.stderr)
            return 1
        print(done.stdout, end="")
        return 0
    print(to_markdown(measure(names)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
