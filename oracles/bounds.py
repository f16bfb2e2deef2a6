"""Derived error bounds, one function per kernel family; the only place tolerances come from.

Softmax family (fp32 arithmetic inside), with u = 2^-24 (fp32 unit roundoff), d_i = x_i - max,
p_i the exact softmax and E = sum_i p_i |d_i|:

  s_i = fl(x_i - m)              |s_i - d_i| <= u |d_i|
  t_i = fl(s_i * fl(log2 e))     exponent off by <= 3u |d_i| log2 e, so exp2(t_i) is off by a
                                 relative 3u |d_i|; ex2.approx adds <= 2 ulp = 4u
  S   = sum of the terms         each term off by (3|d_j| + 4)u, weighted by p_j: (3E + 4)u;
                                 the rounding chain of the sum adds D u, D = the kernel's
                                 rounding depth (per-thread sequential length + tree levels,
                                 plus one step per chunk rescale or merge)
  y_i = e_i / S                  div.full.f32: <= 2 ulp = 4u

  relative error e_i <= (3|d_i| + 3E + D + 16) u     (4u of slack covers second-order terms)

For fp32 output the computed value is the output: |y^ - r_i| <= e_i|y_i| + ulp/2, so the ULP
distance to the correctly rounded r_i is at most floor(e_i |y_i| / ulp + 1/2). For fp16/bf16
output the fp32 value is rounded once more, giving floor(e_i |y_i| / ulp + 1): as e_i is below
2^-15 wherever an fp16 (|d| < 18) or bf16 (|d| < 93) output is nonzero, that is 1 ULP, the
faithful-rounding contract of NUMERICS.md section 3. `ulp` is taken at |y_i|(1 - e_i), the
smaller side, so a binade boundary never shrinks the allowance below the truth, and the
exact value is taken as |r_i| + ulp/2. Results below fp32's normals carry an absolute error of
at most 2^-149 on top (gradual underflow in exp2 and in the division).

Flush to zero: a correctly rounded output below the smallest normal fp32 may come out as a zero
of the same sign (GPU `ftz` arithmetic); `ftz_allowed` marks those, the report counts them.
"""
from __future__ import annotations

import math

import numpy as np

from .formats import FP32, Format, ulp_of

U32 = 2.0**-24
SLACK = 16.0  # 4u exp2 + 4u terms + 4u division + 4u second-order
# Below fp32's normals errors are absolute, not relative: the exp2 term and the quotient can
# each lose half of 2^-149; dividing by S >= 1 does not grow the first.
FP32_UNDERFLOW = 2.0**-149


def softmax_relative_error(x: np.ndarray, *, depth: int) -> np.ndarray:
    """Per-element bound on the relative error of an fp32 softmax before its final rounding."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(np.where(np.isnan(x), -np.inf, x), axis=1, keepdims=True)
        d = np.abs(x - m)
        d = np.where(np.isfinite(d), d, 0.0)  # -inf entries are exact zeros; NaN rows are exact NaN
        w = np.exp(-d) * (np.isfinite(x))
        expected_d = (w * d).sum(axis=1, keepdims=True) / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)
    return (3.0 * d + 3.0 * expected_d + depth + SLACK) * U32


def softmax_ulp_bound(x: np.ndarray, oracle: np.ndarray, fmt: Format, *, depth: int) -> np.ndarray:
    """Allowed ULP distance per element between a softmax kernel's output and the oracle."""
    e = softmax_relative_error(x, depth=depth)
    r = np.abs(np.asarray(oracle, dtype=np.float64))
    r = np.where(np.isfinite(r), r, 0.0)
    half = ulp_of(r, fmt) / 2
    y_hi = r + half  # the exact value lies within half an ULP of the rounded oracle
    ulp_lo = ulp_of(np.maximum(r * (1.0 - 2.0 * e) - 2.0 * half, 0.0), fmt)
    final_rounding = 0.5 if fmt == FP32 else 1.0
    return np.floor((e * y_hi + FP32_UNDERFLOW) / ulp_lo + final_rounding)


