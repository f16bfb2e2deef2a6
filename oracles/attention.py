"""The attention oracle: softmax(scale * q k^T + mask) v of the exact inputs, correctly rounded.

What "exact" means here (NUMERICS.md section 3): every fp16/bf16/fp32 input is a dyadic rational,
the scale is the fp32 value the kernel multiplies by (`effective_scale`: fl32(scale), default
fl32(1/sqrt(D))), the softcap the fp32 value fl32(c), and the output is the exact real number
rounded once, to nearest even, to the input's format. Scores are t_ij = sc q_i.k_j, then
c tanh(t / c) with a softcap, then + bias_ij of a float attn_mask. Visibility: key j exists for
j < n (kv_lens), row i sees it when i + off - left <= j <= i + off + right (window, causal: right
0; off = n - M for bottom-right alignment) and a boolean attn_mask allows it; a bias of -inf hides
it. GQA: query head h reads key/value head h // (Hq // Hkv). Special rows follow NUMERICS.md
section 2: a row with no visible key is +0 (lse -inf); a non-finite q row, visible key, or bias
(NaN, +inf) of a visible key makes the row NaN; a non-finite visible value makes its column NaN in
every row that sees it (the exact weights are never 0). Infinite q/k inputs count as NaN.

Two paths, the second certified exact:

1. Fast path, float64 with a rigorous error bound E per element, vectorised over a (b, h) slice.
   - Scores: one BLAS product q @ k^T in float64. Every product q_d k_d is exact in float64
     (fp16 x fp16 has 22 significant bits, bf16 x bf16 16, fp32 x fp32 48; exponents stay inside
     float64's range); any summation order then errs by at most gamma_D A, A = sum |q_d k_d|,
     gamma_D = D u / (1 - D u), u = 2^-53 (FMA or not, blocked or not).
   - Exponents x_j = t_j - t_ref (t_ref the largest visible exponent). Plain scores:
     x_j = -sc (s_ref - s_j), |x^_j - x_j| <= sc (u |diff| + gamma_D (A_j + A_ref)) + 1.01 u |x_j|.
     With softcap or bias, t_j is formed per key: y = sc s (error sc gamma_D A + u|y|), c tanh(y / c)
     (numpy's tanh within 2 ulps, the division and product 2 more: 6u |t| + sech^2 * err(y)), plus
     the bias (u |t + b|); x_j = t_j - t_ref adds u |x_j| and both keys' errors.
   - e_j = exp(x^_j): relative error eta_j <= expm1(err_j) + 2^-49 (numpy's exp is within a few
     ulps; 2^-49 is 16 ulps).
   - o^ = (e @ v) / sum e. With e^_j = e_j (1 + delta_j), |delta_j| <= eta_j:
     |o^ - o| <= (sum_j p_j eta_j |v_j| + sum_j p_j |v_j| * sum_j p_j eta_j) / (1 - max eta)
     plus the float64 sums and the division, (2(N + 2) u) sum_j p_j |v_j|, plus exponentials
     that underflow float64 (exact weight < 2^-1022 relative to the largest): N 2^-1070 max|v|.
   - Certification: rounding is monotonic, so if o^ - E and o^ + E round to the same value of the
     format (same sign for zeros), so does the exact o. For fp16/bf16 output E ~ 1e-14 |o| against
     a rounding granularity of 2^-12, so practically every element is decided here; fp32 output
     leaves about one element in a million to the exact path.
   - lse = t_ref + log(sum e), in float64 with its own error bound `lse_err` (not rounded: the
     kernel's lse bound is absolute and orders of magnitude above it).
2. Exact path, per undecided element (`_exact_row`): integer scores (each input is an integer
   times a power of two; the dot of the integer mantissas is an exact Python integer), exponents
   t_j - t_max as exact rationals (plus the exact bias). By the Lindemann-Weierstrass theorem,
   sum_j c_j e^{a_j} = 0 with distinct rational a_j and rational c_j forces every c_j = 0, so o is
   rational exactly when every group of keys with equal exact exponents has the same mean value c;
   then o = c, rounded exactly (`round_fraction`). Otherwise o is irrational, is never a rounding
   boundary, and Ziv's loop (`round_certified`) with mpmath terminates. With a softcap the
   exponents c tanh(.) are transcendental and that argument does not apply: Ziv's loop runs up
   to its precision cap and raises `UndecidedRounding` rather than guess (never seen).

The oracle also returns what the componentwise bound needs (`oracles.bounds.attention_error_bound`):
the weights p, a_ij = sc sum_d |q_id k_jd| (times tanh's slope with a softcap), |t_ij| (softcap),
|bias_ij|, d_ij = t_max - t_j, |v|, the visibility mask and the lse.
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
    """The scale value the kernel multiplies scores by: fl32(scale), default fl32(1/sqrt(D)).

    The engine reads this one. kernels/attention_args.py keeps the kernel's own copy (the oracles
    sit below the kernels and cannot import it; kernels/ is frozen: its digest ties the GPU lane's
    record); tests/test_families.py holds the two equal."""
    s = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return float(np.float32(s))


def _window(window, causal: bool) -> tuple[int, int]:
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return left, (0 if causal else right)


def visibility(m: int, n: int, n_valid: int, causal: bool = False, window=None,
               causal_align: str = "top_left") -> np.ndarray:
    """(m, n) bool: key j exists (j < n_valid) and query i sees it (causal / window around the
    diagonal of the alignment; NUMERICS.md section 1)."""
    j = np.arange(n)[None, :]
    i = np.arange(m)[:, None]
    vis = np.broadcast_to(j < n_valid, (m, n))
    off = n_valid - m if causal_align == "bottom_right" else 0
    left, right = _window(window, causal)
    if left >= 0:
        vis = vis & (j >= i + off - left)
    if right >= 0:
        vis = vis & (j <= i + off + right)
    return np.array(vis)


_visibility = visibility  # the old private name (tests, reports)


@dataclass
class AttentionOracle:
    """Correctly rounded attention output plus the quantities its error bound needs.

    Shapes: out, pv, special (B, Hq, M, Dv); p, a, d, t_abs, b_abs, visible (B, Hq, M, N);
    absv, v (B, Hq, N, Dv) (the key/value head each query head reads); lse, lse_err (B, Hq, M)."""

    fmt: Format
    scale: float
    out: np.ndarray  # correctly rounded exact result (float64 holding values of fmt)
    approx: np.ndarray  # float64 approximation of the exact result (before rounding)
    p: np.ndarray  # exact softmax weights to ~1e-14 relative, 0 where hidden
    a: np.ndarray  # sc * sum_d |q_id k_jd| (upper bound; times tanh's slope with a softcap), 0 where hidden
    d: np.ndarray  # t_max - t_j >= 0 in natural-log units, 0 where hidden
    absv: np.ndarray  # |v| with non-finite entries as 0
    v: np.ndarray  # v with non-finite entries as 0
    visible: np.ndarray  # key j exists and row i sees it
    special: np.ndarray  # exact special values (NaN, no-key zeros): no tolerance at all
    pv: np.ndarray  # sum_j p_j |v_jd|
    lse: np.ndarray = None  # log sum_j exp(t_j) over visible keys (-inf: none; NaN: NaN row)
    lse_err: np.ndarray = None  # |lse - exact| bound of the float64 value
    t_abs: np.ndarray = None  # |capped score| with a softcap (its evaluation error), else 0
    b_abs: np.ndarray = None  # |bias| of a float attn_mask, else 0
    float_bias: bool = False  # a float attn_mask was given (the kernel's exponents in natural units)
    softcap: float = 0.0
    dot_dim: int = 0  # D of q and k (the bound's dot length; out's last dim is Dv)
    fallbacks: int = 0  # elements the exact path decided
    timing: dict = field(default_factory=dict)


def _as_f64(t) -> np.ndarray:
    return to_float64(t) if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)


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


def _mpf_exact(fr: Fraction) -> mpmath.mpf:
    """A dyadic rational as an exact mpf (whatever the working precision)."""
    num, den = fr.numerator, fr.denominator
    if den & (den - 1):
        raise ValueError(f"{fr} is not dyadic")
    with mpmath.workprec(max(num.bit_length(), 1) + 2):
        return mpmath.ldexp(mpmath.mpf(num), -(den.bit_length() - 1))


def _exact_row(qi: np.ndarray, kj: np.ndarray, vj: np.ndarray, cols: list[int], sc: float,
               fmt: Format, bias: np.ndarray | None = None, cap: float = 0.0) -> dict[int, float]:
    """Correctly rounded outputs of one query row for the given columns (finite inputs; the row
    sees the keys kj with values vj, at least one; bias: their finite biases)."""
    qint, eq = _int_mantissas(qi)
    kint, ek = _int_mantissas(kj)
    scores = [int(x) for x in kint.dot(qint)] if qi.size else [0] * len(kj)  # exact, times 2^(eq+ek)
    sm, se = math.frexp(sc)
    sc_frac = Fraction(int(sm * 2**53)) * Fraction(2) ** (se - 53)
    unit = sc_frac * Fraction(2) ** (eq + ek)  # score j = scores[j] * unit exactly
    bias_fr = [Fraction(float(b)) for b in bias] if bias is not None else [Fraction(0)] * len(scores)
    keys = list(zip(scores, bias_fr))
    groups: dict[tuple, list[int]] = {}
    for j, key in enumerate(keys):
        groups.setdefault(key, []).append(j)
    if cap == 0.0:
        expo = [s * unit + b for s, b in keys]  # exact rationals
        top = max(expo)
        rel = [e - top for e in expo]
    cache: dict[int, list] = {}

    # Exponents are evaluated with enough extra bits that their absolute error stays below
    # 2^-prec (dyadic inputs are exact mpf values; tanh adds relative error on |t| <= cap + |b|).
    big = max([abs(float(b)) for b in bias_fr] + [cap, 1.0])
    extra = int(math.log2(big)) + 4

    def weights(prec: int) -> list:
        if prec not in cache:
            with mpmath.workprec(prec + extra):
                if cap == 0.0:
                    ws = [mpmath.exp(_mpf_exact(r)) if r else mpmath.mpf(1) for r in rel]
                else:
                    c = mpmath.mpf(cap)
                    ts = [c * mpmath.tanh(_mpf_exact(s * unit) / c) + _mpf_exact(b) for s, b in keys]
                    tmax = max(ts)
                    ws = [mpmath.exp(t - tmax) for t in ts]
                cache[prec] = ws
        return cache[prec]

    n = len(scores)
    result: dict[int, float] = {}
    for c in cols:
        col = vj[:, c]
        means = {Fraction(sum(Fraction(float(col[j])) for j in g), len(g)) for g in groups.values()}
        if len(means) == 1:  # every equal-exponent group has the same mean: o is that mean
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
                # each weight within a few ulps of wp (tanh, exp and the exponent's roundings),
                # sums and the division within (2n + 2) 2^-wp: generous factor 2 on the total
                err = mpmath.ldexp((sabs + abs(o)) * (4 * n + 16), -wp)
            return o, err

        result[c] = round_certified(compute, fmt)
    return result


def _exact_lse(qi: np.ndarray, kj: np.ndarray, sc: float, bias: np.ndarray | None = None,
               cap: float = 0.0) -> float:
    """log(sum_j exp(t_j)) of one query row over the keys kj it sees (finite inputs), as a float64
    within 2 ulps (of float64) of the exact value. For rows whose float64 error bound is not small:
    a bias so large that the scores vanish beside it (torch.finfo(dtype).min masks) leaves the fast
    path's t_j with an absolute error far above 1."""
    qint, eq = _int_mantissas(qi)
    kint, ek = _int_mantissas(kj)
    scores = [int(x) for x in kint.dot(qint)] if qi.size else [0] * len(kj)
    sm, se = math.frexp(sc)
    unit = Fraction(int(sm * 2**53)) * Fraction(2) ** (se - 53 + eq + ek)
    bias_fr = [Fraction(float(b)) for b in bias] if bias is not None else [Fraction(0)] * len(scores)
    big = max([abs(float(b)) for b in bias_fr] + [cap, 1.0])
    # absolute error 2^-(prec - log2 big) on each t_j, far below an ulp of the result
    with mpmath.workprec(120 + int(math.log2(big)) + 2 * max(len(scores), 2).bit_length()):
        if cap == 0.0:
            ts = [_mpf_exact(s * unit + b) for s, b in zip(scores, bias_fr)]
        else:
            c = mpmath.mpf(cap)
            ts = [c * mpmath.tanh(_mpf_exact(s * unit) / c) + _mpf_exact(b) for s, b in zip(scores, bias_fr)]
        top = max(ts)
        return float(top + mpmath.log(mpmath.fsum(mpmath.exp(t - top) for t in ts)))


