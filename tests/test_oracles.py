"""The oracles themselves: softmax / log-sum-exp values, fast path vs mpmath, the agreement
harness (the rounding layer and the ULP metric: test_rounding.py).

No kernel is involved. Everything is deterministic (fixed NumPy seeds)."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from mpmath import libmp

import flashcheck.oracles.softmax as softmax_mod
from flashcheck.oracles import (
    BF16,
    FP16,
    FP32,
    Format,
    logsumexp_oracle,
    round_float64,
    round_fraction,
    round_mpf,
    softmax_oracle,
    ulp_distance,
    ulp_of,
)

FMTS = [FP16, BF16, FP32]
IDS = [f.name for f in FMTS]
INF, NAN = math.inf, math.nan
MPF = mpmath.mp.make_mpf  # wraps an exact raw tuple, no rounding to mp.prec


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, NaN where NaN, and the same sign on zeros."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(
        np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))
    )


# ---- softmax / log-sum-exp values --------------------------------------------------------------


@pytest.mark.parametrize("exact", [False, True])
def test_textbook_row(exact: bool) -> None:
    # softmax([6, 7, 8, 3]) = 0.0896288, 0.2436364, 0.6622724, 0.0044624 (to 7 places)
    x = np.array([[6.0, 7.0, 8.0, 3.0]])
    y = softmax_oracle(x, FP32, exact=exact)[0]
    assert np.round(y, 4).tolist() == [0.0896, 0.2436, 0.6623, 0.0045]
    assert abs(y.sum() - 1) < 1e-6
    for fmt in (FP16, BF16):  # within half an ulp of the exact values
        y = softmax_oracle(x, fmt, exact=exact)[0]
        exact_y = np.array([0.0896288, 0.2436364, 0.6622724, 0.0044624])
        assert (np.abs(y - exact_y) <= 0.5 * ulp_of(exact_y, fmt) + 1e-7).all()
    lse = logsumexp_oracle(np.array([6.0, 7.0, 8.0, 3.0]), FP32, exact=exact)
    assert round(float(lse), 5) == 8.41208


def _float64_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_agrees_with_float64_on_benign_rows(fmt: Format) -> None:
    rng = np.random.default_rng(11)
    for n in (2, 7, 64, 1000):
        x = round_float64(rng.standard_normal((40, n)) * 2, fmt)
        y = softmax_oracle(x, fmt)
        ref = round_float64(_float64_softmax(x), fmt)
        assert ulp_distance(y, ref, fmt).max() <= 1
        lse = logsumexp_oracle(x, fmt)
        m = x.max(axis=1)
        ref_l = round_float64(m + np.log(np.exp(x - m[:, None]).sum(axis=1)), fmt)
        assert ulp_distance(lse, ref_l, fmt).max() <= 1


def test_special_values_table() -> None:
    rows = np.array(
        [
            [1.0, -INF, 2.0, -INF],  # -inf entries exactly 0
            [-INF, -INF, -INF, -INF],  # all -inf: NaN (torch)
            [1.0, NAN, 2.0, 3.0],  # any NaN: NaN
            [1.0, INF, 2.0, 3.0],  # any +inf: NaN
            [INF, -INF, NAN, 0.0],  # mixed
            [INF, INF, -INF, -INF],
            [-INF, -INF, 5.0, -INF],  # a single finite entry: exactly 1
        ]
    )
    for fmt in FMTS:
        for exact in (False, True):
            y = softmax_oracle(rows, fmt, exact=exact)
            assert y[0, 1] == 0 and y[0, 3] == 0 and not np.signbit(y[0, 1])
            assert np.allclose(y[0, [0, 2]], [1 / (1 + math.e), math.e / (1 + math.e)], rtol=1e-2)
            assert np.isnan(y[1:6]).all()
            assert y[6].tolist() == [0.0, 0.0, 1.0, 0.0]
            assert softmax_oracle(np.array([[3.5]]), fmt, exact=exact).tolist() == [[1.0]]
            lowest = np.array([[-fmt.max_finite]])
            assert softmax_oracle(lowest, fmt, exact=exact).tolist() == [[1.0]]
            assert np.isnan(softmax_oracle(np.array([[-INF]]), fmt, exact=exact)).all()
            lse = logsumexp_oracle(rows, fmt, exact=exact)
            assert np.isclose(lse[0], 2 + math.log1p(math.exp(-1)), rtol=1e-2)
            assert lse[1] == -INF
            assert np.isnan(lse[2]) and np.isnan(lse[4])  # NaN wins over +inf
            assert lse[3] == INF and lse[5] == INF
            assert lse[6] == 5.0
            # torch agrees on every special case
            t = torch.logsumexp(torch.from_numpy(rows), dim=1).numpy()
            special = ~np.isfinite(t)
            assert same_bits(lse[special], t[special])
            t_nan = torch.softmax(torch.from_numpy(rows), dim=1).isnan().numpy()
            assert same_bits(np.isnan(y), t_nan)
    # empty rows and other shapes
    assert softmax_oracle(np.zeros((3, 0)), FP32).shape == (3, 0)
    assert logsumexp_oracle(np.zeros((3, 0)), FP32).tolist() == [-INF] * 3
    x3 = np.arange(24.0).reshape(2, 3, 4) / 4
    assert softmax_oracle(x3, FP32).shape == (2, 3, 4)
    assert logsumexp_oracle(x3, FP32).shape == (2, 3)
    assert same_bits(softmax_oracle(torch.from_numpy(x3).half(), FP16), softmax_oracle(x3, "fp16"))


def test_exact_results_are_exact() -> None:
    for fmt in FMTS:
        for k in (1, 2, 3, 4, 7, 64, 1024, 4096):
            for c in (0.0, -3.5, 1000.0, fmt.max_finite, -fmt.max_finite):
                row = np.full((1, k + 5), -INF)
                row[0, 3 : 3 + k] = c
                for exact in (False, True):
                    y = softmax_oracle(row, fmt, exact=exact)[0]
                    assert y[3] == round_fraction(Fraction(1, k), fmt)
                    assert y[:3].tolist() == [0.0] * 3 and y[-2:].tolist() == [0.0] * 2
        long = np.zeros((1, 4096))
        assert (softmax_oracle(long, fmt) == 2.0**-12).all()


def test_huge_differences_are_fast_and_zero() -> None:
    import time

    x = np.array([[FP32.max_finite, -FP32.max_finite, 0.0, FP32.max_finite - 2.0**104]])
    t0 = time.perf_counter()
    for exact in (False, True):
        y = softmax_oracle(x, FP32, exact=exact)[0]
        assert y.tolist() == [1.0, 0.0, 0.0, 0.0]
        lse = logsumexp_oracle(np.array([[0.0, -FP32.max_finite], [1.0, -3e38]]), FP32, exact=exact)
        assert lse.tolist() == [0.0, 1.0] and not np.signbit(lse[0])
    assert time.perf_counter() - t0 < 2.0


def test_mpmath_precision_left_alone() -> None:
    saved = mpmath.mp.prec
    x = round_float64(np.random.default_rng(3).standard_normal((4, 9)) * 5, FP32)
    ref = softmax_oracle(x, FP32, exact=True)
    ref_l = logsumexp_oracle(x, FP32, exact=True)
    try:
        for prec in (7, 53, 500):
            mpmath.mp.prec = prec  # a caller's odd setting must neither leak in nor be changed
            assert same_bits(softmax_oracle(x, FP32, exact=True), ref)
            assert same_bits(logsumexp_oracle(x, FP32, exact=True), ref_l)
            assert mpmath.mp.prec == prec
    finally:
        mpmath.mp.prec = saved
    assert mpmath.mp.prec == saved


# ---- fast path vs mpmath, adversarial rows --------------------------------------------------


def _adversarial_rows(fmt: Format, seed: int) -> dict[int, list[np.ndarray]]:
    """Rows of the NUMERICS.md section 4 classes, grouped by length; values exact in fmt."""
    rng = np.random.default_rng(seed)
    mx = fmt.max_finite
    lo_sub = -(fmt.precision - fmt.emin + 1) * math.log(2)  # outputs near fp subnormals
    hi_sub = fmt.emin * math.log(2)
    rows: list[np.ndarray] = []

    def add(v: np.ndarray) -> None:
        rows.append(round_float64(np.asarray(v, np.float64), fmt))

    sizes = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 33, 64]
    for _ in range(120):
        n = int(rng.choice(sizes))
        for scale in (0.1, 1.0, 3.0, 10.0, 30.0, 200.0):
            add(rng.standard_normal(n) * scale)
        add(rng.uniform(-mx, mx, n))  # huge magnitudes
        add(mx - rng.integers(0, 50, n) * mx * 2.0**-fmt.precision)  # near the max
        add(rng.choice([1000.0, 1001.0, 1002.5], n))  # no max subtraction overflows
        # very negative (fp16 cannot go below -65504)
        add(-1e4 - rng.uniform(0, 5e4, n) if fmt == FP16 else -1e5 - rng.uniform(0, 1e7, n))
        add(np.concatenate([[0.0], rng.uniform(lo_sub - 2, hi_sub + 2, n)]))  # subnormal outputs
        add(rng.uniform(-1, 1, n) * fmt.min_normal)  # subnormal inputs
        add(np.concatenate([[0.0, 0.0], rng.uniform(-1, 1, n) * fmt.min_subnormal * 4]))
        peaked = rng.standard_normal(n) * 0.1
        peaked[rng.integers(n)] = 20.0
        add(peaked)
        # -inf padding: prefix, suffix, interior
        v = rng.standard_normal(n + 6) * 4
        cut = rng.integers(0, n + 6, 2)
        v[: cut.min()] = -INF
        add(v.copy())
        v = rng.standard_normal(n + 6) * 4
        v[cut.max() :] = -INF
        add(v)
        v = -90 - rng.uniform(0, 10, n + 6)  # leading masked block, then logits below -90
        v[: (n + 6) // 2] = -INF
        add(v)
        add(np.full(n, -INF))  # fully masked
        v = rng.standard_normal(n) * 3
        v[rng.integers(n)] = rng.choice([NAN, INF])
        add(v)
        v = np.full(n + 1, -INF)
        v[rng.integers(n + 1)] = rng.choice([NAN, INF])
        add(v)
        # ties and constant rows, with and without -inf
        k = int(rng.choice([1, 2, 3, 4, 8, 5]))
        c = float(rng.choice([0.0, -7.25, 3.0, 1000.0, -mx, mx]))
        v = np.full(k + int(rng.integers(0, 4)), -INF)
        v[:k] = c
        add(rng.permutation(v))
        v = np.full(n + k, c - rng.choice([1.0, 0.5, 100.0, 2.0**-8]))
        v[:k] = c
        add(rng.permutation(v))
        add(np.arange(n, dtype=np.float64) * rng.choice([0.25, 1.0, 7.0]))  # increasing
    # a few long rows (the mpmath reference of a 4096-entry row takes a while)
    for n in (2048, 4096):
        add(np.zeros(n))
        add(rng.standard_normal(n) * 2)
        v = rng.standard_normal(n) * 3
        v[: n // 2] = -INF
        add(v)
        add(np.full(n, -1.0) - rng.integers(0, 2, n) * 2.0**-7)  # near uniform
    by_n: dict[int, list[np.ndarray]] = {}
    for r in rows:
        by_n.setdefault(r.shape[0], []).append(r)
    return by_n


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_fast_path_matches_mpmath_bit_for_bit(fmt: Format) -> None:
    total = 0
    for n, group in _adversarial_rows(fmt, seed=100 + fmt.precision).items():
        x = np.stack(group)
        total += x.shape[0]
        fast, exact = softmax_oracle(x, fmt), softmax_oracle(x, fmt, exact=True)
        bad = np.flatnonzero(~np.array([same_bits(a, b) for a, b in zip(fast, exact)]))
        assert bad.size == 0, (n, x[bad[0]].tolist(), fast[bad[0]].tolist(), exact[bad[0]].tolist())
        finite = np.isfinite(exact)
        assert (exact[finite] >= 0).all() and (exact[finite] <= 1).all()
        assert same_bits(round_float64(exact, fmt), exact)  # representable
        lf, le = logsumexp_oracle(x, fmt), logsumexp_oracle(x, fmt, exact=True)
        bad = [r.tolist() for r, a, b in zip(x, lf, le) if not same_bits(a, b)]
        assert not bad, (n, bad[:1])
    assert total > 2000


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_fallback_merges_correctly(fmt: Format, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately pessimistic exp bound leaves most elements undecided, so most of each row
    comes from the mpmath path: the merged result must still equal the mpmath one."""
    rng = np.random.default_rng(7)
    x = round_float64(rng.standard_normal((30, 12)) * 4, fmt)
    x[::5, :3] = -INF
    x[3] = 0.0
    exact = softmax_oracle(x, fmt, exact=True)
    exact_l = logsumexp_oracle(x, fmt, exact=True)
    _, decided = softmax_mod._softmax_fast(x, fmt)
    assert decided.all(axis=1).mean() > 0.5
    monkeypatch.setattr(softmax_mod, "FUNC_REL", 2.0 ** -(fmt.precision + 1))
    _, decided = softmax_mod._softmax_fast(x, fmt)
    assert (~decided).sum() > x.size // 4
    assert same_bits(softmax_oracle(x, fmt), exact)
    assert same_bits(logsumexp_oracle(x, fmt), exact_l)


