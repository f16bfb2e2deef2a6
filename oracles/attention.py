"""The attention oracle: softmax(scale * q k^T + mask) v of the exact inputs, correctly rounded.

What "exact" means here (NUMERICS.md section 3): every fp16/bf16/fp32 input is a dyadic rational,
the scale is the fp32 value the kernel multiplies by (`effective_scale`: fl32(scale), default
fl32(1/sqrt(D))), and the output is the exact real number rounded once, to nearest even, to the
input's format. Special rows follow NUMERICS.md section 2: a row with no visible key is +0; a
non-finite q row or visible key makes the row NaN; a non-finite visible value makes its column
NaN in every row that sees it (the exact weights are never 0). Infinite inputs are treated as NaN.

Two paths, the second certified exact:

1. Fast path, float64 with a rigorous error bound E per element, vectorised over a (b, h) slice.
   - Scores: every product q_d k_d is exact in float64 (fp16 x fp16 has 22 significant bits,
     bf16 x bf16 16, fp32 x fp32 48; exponents stay inside float64's range, 2^-298 .. 2^256).
     They are summed with TwoSum (Dot2 of Ogita, Rump and Oishi): hi is the recursive sum and
     the rounding errors e_i of each addition are exact, so s = hi + sum e_i exactly; lo =
     fl(sum e_i) is off by at most gamma_{D-1} sum |e_i| <= (D u)^2 A, u = 2^-53, A = sum |q_d k_d|.
   - Exponents x_j = -sc (s_ref - s_j), s_ref the largest visible score: the difference of the
     double-doubles costs 3u|diff|, the product with sc another u|x|, so
     |x^_j - x_j| <= sc (3u|diff| + 2(D+1)^2 u^2 (A_j + A_ref)) + 1.01 u |x_j|.
   - e_j = exp(x^_j): relative error eta_j <= expm1(err_j) + 2^-49 (numpy's exp is within a few
     ulps; 2^-49 is 16 ulps).
   - o^ = (e @ v) / sum e. With e^_j = e_j (1 + delta_j), |delta_j| <= eta_j:
     o^ - o = sum_j e_j delta_j (v_j - o) / sum e^ (before float rounding), so
     |o^ - o| <= (sum_j p_j eta_j |v_j| + sum_j p_j |v_j| * sum_j p_j eta_j) / (1 - max eta)
     plus the float64 sums and the division, (2(N + 2) u) sum_j p_j |v_j|, plus exponentials
     that underflow float64 (exact weight < 2^-1022 relative to the largest): N 2^-1070 max|v|.
   - Certification: rounding is monotonic, so if o^ - E and o^ + E round to the same value of the
     format (same sign for zeros), so does the exact o. For fp16/bf16 output E ~ 1e-14 |o| against
     a rounding granularity of 2^-12, so practically every element is decided here; fp32 output
     leaves about one element in a million to the exact path.
2. Exact path, per undecided element (`_exact_row`): integer scores (each input is an integer
   times a power of two; the dot of the integer mantissas is an exact Python integer), exponents
   t_j - t_max as exact rationals. By the Lindemann-Weierstrass theorem, sum_j c_j e^{a_j} = 0
   with distinct rational a_j and rational c_j forces every c_j = 0, so o is rational exactly when
   every group of keys with equal exact scores has the same mean value c; then o = c, rounded
   exactly (`round_fraction`). Otherwise o is irrational, is never a rounding boundary, and Ziv's
   loop (`round_certified`) with mpmath terminates.

The oracle also returns what the componentwise bound needs (`oracles.bounds.attention_error_bound`):
the weights p, a_ij = sc sum_d |q_id k_jd|, d_ij = t_max - t_j, |v|, and the visibility mask.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import mpmath
import numpy as np
import torch

from .formats import Format, format_of, round_float64, to_float64, ulp_distance
from .rounding import round_certified, round_fraction

U64 = 2.0**-53
EXP_REL = 2.0**-49  # relative error allowed for numpy's float64 exp (16 ulps)


def effective_scale(scale: float | None, head_dim: int) -> float:
    """The scale value the kernel multiplies scores by: fl32(scale), default fl32(1/sqrt(D))."""
    s = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return float(np.float32(s))


@dataclass
class AttentionOracle:
    """Correctly rounded attention output plus the quantities its error bound needs.

    Shapes: out, pv, special (B, H, M, D); p, a, d, visible (B, H, M, N); absv (B, H, N, D)."""

    fmt: Format
    scale: float
    out: np.ndarray  # correctly rounded exact result (float64 holding values of fmt)
    approx: np.ndarray  # float64 approximation of the exact result (before rounding)
    p: np.ndarray  # exact softmax weights to ~1e-14 relative, 0 where hidden
    a: np.ndarray  # sc * sum_d |q_id k_jd| (upper bound), 0 where hidden
    d: np.ndarray  # t_max - t_j >= 0 in natural-log units, 0 where hidden
    absv: np.ndarray  # |v| with non-finite entries as 0
    v: np.ndarray  # v with non-finite entries as 0
    visible: np.ndarray  # key j exists and row i sees it
    special: np.ndarray  # exact special values (NaN, no-key zeros): no tolerance at all
    pv: np.ndarray  # sum_j p_j |v_jd|
    fallbacks: int = 0  # elements the exact path decided
    timing: dict = field(default_factory=dict)


def _as_f64(t) -> np.ndarray:
    return to_float64(t) if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)


def _dot2(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """hi + lo ~= q @ k.T with the summation errors captured exactly by TwoSum (Dot2)."""
    m, dd = q.shape
    n = k.shape[0]
    hi = np.zeros((m, n))
    lo = np.zeros((m, n))
    for c in range(dd):
        p = np.multiply.outer(q[:, c], k[:, c])  # exact
        t = hi + p
        z = t - hi
        lo += (hi - (t - z)) + (p - z)
        hi = t
    return hi, lo


def _visibility(m: int, n: int, n_valid: int, causal: bool) -> np.ndarray:
    j = np.arange(n)[None, :]
    vis = np.broadcast_to(j < n_valid, (m, n))
    if causal:
        vis = vis & (j <= np.arange(m)[:, None])
    return np.array(vis)


def _int_mantissas(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Exact integers X (object array) and an exponent E with x = X * 2^E elementwise."""
    mant, ex = np.frexp(x)
    mi = np.ldexp(mant, 53).astype(np.int64)  # exact: at most 53 significant bits
    ex = ex.astype(np.int64) - 53
    nz = mi != 0
    e0 = int(ex[nz].min()) if nz.any() else 0
    shifts = np.where(nz, ex - e0, 0)
    out = np.empty(x.shape, dtype=object)
    flat_m, flat_s, flat_o = mi.ravel(), shifts.ravel(), out.reshape(-1)
    for i in range(flat_m.size):
        flat_o[i] = int(flat_m[i]) << int(flat_s[i])
    return out, e0


