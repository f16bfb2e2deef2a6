"""`python -m flashcheck.reports.bench.kernel_resources`: registers, spills and shared memory of the
production kernels' main variants, compiled for Hopper (sm_90) with no GPU at all: the attention
kernel at the launcher's GPU tiles (prefill, and split-KV decode with and without splits), and the
long-row softmax kernels (online, split stats, split normalize) at the dispatcher's configuration
and at other `num_warps`, which leave their bits unchanged (the lane count decides the summation;
kernels/softmax.py). The last column counts the PTX's fused multiply-adds: the softmax kernels
compile with contraction off (`softmax.UNFUSED`), since where the compiler fuses depends on
num_warps, and so would the bits.

Triton compiles to a cubin without a device. ptxas and cuobjdump ship with Triton's NVIDIA backend,
so on a CPU machine this reads what the GPU will run. Launch arguments come from the real
launchers' configuration (`kernels.attention_plan.launch_plan`, `kernels.softmax.split_config`,
`online_config`), and each argument is specialised as Triton 3.6's JIT specialises it at launch:
an int equal to 1 becomes a constant, a multiple of 16 is marked divisible unless the kernel opts
out, and pointers are 16-byte aligned.

Why it exists: on an H200 the attention kernel lost 30% of its prefill speed with its output bits
unchanged (reports/records/attention_bench.md). The cause was registers: 210 instead of 103 for the fp16 D64
tile, so a 256-thread CTA no longer shared its SM, and every D128 variant spilled. A run of this tool
shows that in seconds, where a profile would need the GPU.

The kernels must be imported with the interpreter off, so the work runs in a child process with
TRITON_INTERPRET=0. `--cases` picks rows by name.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

PROG = "python -m flashcheck.reports.bench.kernel_resources"
SHAPE = (4, 16, 4096)  # B, H, S: contiguous (B, H, S, D) tensors, as the benches use
CASES = {f"attention {dt} D{d}{' causal' if c else ''}": ("attention", dt, d, c, 0)
         for dt in ("fp16", "bf16", "fp32") for d in (64, 128) for c in (False, True)}  # torch-free for --help
DECODE = (4, 32, 8, 4096)  # B, Hq, Hkv, N: one query token, the decode bench's GQA shape
# Split-KV decode: each split stores its partial state, and the tile's last split merges them.
CASES.update({f"attention decode {dt} D{d} splits={s}": ("attention", dt, d, False, s)
              for dt in ("fp16", "bf16") for d in (64, 128) for s in (1, 4)})
SOFTMAX_N = 262144  # a long row: the split-row dispatch's shapes
SOFTMAX_WARPS = (None, 4, 8)  # None: the configuration's own (16 at block 4096: softmax.chunk_warps)
CASES.update({f"softmax {k} {dt}{'' if w is None else f' warps={w}'}": ("softmax", dt, k, w)
              for k in ("online", "split_stats", "split_normalize") for dt in ("fp16", "fp32") for w in SOFTMAX_WARPS})
REGS_PER_SM, SMEM_PER_SM = 65536, 233472  # Hopper: 64K 32-bit registers, 228 KiB shared memory per SM
_TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}  # Triton's dtype names to torch's


def _signature(fn, values: dict) -> tuple[dict, dict, dict]:
    """Triton's (signature, constexprs, attrs) for `fn` launched with `values` (pointers given as
    their Triton type, e.g. "*fp16"), specialised as the JIT does."""
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


def _attention_launch(dt: str, d: int, causal: bool, decode_splits: int):
    """(kernel, argument values, compile options, tile) of the attention launcher for
    contiguous (B, H, S, d) tensors, no mask or lse; decode_splits > 0: a decode call of shape
    DECODE with that many splits (its workspace and counters as the launcher passes them)."""
    import importlib

    import torch

    attn = importlib.import_module("flashcheck.kernels.attention")
    plan_of = importlib.import_module("flashcheck.kernels.attention_plan").launch_plan
    if decode_splits:
        b, hq, hkv, n = DECODE
        q_shape, kv_shape, m = torch.Size((b, hq, 1, d)), torch.Size((b, hkv, n, d)), 1
    else:
        b, h, n = SHAPE
        q_shape = kv_shape = torch.Size((b, h, n, d))
        m = n
    q_stride, kv_stride = _dense(q_shape), _dense(kv_shape)
    plan = plan_of(_dtype(dt), q_shape, q_stride, kv_shape, kv_stride, kv_shape, kv_stride, q_shape, q_stride,
                   None, None, batch=b, m_max=m, n_max=n, varlen=False, causal=causal, scale=None,
                   has_kv_lens=False, window=(-1, -1), softcap=0.0, causal_align="top_left", return_lse=False,
                   num_splits=max(1, decode_splits), pack_gqa=None, block_m=None, block_n=None, num_warps=None,
                   num_stages=None, rowsum_fp32=False)
    fn = attn._attn_fwd_kernel
    # q, k, v, o, lse (o's stand-in), kv_lens, cu_q, cu_k (int32 stand-ins), mask (o's stand-in),
    # then split-KV's fp32 workspace and int32 counters (o's stand-ins unsplit), as `_launch` passes them
    split = plan.splits > 1
    pointers = [f"*{dt}"] * 5 + ["*i32"] * 3 + [f"*{dt}"] + (["*fp32", "*i32"] if split else [f"*{dt}"] * 2)
    values = dict(zip((p.name for p in fn.params), [*pointers, *plan.args]))
    values.update({k: v for k, v in plan.meta.items() if k != "num_warps"})
    cfg = plan.cfg
    return fn, values, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages), f"{cfg.block_m}, {cfg.block_n}"


def _dense(shape) -> tuple[int, ...]:
    return tuple(int(math.prod(shape[i + 1:])) for i in range(len(shape)))


def _softmax_launch(dt: str, kernel: str, warps: int | None):
    """(kernel, argument values, compile options, block) of one long-row softmax kernel for a
    contiguous (M, SOFTMAX_N) input, as softmax_online / softmax_split launch it (contraction off:
    `softmax.UNFUSED`)."""
    import importlib

    sm = importlib.import_module("flashcheck.kernels.softmax")
    n, ptr = SOFTMAX_N, f"*{dt}"
    by16 = dict(N=n // 16, sxm=n // 16, sym=n // 16, sxn=1, syn=1, MUL=16, X_BITS=False, Y_BITS=False)
    if kernel == "online":
        cfg = sm.online_config(n, _dtype(dt))
        fn, block, nw = sm._softmax_online_kernel, cfg.block, cfg.num_warps
        values = dict(by16, x_ptr=ptr, y_ptr=ptr, BLOCK=block, **sm.group_meta(block, cfg.group))
    else:
        cfg = sm.split_config(n, _dtype(dt))
        block, nw, nb = cfg.block, cfg.num_warps, cfg.n_blocks(n)
        common = dict(by16, x_ptr=ptr, NB=nb, BLOCK=block, ITERS=cfg.iters)
        if kernel == "split_stats":
            fn = sm._split_stats_kernel
            values = dict(common, ws="*fp32", **sm.group_meta(block, cfg.group))
        else:
            fn = sm._split_normalize_kernel
            values = dict(common, y_ptr=ptr, ws="*fp32", MB=cfg.merge_block, LOG2MB=cfg.merge_block.bit_length() - 1)
    return fn, values, dict(num_warps=warps or nw, num_stages=3, **sm.UNFUSED), str(block)


def _dtype(dt: str):
    import torch

    return getattr(torch, _TORCH_NAMES[dt])


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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for name in names:
        family, dt, *rest = CASES[name]
        fn, values, options, tile = (_attention_launch(dt, *rest) if family == "attention"
                                     else _softmax_launch(dt, *rest))
        warps, stages = options["num_warps"], options["num_stages"]
        kernel = triton.compile(ASTSource(fn, *_signature(fn, values)), target=GPUTarget("cuda", 90, 32), options=options)
        use = _usage(kernel.asm["cubin"])
        use["fma"] = len(re.findall(r"\bfma\.rn", kernel.asm["ptx"]))  # contractions, when the source has no tl.fma
        threads = 32 * warps
        smem = kernel.metadata.shared
        by_regs = REGS_PER_SM // (max(use["regs"], 1) * threads)
        by_smem = SMEM_PER_SM // smem if smem else by_regs
        rows.append({"case": name, "kernel": fn.__name__, "tile": tile, "warps": warps, "stages": stages, **use,
                     "shared": smem, "ctas_per_sm": min(by_regs, by_smem)})
    return rows


def to_markdown(rows: list[dict]) -> str:
    head = ("| case | kernel | tile | warps | stages | registers | spill stack (bytes) | shared (bytes) "
            "| CTAs per SM (est.) | warps per SM (est.) | fused multiply-adds (PTX) |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | `{r['kernel']}` | {r['tile']} | {r['warps']} | {r['stages']} | {r['regs']} | "
              f"{r['stack']} | {r['shared']} | {r['ctas_per_sm']} | {min(64, r['ctas_per_sm'] * r['warps'])} | {r['fma']} |"
              for r in rows]
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
        return offline_child(PROG, "flashcheck.reports.bench.kernel_resources", ["--cases", ",".join(names)])
    print(to_markdown(measure(names)), end="")
    return 0


def offline_child(prog: str, module: str, argv: list[str]) -> int:
    """Run `python -m module --child argv` with the interpreter off (Triton compiles for sm_90 on
    any machine; the interpreter is chosen once, at import, so it takes a fresh process): its
    stdout printed, and on failure one line naming stderr's last, 1."""
    done = subprocess.run([sys.executable, "-m", module, "--child", *argv], env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True)
    print(done.stdout, end="")
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"{prog}: compiling for sm_90 failed: {last}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