def test_numpy_exp_and_log1p_within_assumed_bound() -> None:
    """The fast path assumes np.exp / np.log1p within 4 ulp (FUNC_REL = 2^-50 relative)."""
    rng = np.random.default_rng(9)
    d = -np.concatenate(
        [rng.uniform(0, 708, 3000), rng.exponential(1.0, 2000), np.exp2(-rng.uniform(0, 60, 1000))]
    )
    t = np.exp2(rng.uniform(-60, 13, 4000))
    worst = 0.0
    with mpmath.workprec(120):
        for fn, ref, args in ((np.exp, mpmath.exp, d), (np.log1p, mpmath.log1p, t)):
            got = fn(args)
            for a, g in zip(args.tolist(), got.tolist()):
                exact = ref(mpmath.mpf(a))
                worst = max(worst, float(abs(mpmath.mpf(g) - exact) / abs(exact)))
    assert worst <= softmax_mod.FUNC_REL / 2, worst  # half the assumed bound, measured


def test_mpmath_exp_and_log_within_assumed_bound() -> None:
    """The mpmath path assumes libmp's exp / log within 4 eta (2 ulp) at precision p, eta = 2^-p."""
    rng = np.random.default_rng(10)
    args = np.concatenate([-rng.uniform(0, 700, 600), -np.exp2(-rng.uniform(0, 200, 300))])
    for prec in (64, 77, 128):
        worst = 0.0
        for a in args.tolist():
            x = libmp.from_float(a)
            near_one = libmp.mpf_add(libmp.fone, libmp.mpf_exp(x, 80, "n"), 0)
            for fn, arg in ((libmp.mpf_exp, x), (libmp.mpf_log, near_one)):
                got, ref = fn(arg, prec, "n"), fn(arg, prec + 200, "n")
                err = MPF(libmp.mpf_sub(got, ref, prec + 300)) / MPF(ref)
                worst = max(worst, abs(float(err)) * 2.0**prec)
        assert worst <= 2.0, (prec, worst)  # half the assumed 4 eta