def _exact_row(qi: np.ndarray, kj: np.ndarray, vj: np.ndarray, cols: list[int], sc: float,
               fmt: Format) -> dict[int, float]:
    """Correctly rounded outputs of one query row for the given columns (finite inputs; the row
    sees the keys kj with values vj, at least one)."""
    qint, eq = _int_mantissas(qi)
    kint, ek = _int_mantissas(kj)
    scores = [int(x) for x in kint.dot(qint)] if qi.size else [0] * len(kj)  # exact, times 2^(eq+ek)
    s_max = max(scores)
    sm, se = math.frexp(sc)
    sc_int, sc_exp = int(sm * 2**53), se - 53  # sc = sc_int * 2^sc_exp exactly
    shift = eq + ek + sc_exp
    # exact exponents a_j = t_j - t_max = (S_j - S_max) * sc_int * 2^shift  (<= 0)
    nums = [(s - s_max) * sc_int for s in scores]
    groups: dict[int, list[int]] = {}
    for j, s in enumerate(scores):
        groups.setdefault(s, []).append(j)
    cache: dict[int, list] = {}

    def weights(prec: int) -> list:
        if prec not in cache:
            with mpmath.workprec(prec):
                ws = []
                for nmr in nums:
                    if nmr == 0:
                        ws.append(mpmath.mpf(1))
                        continue
                    with mpmath.workprec(max(prec, abs(nmr).bit_length() + 2)):
                        a = mpmath.ldexp(mpmath.mpf(nmr), shift)  # exact
                    ws.append(mpmath.exp(a))  # rounded at prec, within 1 ulp
                cache[prec] = ws
        return cache[prec]

    n = len(scores)
    result: dict[int, float] = {}
    for c in cols:
        col = vj[:, c]
        means = {Fraction(sum(Fraction(float(col[j])) for j in g), len(g)) for g in groups.values()}
        if len(means) == 1:  # rational: every equal-score group has the same mean
            result[c] = round_fraction(means.pop(), fmt)
            continue

        def compute(prec: int, col=col):
            wp = prec + 2 * max(n, 2).bit_length() + 8
            ws = weights(wp)
            with mpmath.workprec(wp):
                num = mpmath.fsum(w * float(x) for w, x in zip(ws, col))
                den = mpmath.fsum(ws)
                o = num / den
                sabs = mpmath.fsum(w * abs(float(x)) for w, x in zip(ws, col)) / den
                # each weight within 2^(1-wp) relative, sums and the division within
                # (2n + 2) 2^-wp: |o^ - o| <= 2 (2n + 4) 2^-wp (sum p|v| + |o|), generous factor 2
                err = mpmath.ldexp((sabs + abs(o)) * (4 * n + 8), -wp)
            return o, err

        result[c] = round_certified(compute, fmt)
    return result


