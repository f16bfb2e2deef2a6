"""`python -m flashcheck.reports.bench.oracle`: certified softmax oracle throughput, elements per second.

Rows of N = 16, 256 and 4096 logits (standard normal times 3, rounded to the format: typical
attention logits), for fp16, bf16 and fp32 outputs, through the default path (float64 with a
proven bound, undecided elements sent to mpmath) and the pure mpmath path (fewer rows). One core:
the oracle is single-threaded NumPy / Python. "fallback rows" counts rows of the default path
with at least one element the float64 bound could not decide.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from flashcheck.oracles import BF16, FP16, FP32, Format, round_float64, softmax_oracle
from flashcheck.oracles import softmax as softmax_mod

SIZES = (16, 256, 4096)


def _rows(fmt: Format, m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    return round_float64(rng.standard_normal((m, n)) * 3.0, fmt)


def _rate(x: np.ndarray, fmt: Format, *, exact: bool, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        softmax_oracle(x, fmt, exact=exact)
        best = min(best, time.perf_counter() - t0)
    return x.size / best


def _fallback_rows(x: np.ndarray, fmt: Format) -> int:
    _, decided = softmax_mod._softmax_fast(x, fmt)
    return int((~decided.all(axis=1)).sum())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flashcheck.reports.bench.oracle", description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 20, help="elements per default-path run")
    ap.add_argument("--exact-elements", type=int, default=1 << 14, help="elements per mpmath run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    print("| format | N | path | rows | elements/s | fallback rows |")
    print("|---|---|---|---|---|---|")
    for fmt in (FP16, BF16, FP32):
        for n in SIZES:
            x = _rows(fmt, max(1, args.elements // n), n, rng)
            softmax_oracle(x[:2], fmt)  # warm-up
            rate = _rate(x, fmt, exact=False, repeats=3)
            fallback = _fallback_rows(x, fmt)
            row = f"| {fmt.name} | {n} | default | {x.shape[0]} | {rate:,.0f} | {fallback} |"
            print(row, flush=True)
            xe = x[: max(1, args.exact_elements // n)]
            rate = _rate(xe, fmt, exact=True, repeats=1)
            print(f"| {fmt.name} | {n} | mpmath | {xe.shape[0]} | {rate:,.0f} | - |", flush=True)


if __name__ == "__main__":
    main()
