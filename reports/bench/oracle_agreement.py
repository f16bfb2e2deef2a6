"""`python -m flashcheck.reports.bench.oracle_agreement --out reports/records/oracle_agreement.md`: the fast
softmax / log-sum-exp oracle against the mpmath oracle, bit for bit, on adversarial rows.

The default oracle decides in float64 under a proven error bound and sends undecided elements to
mpmath (NUMERICS.md section 3.1); `exact=True` runs mpmath on every element. This runs both on the
same deterministic rows (fixed seed) for fp16, bf16 and fp32, compares every output (NaN equals
NaN, zeros compared with their sign) and reports agreement, the fallback rate and the wall time of
each path. Every compared element is computed by both paths: nothing is sampled.

Row classes (`CLASSES`, shares of --elements; the long rows come on top):
ties (constant rows, k equal maxima), midpoint (rows selected from many candidates for the float64
softmax or lse landing nearest a rounding midpoint of the format), grid (consecutive grid values of
the format), huge (|x| near the largest finite), tiny (subnormal inputs, outputs near the
subnormals), ninf (-inf padding: whole rows, prefix blocks, suffixes), special (NaN / +inf in a
row), normal (random normal rows). long: one 2^L row of normal logits behind a -inf prefix block,
one near-uniform 2^L row. constant 2^H: one constant 2^H row (mpmath's exact 1/k case).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from flashcheck.oracles import (
    BF16,
    FP16,
    FP32,
    Format,
    logsumexp_oracle,
    round_float64,
    softmax_oracle,
)
from flashcheck.oracles import softmax as softmax_mod
from flashcheck.oracles import formats
from flashcheck.oracles.formats import ulp_of

INF, NAN = math.inf, math.nan
SIZES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64, 100, 128, 255, 256)
Rows = list[np.ndarray]

# ---- generation -------------------------------------------------------------------------------


def _fill(budget: int, make: Callable[[int], np.ndarray], rng: np.random.Generator) -> Rows:
    """Rows from make(n), n drawn from SIZES, until `budget` elements are reached."""
    rows, total = [], 0
    while total < budget:
        r = make(int(rng.choice(SIZES)))
        rows.append(r)
        total += r.size
    return rows


def _ties(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    mx = fmt.max_finite
    consts = [0.0, -7.25, 3.0, 1000.0, fmt.min_subnormal, -mx, mx]

    def make(n: int) -> np.ndarray:
        c = float(rng.choice(consts))
        kind = int(rng.integers(3))
        if kind == 0:  # all equal
            return np.full(n, c)
        k = int(rng.integers(1, n + 1))
        below = c - float(rng.choice([1.0, 0.5, 100.0, 2.0**-8, 2.0 ** (1 - fmt.precision)])) * max(abs(c), 1)
        v = np.full(n + k, -INF if kind == 1 else below)  # k maxima among -inf or lower values
        v[:k] = c
        return round_float64(rng.permutation(v), fmt)  # a lower value may overflow to -inf

    return make


def _midpoint_distance(y: np.ndarray, fmt: Format) -> np.ndarray:
    """|y - nearest midpoint of fmt| in units of fmt's spacing at y (0: on a midpoint)."""
    q = ulp_of(y, fmt)
    frac = np.abs(y) / q
    return np.abs(frac - np.floor(frac) - 0.5)


def _float64_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


_POOL = 64  # candidates per midpoint row kept