def _naive(row: np.ndarray, fmt: Format) -> tuple[list[float], float]:
    """Softmax and log-sum-exp of one finite-max row at 400 bits, rounded once: an independent
    reference (wrong only if the exact value were within 2^-390 of a rounding boundary)."""
    with mpmath.workprec(400):
        m = mpmath.mpf(float(row.max()))
        e = [mpmath.exp(mpmath.mpf(float(v)) - m) if np.isfinite(v) else mpmath.mpf(0) for v in row]
        s = mpmath.fsum(e)
        return [round_mpf(t / s, fmt) for t in e], round_mpf(m + mpmath.log(s), fmt)


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_mpmath_path_matches_a_naive_400_bit_reference(fmt: Format) -> None:
    rng = np.random.default_rng(21)
    sizes = rng.integers(1, 40, 75)
    rows = [rng.standard_normal(int(n)) * s for n, s in zip(sizes, np.repeat([0.5, 5.0, 40.0], 25))]
    for lo, hi in ((-110, -80), (-20, -8)):  # outputs near the subnormals of fp32/bf16, fp16
        rows += [np.concatenate([[0.0], rng.uniform(lo, hi, 5)]) for _ in range(10)]
    rows = [round_float64(r, fmt) for r in rows]
    for row in rows:
        y_ref, l_ref = _naive(row, fmt)
        y = softmax_oracle(row[None], fmt, exact=True)[0]
        lse = logsumexp_oracle(row[None], fmt, exact=True)
        assert same_bits(y, np.array(y_ref)) and same_bits(lse, np.array([l_ref])), row.tolist()