def ftz_allowed(actual: np.ndarray, oracle: np.ndarray) -> np.ndarray:
    """Outputs flushed to a zero of the right sign where the exact result is below fp32's normals."""
    a, r = np.asarray(actual, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    return (a == 0) & (r != 0) & (np.abs(r) < FP32.min_normal) & (np.signbit(a) == np.signbit(r))


def softmax_sum_bound(x: np.ndarray, oracle: np.ndarray, fmt: Format, *, depth: int) -> np.ndarray:
    """Bound on |sum_i y^_i - 1| per row, from the per-element bound.

    |y^_i - y_i| <= (b_i + 1/2) ulp_i (b_i ULPs from the rounded oracle, which is within half an
    ULP of exact), flushed outputs lose at most their own value, and the float64 check sum adds
    at most N * 2^-52."""
    b = softmax_ulp_bound(x, oracle, fmt, depth=depth)
    r = np.abs(np.asarray(oracle, dtype=np.float64))
    per = (b + 0.5) * ulp_of(r, fmt) + np.where(r < FP32.min_normal, r, 0.0)
    n = np.atleast_2d(x).shape[1]
    return per.sum(axis=1) + n * 2.0**-52


# ---- attention ------------------------------------------------------------------------------
# (attention bounds are added below by the attention family)

#: How a kernel's matmuls take fp32 operands (capability `fp32_dot`): "ieee" (exact products,
#: `tl.dot(..., input_precision="ieee")`) or "tf32" (tensor cores read 10 explicit mantissa bits).
FP32_DOTS = ("ieee", "tf32")
#: Relative error of one fp32 operand read as tf32: 10 explicit mantissa bits kept. Triton's
#: tl.dot (input_precision "tf32", its default for fp32) feeds the fp32 registers as they are and
#: the tensor cores drop the low 13 bits: truncation, < 1 tf32 ulp = 2^-10 relative (a
#: round-to-nearest conversion, cvt.rna, would halve it; triton-lang/triton#4574). Subnormals lose
#: < 2^-136 absolute.
TF32_INPUT = 2.0**-10


def dot_input_error(fmt: Format, fp32_dot: str = "ieee") -> float:
    """Relative error of each operand of the kernel's matmuls: 0 for 16-bit inputs (their
    products are exact in fp32) and for fp32 "ieee"; TF32_INPUT for fp32 "tf32"."""
    if fp32_dot not in FP32_DOTS:
        raise ValueError(f"fp32_dot {fp32_dot!r}: expected one of {', '.join(FP32_DOTS)}")
    return TF32_INPUT if fp32_dot == "tf32" and fmt.name == "fp32" else 0.0


def _exponent_error(oracle, b: int, h: int, n_blocks: int, e_in: float = 0.0) -> np.ndarray:
    """g_ij of `attention_error_bound`: the kernel's exponents are t_j + eps_j, |eps_j| <= g_j.
    e_in: `dot_input_error`; each product q_d k_jd of tf32 operands errs by (2 e_in + e_in^2) of
    |q_d k_jd| (exact in fp32 then: 11-bit significands), so the score by that much of a_j."""
    D = oracle.dot_dim if getattr(oracle, "dot_dim", None) else oracle.out.shape[-1]
    extra = 0.0
    if oracle.t_abs is not None:
        extra = 20 * oracle.t_abs[b, h] + 3 * oracle.b_abs[b, h]
    if getattr(oracle, "float_bias", False):
        extra = extra + 2 * oracle.d[b, h]
    return np.where(oracle.visible[b, h],
                    U32 * ((2 * D + 4) * oracle.a[b, h] + 3 * oracle.d[b, h] + extra + 4 * (n_blocks + 1))
                    + (2 * e_in + e_in * e_in) * oracle.a[b, h] + D * 2.0**-125 * oracle.scale, 0.0)


def attention_lse_bound(oracle, *, block_n: int, n_blocks: int, fp32_dot: str = "ieee") -> np.ndarray:
    """Allowed |lse - lse*| per row (natural log units, absolute), lse* the oracle's value.

    The kernel's lse is (m + log2 l32) ln 2 with l32 the fp32 row sum of the unrounded weights
    (kernels/attention.py). Its weights are exact weights of exponents t_j + eps_j, |eps_j| <= g_j
    (`attention_error_bound`), so log of their sum is off by at most
      L = log(sum_j p_j e^{g_j}) = log1p(sum_j p_j expm1(g_j))   (and as much below);
    the fp32 row sum (depth <= block_n per block, 2 per rescale) adds a relative
      (block_n + 2 n_blocks + 2) u, i.e. as much in the log; log2 (lg2.approx: absolute
    2^-22.6 in log2 units) 2^-21 ln 2; the sum m + log2 l, the product with fl(ln 2) and the fp32
    result 3 roundings: 4u (|lse*| + |t_max| + 1) with t_max <= |lse*| + log(N) covered by the 1 +
    the oracle's own error `lse_err`. Rows that see no key are -inf, NaN rows NaN: bound 0.
    fp32_dot="tf32": the scores' tf32 operands enter g_j (`_exponent_error`); l sums fp32 weights."""
    u = U32
    e_in = dot_input_error(oracle.fmt, fp32_dot)
    B, H, M = oracle.lse.shape
    out = np.zeros((B, H, M))
    for b in range(B):
        for h in range(H):
            g = np.minimum(_exponent_error(oracle, b, h, n_blocks, e_in), 700.0)
            L = np.log1p((oracle.p[b, h] * np.expm1(g)).sum(axis=1))
            lse = np.abs(np.nan_to_num(oracle.lse[b, h], nan=0.0, posinf=0.0, neginf=0.0))
            nvis = np.maximum(oracle.visible[b, h].sum(axis=1), 1)
            out[b, h] = (L * (1 + 1e-9) + (block_n + 2 * n_blocks + 2) * u * 1.01 + 2.0**-21 * math.log(2)
                         + 4 * u * (2 * lse + np.log(nvis) + 1) + oracle.lse_err[b, h])
    return np.where(np.isfinite(oracle.lse), out, 0.0)


def attention_error_bound(oracle, *, block_n: int, n_blocks: int, fp32_dot: str = "ieee") -> np.ndarray:
    """Allowed |o - r| per output element of a fused attention kernel, r the correctly rounded oracle.

    `oracle` is an `oracles.attention.AttentionOracle` (weights p, a_ij = sc sum_d |q_id k_jd|,
    d_ij = t_max - t_j, |v|, the exact value o*, which elements are exact specials). `block_n`:
    keys per block of the online softmax (the depth of one P @ V dot and of one row sum);
    `n_blocks`: key blocks a row goes through (rescales). Unknown kernels: block_n = n_blocks = N.

    Model of the kernel (kernels/attention.py; flash-style kernels in general), u = 2^-24:
      s^_j = dot(q, k_j) in fp32      16-bit products exact; each of the <= D additions errs by at
                                      most 2u of sum |terms| (any order; tensor cores align and
                                      truncate): |s^ - s| <= 2(D + 1) u A_j, A_j = sum_d |q_d k_jd|
                                      (fp32 inputs, ieee FMA dots: D u A_j, inside the same bound)
      x_j = fl(s^_j * c)              c = fl32(fl32(scale) log2 e): c's own rounding scales every
                                      difference t_j - t_max by (1 + u); the product adds u |t_j|
                                      <= u a_j (natural-log units)
      p^_j = exp2(fl(x_j - m_b))      m_b the running max at j's block; each later rescale
             * prod exp2(fl(m_k - m_k+1))   alpha_k adds u (m_k+1 - m_k): the subtractions telescope
                                      to u (m_final - x_j) = u d_j; ex2.approx: 2 ulp = 4u per call,
                                      at most n_blocks calls per key
    so the kernel's weights are exact softmax weights of perturbed exponents t_j + eps_j with
      |eps_j| <= g_j = u ((2D + 4) a_j + 3 d_j + 4 (n_blocks + 1)) + D 2^-125 sc
    (slack 1 a_j + 1 d_j + 4u for second-order terms; the last term: bf16 products below fp32's
    normals). Score term, exact in the perturbation (not first order): p^_j / p_j =
    1 / sum_k p_k e^{eps_k - eps_j}, and with Lambda_j = sum_{k != j} p_k expm1(g_k + g_j),
      |p^_j / p_j - 1| <= r_j = Lambda_j / (1 - Lambda_j)      (inf when Lambda_j >= 1)
      |o^ - o| <= S = sum_j min(p_j r_j, max(p_j, 1 - p_j)) |v_j|      (p^_j lies in [0, 1])
    To first order S = u sum_j p_j (g'_j + sum_k p_k g'_k) |v_j| with g' = g / u: the
    `c2 * u32 * (score-error term)` of NUMERICS.md with c2 = 1 on that term; Lambda_j is tight for
    one-hot rows (fp16-overflowing scores), where a first-order bound would be meaningless.

      P~_j = fl16(p^_j)               fp16/bf16 inputs: relative u16 (2^-11, 2^-8), or absolute
                                      tau16 (2^-25, 2^-134) below the normals; exp2 may flush a
                                      p^ below 2^-126 (absolute 2^-126 more)
      l = sum of P~ (fp32), acc = sum of P~ v (fp32)
    If the row sum uses the rounded P~ (kernels/attention.py), o = sum P~ v / sum P~ and P's
    rounding only reweights: |delta o| <= u16 sum_j p_j |v_j - o*|, zero for V of all ones. If
    it uses the fp32 p^ (FlashAttention), |delta o| <= u16 sum_j p_j |v_j|. The bound takes the
    larger of the two, so it holds for either convention (w_j = min(p_j (1 + r_j), 1) >= p^_j):
      |delta o| <= u16 / (1 - u16) * (max(sum_j w_j |v_j - o*|, sum_j w_j |v_j|) + 2 S)
                 + (tau16 + 2^-126) * c_l * sum_{j visible} (|v_j| + |o*| + S)
    with c_l >= 1 / l (l >= 1 - u16 as the running max's own weight is ~1; also 1/l ~ p_max).
    This is the `c1 * u16 * sum_j p_j |v_j|` term of NUMERICS.md with c1 = 1 (up to (1 + r_j)).

      fp32 accumulation               each key's term goes through one P @ V dot (2 block_n u, the
                                      tensor-core model), one add into acc (u) and, per later
                                      block, a rescale and an add (2u): (2 block_n + 2 n_blocks +
                                      1) u relative to sum p |v|; l: its row sum (depth <= block_n)
                                      and 2 per block, (block_n + 2 n_blocks) u relative of |o|;
                                      the division 2 ulp = 4u (div.full). Total, with 3u slack:
                                      (3 block_n + 4 n_blocks + 8) u (sum_j p_j |v_j| + S)
                                      plus (N + 2 n_blocks + 4) 2^-126 for fp32 flushes to zero.
      final rounding                  fp16/bf16 output: the kernel's fp32 value rounds once more
                                      (half an ulp) and the oracle is half an ulp from exact:
                                      1 ulp(|r| + pre); fp32 output: half an ulp(|r| + pre).

    Features (kernels/attention.py's arithmetic; flash kernels alike):
      softcap c                       t = tanh(s fl(sc/c)) fl(c log2 e): the dot's error reaches
                                      the exponent through tanh's slope, so a_j is replaced by
                                      a_j sech^2(x_j) (the oracle folds it into `a`), and the
                                      tanh evaluation (<= 12u relative), the argument's and the
                                      two products' roundings add 16u |t_j|: 20u |t_j| here.
      float attn_mask (bias b)        fl(b log2 e) and the add: u (|t_j| + 2|b_j|): 3u |b_j|;
                                      a kernel keeping such rows in natural units (ours: a bias
                                      near -3.4e38 overflows in base 2) adds b exactly as scaled
                                      (u |b_j| of those) and multiplies each difference by fl(log2 e):
                                      that product's rounding on p_j and, telescoping, on the
                                      rescales (2u d_j), and log2 e's own in place of c's: 2u d_j
                                      more, the slack d_j kept.
      split-KV (num_splits)           one more rescale per split: pass n_blocks + splits.
    so g_j = u ((2D + 4) a_j + 3 d_j + 20 |t_j| + 3 |b_j| + 4 (n_blocks + 1)) + D 2^-125 sc,
    plus 2u d_j with a float attn_mask.

    fp32 inputs, fp32_dot="tf32" (`dot_input_error`: e = 2^-10 per operand, truncation):
      scores                          each product errs by (2e + e^2) |q_d k_jd|: g_j gains
                                      (2e + e^2) a_j (`_exponent_error`); the fp32 dot's own 2(D+1)u
                                      on the grown |terms| stays inside g_j's slack for D <= 511
      P read as tf32                  as P rounded to 16 bits above, with u16 = e (either row sum)
      V read as tf32                  each v_j off by e |v_j|, weighted by P~_j / l <= w_j / (1 - e):
                                      e / (1 - e) sum_j w_j |v_j|, plus N 2^-136 for subnormal v
    The exponent range is fp32's, so the underflow terms are fp32's.

    Exact specials (NaN rows/columns, rows with no visible key) get bound 0: they must match
    exactly. Outputs below fp32's normals may flush to zero: `ftz_allowed`, counted separately.
    """
    fmt = oracle.fmt
    u = U32
    is16 = fmt.bits == 16
    e_in = dot_input_error(fmt, fp32_dot)
    u16 = fmt.unit_roundoff if is16 else e_in  # P's rounding (16 bits) or truncation (tf32) before P @ V
    tau = (fmt.min_subnormal / 2 if is16 else 0.0) + 2.0**-126
    B, H, M, Dv = oracle.out.shape
    N = oracle.p.shape[-1]
    out = np.zeros((B, H, M, Dv))
    if M == 0 or Dv == 0 or N == 0:
        return out
    r_all = np.nan_to_num(np.abs(oracle.out), nan=0.0, posinf=0.0)
    o_star = np.nan_to_num(np.abs(oracle.approx), nan=0.0, posinf=0.0)
    sgn_o = np.nan_to_num(oracle.approx, nan=0.0, posinf=0.0, neginf=0.0)
    for b in range(B):
        for h in range(H):
            vis = oracle.visible[b, h]
            p = oracle.p[b, h]
            absv = oracle.absv[b, h]
            g = np.minimum(_exponent_error(oracle, b, h, n_blocks, e_in), 700.0)
            em = np.expm1(g)
            T = (p * em).sum(axis=1, keepdims=True)
            with np.errstate(over="ignore", invalid="ignore"):
                lam = np.exp(g) * np.maximum(T - p * em + 1e-12 * T, 0.0) + (1.0 - p) * em
                lam = lam * (1 + 1e-9)
                r = np.where(lam < 1.0, lam / (1.0 - lam), np.inf)
                dev = np.where(p > 0, np.minimum(p * r, np.maximum(p, 1.0 - p)), 0.0)
                w = np.where(p > 0, np.minimum(p * (1.0 + r), 1.0), 0.0)
            S = dev @ absv  # (M, D)
            o_row = sgn_o[b, h]  # (M, D)
            vv = oracle.v[b, h]  # (N, D), non-finite entries as 0
            spread = np.maximum((w[:, :, None] * np.abs(vv[None, :, :] - o_row[:, None, :])).sum(axis=1),
                                w @ absv)
            prec16 = u16 / (1.0 - u16) * (spread + 2.0 * S) if u16 else 0.0
            if e_in:  # V read as tf32
                prec16 = prec16 + e_in / (1.0 - e_in) * (w @ absv) + N * 2.0**-136
            jmax = np.argmax(p, axis=1)
            pmax = p.max(axis=1)
            rmax = r[np.arange(M), jmax]
            gmax = g[np.arange(M), jmax]
            with np.errstate(invalid="ignore", over="ignore"):
                # 1/l = (kernel weight of the max key) / (its unnormalised weight, >= e^-2g)
                c_l = 1.001 * np.minimum(1.0, pmax * (1.0 + rmax) * np.exp(2.0 * gmax))
            c_l = np.where(np.isfinite(c_l), c_l, 1.001)
            n_vis = vis.sum(axis=1)
            tiny = tau * c_l[:, None] * ((vis.astype(np.float64) @ absv) + n_vis[:, None] * (o_star[b, h] + S))
            accum = (3 * block_n + 4 * n_blocks + 8) * u * (oracle.pv[b, h] + S) * (1 + 1e-6) \
                + (N + 2 * n_blocks + 4) * 2.0**-126
            pre = S + prec16 + tiny + accum
            last = ulp_of(r_all[b, h] + pre, fmt) * (1.0 if is16 else 0.5)
            out[b, h] = pre + last
    return np.where(oracle.special, 0.0, out)



def ones_v_tolerance(fmt: Format, row_sum: str, block_n: int, n_blocks: int, fp32_dot: str = "ieee") -> float:
    """|o - 1| allowed for V of all ones (a visible row).

    fp16/bf16: the weights P are rounded to 16 bits before P @ V. Summing l from the same rounded
    P ("rounded_p") makes the fp32 numerator and denominator the same sum computed the same way:
    exactly 1. Summing l from the fp32 P ("fp32_p", FlashAttention) leaves a relative difference
    of about u16 * (rows' weight) between them, far below one 16-bit ulp after the fp32 division,
    but the final rounding can land on a neighbour: within 1 ulp (eps of the format bounds both
    neighbours of 1). fp32 output: the accumulation part of the attention bound, (3 block_n +
    4 n_blocks + 8) u32, plus the final rounding; with fp32_dot="tf32" P is read as tf32 for P @ V
    (ones are exact in tf32): an l summed from the fp32 P differs by e / (1 - e) relative.
    """
    if fmt.name == "fp32":
        e_in = dot_input_error(fmt, fp32_dot)
        return (3 * block_n + 4 * n_blocks + 8) * 2.0**-24 + 2.0**-24 + e_in / (1.0 - e_in)
    if row_sum == "rounded_p":
        return 0.0
    if row_sum == "fp32_p":
        return 2.0 ** (1 - fmt.precision)  # one ulp above 1 (two below): either neighbour
    raise ValueError(f"row_sum {row_sum!r}: expected 'rounded_p' or 'fp32_p'")


def row_sum_bound(bound: np.ndarray, oracle: np.ndarray, fmt: Format, *, known: np.ndarray,
                  got: np.ndarray) -> np.ndarray:
    """Allowed |sum_j out_j - exact sum| per row (the training families' gradient identities, docs/NUMERICS.md
    9.8), for outputs each within `bound` of the correctly rounded `oracle`: sum_j (bound_j + the oracle's
    own half ulp), plus how well the exact sum is `known` (its float64 evaluation's error, per row) and 4
    float64 units of the kernel's sum `got` (a correctly rounded fsum of its outputs)."""
    r = np.asarray(oracle, dtype=np.float64)
    half = 0.5 * ulp_of(np.where(np.isfinite(r), r, 0.0), fmt)
    total = np.where(np.isfinite(r), bound + half, 0.0).sum(axis=-1)
    return total + known + 4 * 2.0**-53 * np.abs(got)

