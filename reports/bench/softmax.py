"""Softmax throughput on the GPU: `python -m flashcheck.reports.bench.softmax [--tune | --tune-only] [--quick]`.

For fp16, bf16 and fp32 and each shape below: GB/s (one read of x plus one write of y counted)
of every variant the dispatcher may pick at that shape, of the dispatcher, of `torch.softmax`,
and of the device-to-device copy ceiling (`y.copy_(x)` into a preallocated tensor of the same
size), all measured in the same run with `triton.testing.do_bench` (warm-up, L2 flushed before
each call, median), the dispatcher again as a replayed CUDA graph (the GPU alone) and the
host's time per dispatcher call. Prints a Markdown table and writes it to reports/records/softmax_bench.md (and JSON
under $OUT when that is set). `--tune` adds a sweep of launch parameters for the chunked
variants (for choosing the defaults; the chunk sizes change the bits, num_warps does not), each
row with the copy's GB/s of the same bytes and the SM count; `--tune-only` runs the sweep alone.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from flashcheck import kernels  # noqa: F401  (first: the interpreter switch)
from flashcheck.kernels import INTERPRET
from flashcheck.kernels.softmax import (
    choose_variant, online_config, row_max_n, sm_count, softmax, softmax_online, softmax_row, softmax_split,
    split_config,
)

from triton.testing import do_bench

from flashcheck.reports import RECORDS

from .common import run_info, write_sections

PROG = "python -m flashcheck.reports.bench.softmax"
#: softmax_bench.md's header (attention.write_sections): its main table and its accuracy section.
HEAD = ("Softmax throughput and accuracy of the long rows",
        "softmax throughput of each kernel and the dispatcher against torch.softmax and a copy, and the long "
        "rows' accuracy against float64", f"{PROG} && python -m flashcheck.reports.bench.softmax_accuracy")
from .launch import graph_of, host_us

SHAPES = [(65536, 1024), (16384, 4096), (4096, 16384), (2048, 32768), (1024, 65536), (256, 262144), (64, 1048576),
          (1, 67108864)]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
VARIANTS = {"row": softmax_row, "online": softmax_online, "split": softmax_split}


def gbps(ms: float, nbytes: int) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def bench(fn, *, rep: int = 100) -> float:
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def candidates(m: int, n: int, dtype: torch.dtype) -> list[str]:
    """Variants worth timing at (m, n): every one the dispatcher could sensibly pick."""
    out = ["row"] if n <= row_max_n(dtype) else []
    if n > 4096:
        out += ["online", "split"]
    return out


def check_close(name: str, y: torch.Tensor, ref: torch.Tensor) -> str:
    err = (y.float() - ref.float()).abs().max().item()
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[y.dtype]
    return "" if err <= tol else f" (max |diff| vs torch {err:.3g}!)"


def run_main(shapes, dtypes, *, rep: int) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    sms = sm_count(torch.device("cuda"))
    for dname in dtypes:
        dtype = DTYPES[dname]
        for m, n in shapes:
            torch.manual_seed(0)
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 4
            y = torch.empty_like(x)
            nbytes = 2 * x.numel() * x.element_size()
            rec = {"dtype": dname, "M": m, "N": n, "dispatch": choose_variant(m, n, dtype, sms)}
            rec["copy"] = gbps(bench(lambda: y.copy_(x), rep=rep), nbytes)
            ref = torch.softmax(x, -1)
            rec["torch"] = gbps(bench(lambda: torch.softmax(x, -1), rep=rep), nbytes)
            for v in candidates(m, n, dtype):
                f = VARIANTS[v]
                warn = check_close(v, f(x, out=y), ref)
                if warn:
                    notes.append(f"{dname} {m}x{n} {v}{warn}")
                rec[v] = gbps(bench(lambda: f(x, out=y), rep=rep), nbytes)
            def disp() -> torch.Tensor:  # the dispatcher's call, the same for all three timings
                return softmax(x, out=y)

            warn = check_close("softmax", disp(), ref)
            if warn:
                notes.append(f"{dname} {m}x{n} dispatcher{warn}")
            rec["softmax"] = gbps(bench(disp, rep=rep), nbytes)
            g = graph_of(disp)
            rec["graph"] = gbps(bench(g.replay, rep=rep), nbytes)
            rec["host_us"] = host_us(disp, calls=30, warmup=1)  # 30 calls: long rows stay within the launch queue
            del g
            rows.append(rec)
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in rec.items()}),
                  flush=True)
            del x, y, ref
            torch.cuda.empty_cache()
    return rows, notes


def run_tune(rep: int) -> list[dict]:
    """Sweep the chunked variants' launch parameters at the shapes they serve."""
    out = []
    sweeps = {
        "online": [dict(block_n=b, num_warps=w) for b, w in
                   ((1024, 2), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (4096, 16), (8192, 8))],
        # The spans in chunks other than powers of two set the CTA count of both passes between
        # the default's (8 chunks: 2048 CTAs a 2^26 row) and 16's, to look for whole waves. On an
        # H200 they showed no trend with waves; 16 warps, not the span, lifted fp32
        # (reports/records/softmax_bench.md, "Why 16 warps").
        "split": [dict(block_n=b, chunks_per_block=c, num_warps=w) for b, c, w in
                  ((1024, 32, 2), (2048, 16, 4), (2048, 32, 4), (4096, 16, 8), (4096, 8, 4), (4096, 8, 8),
                   (4096, 8, 16), (4096, 16, 16), (4096, 5, 8), (4096, 6, 8), (4096, 7, 8), (4096, 10, 8),
                   (4096, 12, 8), (4096, 13, 8))],
    }
    shapes = {"online": [(1024, 65536), (256, 262144)],
              "split": [(256, 262144), (64, 1048576), (1, 67108864)]}
    for dname in ("fp16", "fp32"):
        dtype = DTYPES[dname]
        for variant, cfgs in sweeps.items():
            f = VARIANTS[variant]
            for m, n in shapes[variant]:
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                y = torch.empty_like(x)
                nbytes = 2 * x.numel() * x.element_size()
                res = {"dtype": dname, "variant": variant, "M": m, "N": n, "SMs": sm_count(x.device),
                       "copy": round(gbps(bench(lambda: y.copy_(x), rep=rep), nbytes), 1)}
                if variant == "online" and n <= row_max_n(dtype):
                    res["row"] = round(gbps(bench(lambda: softmax_row(x, out=y), rep=rep), nbytes), 1)
                for cfg in cfgs:
                    key = ",".join(f"{k}={v}" for k, v in cfg.items())
                    try:
                        res[key] = round(gbps(bench(lambda: f(x, out=y, **cfg), rep=rep), nbytes), 1)
                    except Exception as e:  # a config the hardware rejects (registers, smem)
                        res[key] = f"error: {type(e).__name__}"
                print("TUNE", json.dumps(res), flush=True)
                out.append(res)
                del x, y
    return out