def _dot2(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """hi + lo ~= q @ k.T with the summation errors captured exactly by TwoSum (Dot2 of Ogita,
    Rump and Oishi): s = hi + sum e_i exactly, lo = fl(sum e_i) off by <= (D u)^2 A."""
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


def _exponents(q0, k0, vis, sc, cap, bias, dd, precise: bool = False):
    """Per visible key: exponent x_j = t_j - t_ref (<= 0), its error bound, the reference t_ref
    and its error, and a (sc A, times tanh's slope), t_abs, b_abs for the kernel's bound.
    precise: scores by Dot2 (error (D + 1)^2 u^2 A, D times slower) instead of one BLAS product
    (error gamma_D A): the second try for rows the first could not decide."""
    m, n = vis.shape
    gam = dd * U64 / (1 - dd * U64)
    A = (np.abs(q0) @ np.abs(k0).T) * (1 + 2 * gam)
    if precise:
        hi, lo = _dot2(q0, k0)
        s = hi + lo
        e2 = 2 * (dd + 1) ** 2 * U64**2 * A  # |hi + lo - s| (exact sum of hi and lo)
        es = e2 + U64 * np.abs(s)
    else:
        hi = s = q0 @ k0.T
        lo = np.zeros_like(s)
        e2 = es = gam * A  # |s^ - s|
    rows = np.arange(m)
    t_abs = np.zeros((m, n))
    b_abs = np.zeros((m, n)) if bias is None else np.where(vis, np.abs(np.nan_to_num(bias, posinf=0, neginf=0)), 0)
    slope = 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        if cap == 0.0 and bias is None:
            s_val = np.where(vis, s, -np.inf)
            jr = np.argmax(s_val, axis=1)  # reference key: a largest visible score
            diff = (hi[rows, jr][:, None] - hi) + (lo[rows, jr][:, None] - lo)  # s_ref - s_j
            err_s = 3 * U64 * np.abs(diff) + e2 + e2[rows, jr][:, None]
            x = -sc * diff
            err_x = sc * err_s + 1.01 * U64 * np.abs(x)
            t_ref = sc * s[rows, jr]
            err_ref = sc * es[rows, jr] + U64 * np.abs(t_ref)
        else:
            y = sc * s
            err_y = sc * es + U64 * np.abs(y)
            t = y
            err_t = err_y
            if cap > 0.0:
                t = cap * np.tanh(y / cap)
                # tanh's slope at the worst point of the interval y +- err_y
                slope = 1.0 / np.cosh(np.maximum(np.abs(y) - err_y, 0.0) / cap) ** 2
                err_t = slope * err_y + 6 * U64 * np.abs(t)
                t_abs = np.where(vis, np.abs(t), 0.0)
            if bias is not None:
                bb = np.where(vis, np.nan_to_num(bias, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
                t = t + bb
                err_t = err_t + U64 * np.abs(t)
            t_val = np.where(vis, t, -np.inf)
            jr = np.argmax(t_val, axis=1)
            t_ref = t[rows, jr]
            err_ref = err_t[rows, jr]
            x = t - t_ref[:, None]
            err_x = err_t + err_ref[:, None] + U64 * np.abs(x)
    a = sc * A * slope
    return x, err_x, t_ref, err_ref, a, t_abs, b_abs


def _slice(qs, ks, vs, vis, sc, fmt, *, cap: float = 0.0, bias: np.ndarray | None = None,
           precise: bool = False):
    """Oracle for one (b, h) slice: queries qs (M, D), its keys ks (N, D), values vs (N, Dv),
    visibility vis (M, N) (bias -inf already folded in), bias (M, N) or None. Rows left
    undecided go once more through the fast path with Dot2 scores, then to the exact path."""
    m, dd = qs.shape
    n, dv = vs.shape
    any_vis = vis.any(axis=1)
    q_ok = np.isfinite(qs).all(axis=1)
    k_ok = np.isfinite(ks).all(axis=1)
    v_ok = np.isfinite(vs)
    q0 = np.where(np.isfinite(qs), qs, 0.0)
    k0 = np.where(np.isfinite(ks), ks, 0.0)
    v0 = np.where(v_ok, vs, 0.0)
    absv = np.abs(v0)

    bad_key = vis & ~k_ok[None, :]
    if bias is not None:
        bad_key |= vis & ~np.isfinite(bias)  # NaN or +inf bias on a visible key (-inf is hidden)
    nan_row = any_vis & (~q_ok | bad_key.any(axis=1))
    nan_el = nan_row[:, None] | (vis.astype(np.float64) @ (~v_ok).astype(np.float64) > 0)
    zero_row = ~any_vis

    out = np.zeros((m, dv))
    approx = np.zeros((m, dv))
    p = np.zeros((m, n))
    a = np.zeros((m, n))
    dmat = np.zeros((m, n))
    t_abs = np.zeros((m, n))
    b_abs = np.zeros((m, n))
    pv = np.zeros((m, dv))
    lse = np.where(nan_row, np.nan, -np.inf)
    lse_err = np.zeros(m)
    special = nan_el | zero_row[:, None]
    fallbacks = 0
    live = any_vis & ~nan_row
    if n == 0 or not live.any():
        out[nan_el] = np.nan
        approx[nan_el] = np.nan
        return out, approx, p, a, dmat, t_abs, b_abs, special, pv, lse, lse_err, fallbacks

    x, err_x, t_ref, err_ref, a_all, t_all, b_all = _exponents(q0, k0, vis, sc, cap, bias, dd, precise)
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
    retry = np.nonzero(todo.any(axis=1))[0] if not precise else np.zeros(0, dtype=int)
    if retry.size:
        sub = _slice(qs[retry], ks, vs, vis[retry], sc, fmt, cap=cap,
                     bias=None if bias is None else bias[retry], precise=True)
        out[retry] = sub[0]
        fallbacks += sub[-1]
        todo[retry] = False
    for i in np.nonzero(todo.any(axis=1))[0]:
        cols = [int(c) for c in np.nonzero(todo[i])[0]]
        keys = np.nonzero(vis[i])[0]
        got = _exact_row(qs[i], ks[keys], vs[keys], cols, sc, fmt,
                         bias=None if bias is None else bias[i, keys], cap=cap)
        for c, val in got.items():
            out[i, c] = val
        fallbacks += len(cols)

    out[zero_row] = 0.0
    approx[zero_row] = 0.0
    out[nan_el] = np.nan
    approx[nan_el] = np.nan
    live2 = live[:, None]
    hidden = ~(vis & live2)
    p = np.where(live2, e / l_safe[:, None], 0.0)
    a = np.where(hidden, 0.0, a_all)
    t_abs = np.where(hidden, 0.0, t_all)
    b_abs = np.where(hidden, 0.0, b_all)
    dmat = np.where(hidden, 0.0, np.maximum(-x, 0.0))
    pv = np.where(live2, pv_hat, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(live, t_ref + np.log(l_safe), lse)
        lse_err = np.where(live, err_ref + np.log1p(eta_sum / (1 - eta_max)) + 2 * (n + 2) * U64
                           + U64 * np.abs(lse), 0.0)
    # Where the float64 error is not small (or not even a number: 1 - eta_max <= 0), the exact path.
    for i in np.nonzero(live & ~((lse_err >= 0) & (lse_err < 2.0**-20)))[0]:
        keys = np.nonzero(vis[i])[0]
        lse[i] = _exact_lse(qs[i], ks[keys], sc, bias=None if bias is None else bias[i, keys], cap=cap)
        lse_err[i] = 4 * U64 * abs(lse[i])
    return out, approx, p, a, dmat, t_abs, b_abs, special, pv, lse, lse_err, fallbacks


def _mask_arrays(attn_mask, shape) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(allowed bool (B, Hq, M, N) or None, bias float64 (B, Hq, M, N) or None)."""
    if attn_mask is None:
        return None, None
    m = attn_mask.expand(shape) if isinstance(attn_mask, torch.Tensor) else np.broadcast_to(attn_mask, shape)
    if isinstance(m, torch.Tensor) and m.dtype == torch.bool:
        return m.detach().cpu().numpy(), None
    if isinstance(m, np.ndarray) and m.dtype == bool:
        return m, None
    bias = _as_f64(m)
    return bias != -np.inf, bias


def attention_oracle(q, k, v, *, causal: bool = False, scale: float | None = None, kv_lens=None,
                     window=None, softcap: float = 0.0, causal_align: str = "top_left", attn_mask=None,
                     return_lse: bool = False, num_splits: int = 1, pack_gqa=None,
                     fmt: Format | None = None) -> AttentionOracle:
    """The correctly rounded attention of q (B, Hq, M, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv)
    (tensors of any device and layout, or float64 arrays with `fmt` given), with the bound's
    ingredients and the lse. Takes the kernel's keywords; return_lse, num_splits and pack_gqa
    change nothing in the exact result (lse is always computed)."""
    import time

    t0 = time.perf_counter()
    if fmt is None:
        fmt = format_of(q.dtype)
    qf, kf, vf = _as_f64(q), _as_f64(k), _as_f64(v)
    B, Hq, M, D = qf.shape
    Hkv, N, Dv = kf.shape[1], kf.shape[2], vf.shape[3]
    group = Hq // Hkv
    sc = effective_scale(scale, D)
    cap = float(np.float32(float(softcap)))
    if kv_lens is None:
        lens = [N] * B
    else:
        lens = [int(x) for x in (kv_lens.detach().cpu().tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens)]
    allowed, bias = _mask_arrays(attn_mask, (B, Hq, M, N))
    out = np.zeros((B, Hq, M, Dv))
    approx = np.zeros((B, Hq, M, Dv))
    full = [np.zeros((B, Hq, M, N)) for _ in range(5)]  # p, a, d, t_abs, b_abs
    special = np.zeros((B, Hq, M, Dv), dtype=bool)
    pv = np.zeros((B, Hq, M, Dv))
    vis = np.zeros((B, Hq, M, N), dtype=bool)
    lse = np.zeros((B, Hq, M))
    lse_err = np.zeros((B, Hq, M))
    fb = 0
    for b in range(B):
        nv = min(max(lens[b], 0), N)
        base = visibility(M, N, nv, causal, window, causal_align)
        for h in range(Hq):
            hk = h // group
            vis_bh = base if allowed is None else base & allowed[b, h]
            r = _slice(qf[b, h], kf[b, hk], vf[b, hk], vis_bh, sc, fmt, cap=cap,
                       bias=None if bias is None else bias[b, h])
            (out[b, h], approx[b, h], full[0][b, h], full[1][b, h], full[2][b, h], full[3][b, h], full[4][b, h],
             special[b, h], pv[b, h], lse[b, h], lse_err[b, h], f) = r
            vis[b, h] = vis_bh
            fb += f
    v0 = np.repeat(np.where(np.isfinite(vf), vf, 0.0), group, axis=1)
    return AttentionOracle(fmt=fmt, scale=sc, out=out, approx=approx, p=full[0], a=full[1], d=full[2],
                           absv=np.abs(v0), v=v0, visible=vis, special=special, pv=pv, lse=lse, lse_err=lse_err,
                           t_abs=full[3], b_abs=full[4], float_bias=bias is not None, softcap=cap, dot_dim=D,
                           fallbacks=fb,
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


def compare_attention(actual, oracle: AttentionOracle, *, block_n: int, n_blocks: int,
                      fp32_dot: str = "ieee") -> AttentionComparison:
    """fp32_dot: how the kernel's matmuls read fp32 operands (`oracles.bounds.FP32_DOTS`)."""
    from .bounds import attention_error_bound, ftz_allowed

    y = _as_f64(actual)
    r = oracle.out
    bound = attention_error_bound(oracle, block_n=block_n, n_blocks=n_blocks, fp32_dot=fp32_dot)
    nan_y, nan_r = np.isnan(y), np.isnan(r)
    with np.errstate(invalid="ignore"):
        err = np.where(nan_y | nan_r, np.where(nan_y & nan_r, 0.0, np.inf), np.abs(y - r))
    err = np.where(np.isinf(y) & (y == r), 0.0, err)
    dist = ulp_distance(y, r, oracle.fmt)
    ftz = ftz_allowed(y, r) & ~oracle.special
    return AttentionComparison(oracle=r, actual=y, dist=dist, err=err, bound=bound, ftz=ftz)


@dataclass(frozen=True)
class LseComparison:
    """A kernel's lse (B, Hq, M) against the oracle's, in absolute terms (natural log units)."""

    oracle: np.ndarray
    actual: np.ndarray
    err: np.ndarray  # |actual - oracle| (0 for equal specials, inf for a special mismatch)
    bound: np.ndarray

    @property
    def violations(self) -> np.ndarray:
        return ~(self.err <= self.bound)


def compare_lse(actual, oracle: AttentionOracle, *, block_n: int, n_blocks: int,
                empty: float = -np.inf, fp32_dot: str = "ieee") -> LseComparison:
    """`empty`: the value the kernel writes for rows with no visible key (-inf, the torch
    convention; FlashAttention 2 writes +inf: an external kernel declares it)."""
    from .bounds import attention_lse_bound

    y = _as_f64(actual)
    r = np.where(oracle.lse == -np.inf, empty, oracle.lse)
    with np.errstate(invalid="ignore"):
        same_special = (np.isnan(y) & np.isnan(r)) | (np.isinf(r) & (y == r))
        err = np.where(same_special, 0.0, np.where(np.isfinite(y) & np.isfinite(r), np.abs(y - r), np.inf))
    return LseComparison(oracle=r, actual=y, err=err, bound=attention_lse_bound(oracle, block_n=block_n,
                                                                               n_blocks=n_blocks, fp32_dot=fp32_dot))


__all__ = ["AttentionOracle", "AttentionComparison", "LseComparison", "attention_oracle", "compare_attention",
           "compare_lse", "effective_scale", "visibility"]