def _slice(qs, ks, vs, n_valid, causal, sc, fmt):
    """Oracle for one (b, h): returns out, approx, p, a, d, special, pv, fallbacks."""
    m, dd = qs.shape
    n = ks.shape[0]
    vis = _visibility(m, n, n_valid, causal)
    any_vis = vis.any(axis=1)
    q_ok = np.isfinite(qs).all(axis=1)
    k_ok = np.isfinite(ks).all(axis=1)
    v_ok = np.isfinite(vs)
    q0 = np.where(np.isfinite(qs), qs, 0.0)
    k0 = np.where(np.isfinite(ks), ks, 0.0)
    v0 = np.where(v_ok, vs, 0.0)
    absv = np.abs(v0)

    nan_row = any_vis & (~q_ok | (vis & ~k_ok[None, :]).any(axis=1))
    nan_el = nan_row[:, None] | (vis.astype(np.float64) @ (~v_ok).astype(np.float64) > 0)
    zero_row = ~any_vis

    out = np.zeros((m, dd))
    approx = np.zeros((m, dd))
    p = np.zeros((m, n))
    a = np.zeros((m, n))
    dmat = np.zeros((m, n))
    pv = np.zeros((m, dd))
    special = nan_el | zero_row[:, None]
    fallbacks = 0
    live = any_vis & ~nan_row
    if n == 0 or not live.any():
        out[nan_el] = np.nan
        approx[nan_el] = np.nan
        return out, approx, p, a, dmat, special, pv, fallbacks

    hi, lo = _dot2(q0, k0)
    A = (np.abs(q0) @ np.abs(k0).T) * (1.0 + (dd + 2) * 2.0**-52)
    s_val = np.where(vis, hi + lo, -np.inf)
    jr = np.argmax(s_val, axis=1)  # reference key: a largest visible score
    rows = np.arange(m)
    diff = (hi[rows, jr][:, None] - hi) + (lo[rows, jr][:, None] - lo)  # s_ref - s_j
    A_ref = A[rows, jr][:, None]
    err_s = 3 * U64 * np.abs(diff) + 2 * (dd + 1) ** 2 * U64**2 * (A + A_ref)
    x = -sc * diff
    err_x = sc * err_s + 1.01 * U64 * np.abs(x)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        e = np.where(vis & live[:, None], np.exp(x), 0.0)
        eta = np.where(vis, np.expm1(np.minimum(err_x, 50.0)) * (1 + 2.0**-40) + EXP_REL, 0.0)
    l = e.sum(axis=1)
    l_safe = np.where(l > 0, l, 1.0)
    o_hat = (e @ v0) / l_safe[:, None]
    pv_hat = (e @ absv) / l_safe[:, None]
    ee = e * eta
    peta = (ee @ absv) / l_safe[:, None]
    eta_sum = ee.sum(axis=1) / l_safe
    eta_max = np.where(e > 0, eta, 0.0).max(axis=1)
    vmax = absv.max() if absv.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        E = ((peta + pv_hat * eta_sum[:, None]) / (1.0 - eta_max)[:, None] * (1 + 2.0**-30)
             + 2 * (n + 2) * U64 * pv_hat * (1 + 2.0**-30)
             + n * 2.0**-1070 * vmax + 4 * U64 * np.abs(o_hat))
    E = np.where((eta_max < 1e-3)[:, None], E, np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        r_lo = round_float64(o_hat - E, fmt)
        r_hi = round_float64(o_hat + E, fmt)
    decided = (r_lo == r_hi) & (np.signbit(r_lo) == np.signbit(r_hi)) & np.isfinite(E)
    out[:] = r_lo
    approx[:] = o_hat

    todo = ~decided & live[:, None] & ~nan_el
    for i in np.nonzero(todo.any(axis=1))[0]:
        cols = [int(c) for c in np.nonzero(todo[i])[0]]
        keys = np.nonzero(vis[i])[0]
        got = _exact_row(qs[i], ks[keys], vs[keys], cols, sc, fmt)
        for c, val in got.items():
            out[i, c] = val
        fallbacks += len(cols)

    out[zero_row] = 0.0
    approx[zero_row] = 0.0
    out[nan_el] = np.nan
    approx[nan_el] = np.nan
    live2 = live[:, None]
    p = np.where(live2, e / l_safe[:, None], 0.0)
    a = np.where(vis & live2, sc * A, 0.0)
    dmat = np.where(vis & live2, np.maximum(-x, 0.0), 0.0)
    pv = np.where(live2, pv_hat, 0.0)
    return out, approx, p, a, dmat, special, pv, fallbacks


def attention_oracle(q, k, v, *, causal: bool = False, scale: float | None = None, kv_lens=None,
                     fmt: Format | None = None) -> AttentionOracle:
    """The correctly rounded attention of q (B, H, M, D), k, v (B, H, N, D) (tensors of any
    device and layout, or float64 arrays with `fmt` given), with the bound's ingredients."""
    import time

    t0 = time.perf_counter()
    if fmt is None:
        fmt = format_of(q.dtype)
    qf, kf, vf = _as_f64(q), _as_f64(k), _as_f64(v)
    B, H, M, D = qf.shape
    N = kf.shape[2]
    sc = effective_scale(scale, D)
    if kv_lens is None:
        lens = [N] * B
    else:
        lens = [int(x) for x in (kv_lens.detach().cpu().tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens)]
    out = np.zeros((B, H, M, D))
    approx = np.zeros((B, H, M, D))
    p = np.zeros((B, H, M, N))
    a = np.zeros((B, H, M, N))
    dm = np.zeros((B, H, M, N))
    special = np.zeros((B, H, M, D), dtype=bool)
    pv = np.zeros((B, H, M, D))
    vis = np.zeros((B, H, M, N), dtype=bool)
    fb = 0
    for b in range(B):
        nv = min(max(lens[b], 0), N)
        for h in range(H):
            r = _slice(qf[b, h], kf[b, h], vf[b, h], nv, causal, sc, fmt)
            out[b, h], approx[b, h], p[b, h], a[b, h], dm[b, h], special[b, h], pv[b, h], f = r
            vis[b, h] = _visibility(M, N, nv, causal)
            fb += f
    v0 = np.where(np.isfinite(vf), vf, 0.0)
    return AttentionOracle(fmt=fmt, scale=sc, out=out, approx=approx, p=p, a=a, d=dm, absv=np.abs(v0), v=v0,
                           visible=vis,
                           special=special, pv=pv, fallbacks=fb,
                           timing={"seconds": time.perf_counter() - t0})


# ---- comparison ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionComparison:
    """A kernel's output against the oracle; the interface of `oracles.compare.Comparison`
    (dist, bound, ftz, oracle, violations, bound_ratio) so the report's Accumulator takes it,
    with the bound in absolute terms (`err`, `bound`) and the ULP distance for reading."""

    oracle: np.ndarray
    actual: np.ndarray
    dist: np.ndarray  # ULP distance (inf for a NaN mismatch)
    err: np.ndarray  # |actual - oracle| (inf for a NaN mismatch)
    bound: np.ndarray  # allowed |actual - oracle|
    ftz: np.ndarray

    @property
    def violations(self) -> np.ndarray:
        return ~(self.err <= self.bound) & ~self.ftz

    def bound_ratio(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(self.err == 0, 0.0, self.err / self.bound)
        return np.where(self.ftz, 0.0, r)


def compare_attention(actual, oracle: AttentionOracle, *, block_n: int, n_blocks: int) -> AttentionComparison:
    from .bounds import attention_error_bound, ftz_allowed

    y = _as_f64(actual)
    r = oracle.out
    bound = attention_error_bound(oracle, block_n=block_n, n_blocks=n_blocks)
    nan_y, nan_r = np.isnan(y), np.isnan(r)
    with np.errstate(invalid="ignore"):
        err = np.where(nan_y | nan_r, np.where(nan_y & nan_r, 0.0, np.inf), np.abs(y - r))
    err = np.where(np.isinf(y) & (y == r), 0.0, err)
    dist = ulp_distance(y, r, oracle.fmt)
    ftz = ftz_allowed(y, r) & ~oracle.special
    return AttentionComparison(oracle=r, actual=y, dist=dist, err=err, bound=bound, ftz=ftz)


__all__ = ["AttentionOracle", "AttentionComparison", "attention_oracle", "compare_attention", "effective_scale"]