def markdown(rows: list[dict], notes: list[str]) -> str:
    lines = [
        "## Softmax throughput",
        "",
        f"{run_info(PROG)}. "
        "GB/s count one read of x and one write of y; `triton.testing.do_bench` median, L2 flushed "
        "before each call; copy = `y.copy_(x)` of the same bytes, measured in the same run. "
        "`graph`: the dispatcher's call captured in a CUDA graph and replayed (the GPU's time without "
        "Python's launch cost); `host us`: the host's microseconds per dispatcher call, calls queued back "
        "to back. Where `host us` nears the GPU's time per call, the eager columns time the host.",
        "",
        "| dtype | M x N | dispatch | row | online | split | dispatcher | torch | copy "
        "| disp/copy | disp/torch | graph | graph/copy | host us |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        def cell(k: str) -> str:
            return f"{r[k]:.0f}" if k in r else "-"
        lines.append(
            f"| {r['dtype']} | {r['M']}x{r['N']} | {r['dispatch']} | {cell('row')} | {cell('online')} "
            f"| {cell('split')} | {cell('softmax')} | {cell('torch')} | {cell('copy')} "
            f"| {r['softmax'] / r['copy']:.2f} | {r['softmax'] / r['torch']:.2f} | {cell('graph')} "
            f"| {r['graph'] / r['copy']:.2f} | {cell('host_us')} |")
    lines += ["", "Targets: dispatcher >= 0.90 x copy where the row fits on one SM; >= 1.2 x torch "
              "everywhere; 1x67108864 >= 0.85 x (2/3 x copy) = 0.57 x copy (three passes)."]
    if notes:
        lines += ["", "Disagreements with torch.softmax (max |diff|; which side is right: the accuracy "
                  "section, `softmax_accuracy.py`):", *[f"- {s}" for s in notes]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true", help="also sweep the chunked variants' parameters")
    ap.add_argument("--tune-only", action="store_true", help="only the sweep: no table, nothing written but $OUT's JSON")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--out", default=str(RECORDS / "softmax_bench.md"))
    args = ap.parse_args(argv)
    if INTERPRET:
        print("bench.softmax needs a GPU (the interpreter would take hours)", file=sys.stderr)
        return 2
    rep = 40 if args.quick else 100
    tune = run_tune(rep) if args.tune or args.tune_only else []
    if args.tune_only:
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "softmax_tune.json").write_text(json.dumps(tune))
        return 0
    rows, notes = run_main(SHAPES, list(DTYPES), rep=rep)
    md = markdown(rows, notes)
    write_sections(Path(args.out), {"main": md}, HEAD)  # the accuracy section (softmax_accuracy.py) stays
    print(md)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "softmax_bench.json").write_text(json.dumps({"rows": rows, "tune": tune}))
        Path(os.environ["OUT"], "softmax_bench.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