def _random_midpoint_in_1_2(fmt: Format, rng: np.random.Generator) -> float:
    odd = 2 * int(rng.integers(0, 2 ** (fmt.precision - 1))) + 1
    return 1.0 + odd * 2.0**-fmt.precision


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_near_midpoints_fall_back_and_decide(fmt: Format) -> None:
    """float64 inputs (the oracle takes any dyadic value) put results within ~2^-53 of a midpoint
    of fmt: too close for the float64 bound, so the mpmath path decides them."""
    rng = np.random.default_rng(33)
    rows, lse_rows = [], []
    with mpmath.workprec(200):
        for _ in range(12):
            # y_0 = 1 / (1 + e^d) = mid  <=>  d = log(1/mid - 1)
            mid = 2.0 ** -int(rng.integers(1, 8)) * _random_midpoint_in_1_2(fmt, rng)
            rows.append([0.0, float(mpmath.log(1 / mpmath.mpf(mid) - 1))])
            # lse = log1p(e^d) = mid2 (a midpoint in [1, 2))  <=>  d = log(expm1(mid2))
            mid2 = _random_midpoint_in_1_2(fmt, rng)
            lse_rows.append([0.0, float(mpmath.log(mpmath.expm1(mpmath.mpf(mid2))))])
    x, xl = np.array(rows), np.array(lse_rows)
    _, decided = softmax_mod._softmax_fast(x, fmt)
    _, decided_l = softmax_mod._logsumexp_fast(xl, fmt)
    assert not decided.all(axis=1).any() and not decided_l.any()  # every row falls back
    y, lse = softmax_oracle(x, fmt), logsumexp_oracle(xl, fmt)
    assert same_bits(y, softmax_oracle(x, fmt, exact=True))
    assert same_bits(lse, logsumexp_oracle(xl, fmt, exact=True))
    for row, got in zip(x, y):
        assert same_bits(got, np.array(_naive(row, fmt)[0]))
    for row, got in zip(xl, lse):
        assert got == _naive(row, fmt)[1]