def _midpoint_rows(fmt: Format, rng: np.random.Generator, budget: int) -> Rows:
    """Candidates drawn in bulk, the closest 1/_POOL to a midpoint kept (float64 estimate).

    Two-entry rows [0, d] with d = log(1/mid - 1) rounded to fmt (y_0 = 1 / (1 + e^d) = mid before
    the rounding of d), [0, d] with d = log(expm1(mid)) for lse, and short rows from the grid."""
    rows: Rows = []
    per = budget // 3
    for what in ("softmax2", "lse2", "short"):
        n = 2 if what != "short" else int(rng.choice([3, 4, 8, 16]))
        m = max(1, per // n) * _POOL
        odd = 2 * rng.integers(0, 2 ** (fmt.precision - 1), m) + 1
        mid = 1.0 + odd * 2.0**-fmt.precision  # midpoints in [1, 2)
        if what == "softmax2":
            mid = mid * np.exp2(-rng.integers(1, 12, m).astype(np.float64))
            d = np.log(1.0 / mid - 1.0)
        elif what == "lse2":
            d = np.log(np.expm1(mid))
        if what == "short":
            x = rng.integers(-64, 64, (m, n)) * np.exp2(-rng.integers(0, 8, (m, 1)).astype(np.float64))
            x = round_float64(x, fmt)
        else:
            x = np.stack([np.zeros(m), round_float64(d, fmt)], axis=1)
        if what == "lse2":
            s = np.log1p(np.exp(x[:, 1]))
            score = _midpoint_distance(s, fmt)
        else:
            score = _midpoint_distance(_float64_softmax(x), fmt).min(axis=1)
        keep = np.argsort(score, kind="stable")[: m // _POOL]
        rows += list(x[keep])
    return rows


def _grid(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    def make(n: int) -> np.ndarray:
        base = round_float64(rng.standard_normal() * 4, fmt)
        q = float(ulp_of(np.array([base]), fmt)[0])
        return round_float64(base + q * rng.integers(-3, 4, n), fmt)  # a few grid steps apart

    return make


def _huge(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    mx = fmt.max_finite

    def make(n: int) -> np.ndarray:
        kind = int(rng.integers(3))
        if kind == 0:
            return round_float64(rng.uniform(-mx, mx, n), fmt)
        if kind == 1:
            return round_float64(mx - rng.integers(0, 50, n) * mx * 2.0**-fmt.precision, fmt)
        return round_float64(-mx + rng.integers(0, 50, n) * mx * 2.0**-fmt.precision, fmt)

    return make


def _tiny(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    lo_sub = -(fmt.precision - fmt.emin + 1) * math.log(2)  # outputs near the subnormals
    hi_sub = fmt.emin * math.log(2)

    def make(n: int) -> np.ndarray:
        kind = int(rng.integers(3))
        if kind == 0:
            v = rng.uniform(-1, 1, n) * fmt.min_normal  # subnormal inputs
        elif kind == 1:
            v = np.concatenate([[0.0], rng.integers(-4, 5, n) * fmt.min_subnormal])
        else:
            v = np.concatenate([[0.0], rng.uniform(lo_sub - 2, hi_sub + 2, n)])
        return round_float64(v, fmt)

    return make


def _ninf(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    def make(n: int) -> np.ndarray:
        kind = int(rng.integers(4))
        if kind == 0:
            return np.full(n, -INF)
        v = round_float64(rng.standard_normal(n + 16) * 4, fmt)
        cut = int(rng.integers(0, n + 16))
        if kind == 1:
            v[: 16 * (cut // 16) or cut] = -INF  # a prefix block (masked tiles)
        elif kind == 2:
            v[cut:] = -INF
        else:
            v[rng.random(n + 16) < 0.5] = -INF
        return v

    return make


def _special(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    def make(n: int) -> np.ndarray:
        v = round_float64(rng.standard_normal(n) * 3, fmt)
        v[rng.integers(n)] = rng.choice([NAN, INF])
        if rng.random() < 0.3:
            v[rng.random(n) < 0.5] = -INF
        return v

    return make


def _normal(fmt: Format, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    def make(n: int) -> np.ndarray:
        return round_float64(rng.standard_normal(n) * float(rng.choice([0.1, 1, 3, 10, 30, 200])), fmt)

    return make


CONSTANT = "constant 2^H"  # kept out of the totals: its elements are all one case

CLASSES = {  # name -> (share of --elements, row maker)
    "ties": (0.10, _ties),
    "midpoint": (0.25, None),
    "grid": (0.10, _grid),
    "huge": (0.10, _huge),
    "tiny": (0.10, _tiny),
    "ninf": (0.10, _ninf),
    "special": (0.05, _special),
    "normal": (0.20, _normal),
}


def generate(fmt: Format, elements: int, seed: int, long_log2: int, huge_log2: int) -> dict[str, Rows]:
    """The adversarial rows per class, values exact in fmt; deterministic in (fmt, seed)."""
    rng = np.random.default_rng([seed, fmt.precision, fmt.emax])
    out: dict[str, Rows] = {}
    for name, (share, maker) in CLASSES.items():
        budget = int(elements * share)
        out[name] = _midpoint_rows(fmt, rng, budget) if maker is None else _fill(budget, maker(fmt, rng), rng)
    n = 1 << long_log2
    v = round_float64(rng.standard_normal(n) * 3, fmt)
    v[: n // 64] = -INF
    near_uniform = round_float64(-1.0 - rng.integers(0, 2, n) * 2.0 ** (1 - fmt.precision), fmt)
    out["long"] = [v, near_uniform]
    out[CONSTANT] = [np.full(1 << huge_log2, -1.5)]
    return out


# ---- comparison ------------------------------------------------------------------------------


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise, the one contract (`oracles.formats.same_bits`) on float64 arrays."""
    return formats.same_bits(torch.from_numpy(np.asarray(a, np.float64)), torch.from_numpy(np.asarray(b, np.float64))).numpy()


@dataclass
class Tally:
    rows: int = 0
    elements: int = 0
    agree: int = 0  # softmax outputs equal bit for bit
    decided: int = 0  # softmax outputs the float64 path decided (special rows included)
    lse_agree: int = 0
    lse_decided: int = 0
    closeness: tuple[float, float] | None = None  # midpoint rows: median, least distance (ulps)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("fast", "mpmath", "lse_fast", "lse_mpmath"), 0.0))

    def add(self, other: Tally) -> None:
        for k in ("rows", "elements", "agree", "decided", "lse_agree", "lse_decided"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k, v in other.seconds.items():
            self.seconds[k] += v


def _timed(fn: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def compare_rows(x: np.ndarray, fmt: Format) -> Tally:
    """Both paths on rows of one length; counts agreement and the fast path's decided outputs."""
    t = Tally(rows=x.shape[0], elements=x.size)
    fast, t.seconds["fast"] = _timed(lambda: softmax_oracle(x, fmt))
    exact, t.seconds["mpmath"] = _timed(lambda: softmax_oracle(x, fmt, exact=True))
    lf, t.seconds["lse_fast"] = _timed(lambda: logsumexp_oracle(x, fmt))
    le, t.seconds["lse_mpmath"] = _timed(lambda: logsumexp_oracle(x, fmt, exact=True))
    t.agree, t.lse_agree = int(same_bits(fast, exact).sum()), int(same_bits(lf, le).sum())
    has_nan, has_pinf, all_ninf = softmax_mod._row_classes(x)
    normal = ~(has_nan | has_pinf | all_ninf)  # special rows never reach either path's arithmetic
    t.decided = x.size - int(normal.sum()) * x.shape[1]
    t.lse_decided = x.shape[0] - int(normal.sum())
    if normal.any():
        _, d = softmax_mod._softmax_fast(x[normal], fmt)
        _, dl = softmax_mod._logsumexp_fast(x[normal], fmt)
        t.decided += int(d.sum())
        t.lse_decided += int(dl.sum())
    return t


def compare_class(rows: Rows, fmt: Format) -> Tally:
    total = Tally()
    by_n: dict[int, Rows] = {}
    for r in rows:
        by_n.setdefault(r.shape[0], []).append(r)
    for group in by_n.values():
        total.add(compare_rows(np.stack(group), fmt))
    return total


def run(elements: int, seed: int, long_log2: int, huge_log2: int, fmts=(FP16, BF16, FP32), log=print) -> dict:
    """{fmt name: {class name: Tally}} over every class of `generate`."""
    out: dict = {}
    for fmt in fmts:
        out[fmt.name] = {}
        for name, rows in generate(fmt, elements, seed, long_log2, huge_log2).items():
            out[fmt.name][name] = t = compare_class(rows, fmt)
            if name == "midpoint":
                t.closeness = midpoint_closeness(rows, fmt)
            log(f"{fmt.name} {name}: {t.elements} elements, {t.elements - t.agree} softmax and "
                f"{t.rows - t.lse_agree} lse mismatches, {sum(t.seconds.values()):.1f} s")
    return out


def midpoint_closeness(rows: Rows, fmt: Format) -> tuple[float, float]:
    """Median and least, over rows, of the distance (in ulps of fmt, float64 estimate) from the
    row's output nearest a rounding midpoint (softmax or lse) to that midpoint."""
    best = []
    for r in rows:
        x = r[None]
        s = np.log(np.exp(x - x.max()).sum()) + x.max()
        best.append(min(_midpoint_distance(_float64_softmax(x), fmt).min(), _midpoint_distance(np.array([s]), fmt)[0]))
    return float(np.median(best)), float(np.min(best))


def mismatches(result: dict) -> int:
    return sum(t.elements - t.agree + t.rows - t.lse_agree for c in result.values() for t in c.values())


# ---- report ----------------------------------------------------------------------------------


def _pct(a: int, b: int) -> str:
    return f"{a} ({100 * a / b:.4f}%)" if b else "0"


WHAT = ("the fast softmax and log-sum-exp oracle (a float64 bound, mpmath where it cannot decide) against "
        "mpmath on every element of every adversarial class")
#: The oracles are the subject: no kernel of kernels/ runs, so no kernel change makes this stale.
NO_KERNEL = "none (runs no kernel: oracles/ against mpmath)"
PROG = "python -m flashcheck.reports.bench.oracle_agreement"


def render(result: dict, command: str, wall: float, long_log2: int, huge_log2: int) -> str:
    from flashcheck.reports.quality.records import header, short_commit

    lines = [
        *header("Fast oracle vs mpmath oracle, bit for bit", what=WHAT,
                device=f"{platform.processor() or platform.machine()}, {_cpu_name()}",
                date=_dt.date.today().isoformat(), commit=short_commit(), digest=NO_KERNEL, command=command),
        (f"{wall:.0f} s wall on a machine shared by other jobs (times are indicative). Generator and classes: "
        "`reports/bench/oracle_agreement.py`. Every element below was computed by both paths; nothing "
        f"is sampled. Long rows: 2^{long_log2} = {1 << long_log2:,} elements (normal logits behind a "
        f"-inf prefix block, and near-uniform), plus a constant 2^{huge_log2} = {1 << huge_log2:,}-element "
        "row (all equal: mpmath's exact 1/k case, which is why that length is affordable; a 64M row of "
        "distinct values would take mpmath about 15 min per format here)."),
        "",
        f"**Total mismatches: {mismatches(result)}.**",
        "",
        (f"Totals per dtype leave out the constant 2^{huge_log2} row (listed per class below), so "
        "that one row of a single case does not dilute the rates. "
        "Softmax: *decided* = outputs the float64 bound certified (rows with NaN/+inf or only -inf "
        "are special and decided without arithmetic); *fallback* = outputs sent to mpmath by the "
        "default oracle. Log-sum-exp has one output per row. Seconds: default (fast) oracle / "
        "`exact=True` (mpmath)."),
        "",
        *_HEADER,
    ]
    for fname, classes in result.items():
        t = Tally()
        for name, c in classes.items():
            if name != CONSTANT:
                t.add(c)
        lines.append(_row(fname, t))
    close = [f"{f} median {c['midpoint'].closeness[0]:.2e}, least {c['midpoint'].closeness[1]:.2e}"
             for f, c in result.items() if c.get("midpoint") and c["midpoint"].closeness]
    lines += [
        "",
        (f"Midpoint rows (candidates drawn in bulk, the 1/{_POOL} nearest a rounding midpoint kept): distance "
        "from each row's output nearest a midpoint to that midpoint, in ulps of the format, float64 "
        f"estimate (fp32 values below ~1e-8 are at the estimate's own resolution): {'; '.join(close)}. "
        "The fast path's interval is about 2^-50 relative wide, so only outputs within about "
        "2^(p-50) ulps of a midpoint fall back (fp16 2^-39, bf16 2^-42, fp32 2^-26, p the format's "
        "precision): hence a fallback rate near 0 outside fp32."),
        "",
        "Per class:",
        "",
        *_HEADER,
    ]
    for fname, classes in result.items():
        for cname, t in classes.items():
            lines.append(_row(f"{fname} {cname.replace('2^H', f'2^{huge_log2}')}", t))
    return "\n".join(lines) + "\n"


_HEADER = (
    ("| dtype | rows | elements | agreeing | mismatches | decided (fast) | fallback (rate) | "
    "lse agreeing / rows | lse fallback | softmax s fast / mpmath | lse s fast / mpmath |"),
    "|---|---|---|---|---|---|---|---|---|---|---|",
)


def _row(name: str, t: Tally) -> str:
    s = t.seconds
    return (
        f"| {name} | {t.rows:,} | {t.elements:,} | {t.agree:,} | {t.elements - t.agree + t.rows - t.lse_agree} | "
        f"{t.decided:,} | {_pct(t.elements - t.decided, t.elements)} | {t.lse_agree:,} / {t.rows:,} | "
        f"{_pct(t.rows - t.lse_decided, t.rows)} | {s['fast']:.1f} / {s['mpmath']:.1f} | "
        f"{s['lse_fast']:.1f} / {s['lse_mpmath']:.1f} |"
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        return f"{names[0]} x {len(names)} cores"
    except (OSError, IndexError):
        return "CPU unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="Markdown report path (default: print)")
    ap.add_argument("--elements", type=int, default=1_000_000, help="elements per dtype, long rows excluded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long-log2", type=int, default=20, help="length of the long rows, log2")
    ap.add_argument("--huge-log2", type=int, default=26, help="length of the constant row, log2 (26: about 11 GB peak memory, 5 min in all on 2 cores)")
    args = ap.parse_args(argv)
    if args.elements < 100 or not (1 <= args.long_log2 <= 24) or not (1 <= args.huge_log2 <= 27):
        ap.error("--elements must be >= 100, --long-log2 in 1..24, --huge-log2 in 1..27")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out {args.out}: no such folder")
    t0 = time.perf_counter()
    result = run(args.elements, args.seed, args.long_log2, args.huge_log2)
    cmd = PROG + " " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    text = render(result, cmd.strip(), time.perf_counter() - t0, args.long_log2, args.huge_log2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 1 if mismatches(result) else 0


if __name__ == "__main__":
    raise SystemExit(main())