# ---- the agreement harness (reports/bench/oracle_agreement.py, the committed 10^6-element run) -------


def test_agreement_harness_small_run_has_no_mismatch() -> None:
    """The generator of reports/records/oracle_agreement.md at CI size: every class, 0 mismatches."""
    from flashcheck.reports.bench import oracle_agreement as agreement

    result = agreement.run(3000, seed=1, long_log2=12, huge_log2=14, log=lambda _: None)
    for classes in result.values():
        assert set(classes) == set(agreement.CLASSES) | {"long", agreement.CONSTANT}
        assert all(t.elements > 0 for t in classes.values())
        assert sum(t.elements for t in classes.values()) >= 3000 + 3 * 2**12
    assert agreement.mismatches(result) == 0


def test_agreement_harness_catches_a_wrong_fast_path(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A deliberately wrong fast path: exp of every non-max entry 2^-13 (relative) too large while
    the float64 error bound still claims ~2^-50, so the fast path certifies wrong roundings. The
    harness must count mismatches in every format and for both functions, and exit 1."""
    from flashcheck.reports.bench import oracle_agreement as agreement

    real = softmax_mod._exp_terms

    def wrong(x: np.ndarray, m: np.ndarray):
        e, r, tiny = real(x, m)
        return np.where(x == m[:, None], e, e * (1 + 2.0**-13)), r, tiny

    monkeypatch.setattr(softmax_mod, "_exp_terms", wrong)
    result = agreement.run(1000, seed=2, long_log2=8, huge_log2=8, log=lambda _: None)
    for classes in result.values():
        assert sum(t.elements - t.agree for t in classes.values()) > 0
        assert sum(t.rows - t.lse_agree for t in classes.values()) > 0
    out = tmp_path / "agreement.md"
    argv = ["--out", str(out), "--elements", "1000", "--seed", "2", "--long-log2", "8", "--huge-log2", "8"]
    assert agreement.main(argv) == 1
    assert f"**Total mismatches: {agreement.mismatches(result)}.**" in out.read_text()
    monkeypatch.undo()  # the real fast path on the same rows: no mismatch, exit 0
    assert agreement.main(argv) == 0
    assert "**Total mismatches: 0.**" in out.read_text()
