"""Componentwise error bound of a FlashAttention-2 style Triton backward (docs/NUMERICS.md 10.4).

Model (u = 2^-24; u16 = 2^-11 fp16, 2^-8 bf16, 0 for fp32 inputs, whose dS stays fp32; tau16 half
the format's smallest subnormal for fp16/bf16). For each key block (block_n keys) the kernel walks
the query blocks (block_m rows; with GQA the rows of every query head of the group), and a second
pass per query block walks the key blocks for dq:

  s^ = dot(q, k_j) fp32         |s^ - s| <= 2(D + 1) u A, A = sum_d |q_d k_jd|
  P^ = exp2(s^ fl(sc log2 e) - lse2_i)   the saved lse off by lse_err (natural units); the
                                scale's, the product's and the subtraction's roundings u (|t| +
                                |t| + |t - lse|), ex2.approx 4u, lse2 = lse log2 e another u |lse|:
        P^ = P e^eps (1 + 4u),  |eps| <= g = u((2D + 4) a + 3|t| + 2|t - lse| + 2|lse| + 4)
                                + 20u|t| (softcap, as the forward) + 3u|b| + lse_err + D 2^-125 sc
                                (a = sc A times the softcap's slope)
        |P^ - P| <= eP = P (expm1(g)(1 + 4u) + 4u) + 2^-126      (exp2 may flush below 2^-126)
  P~ = fl16(P^)                 |P~ - P| <= eP~ = eP + u16 (P + eP) + tau16
  dv += dot(P~^T, dO)           fp32: each term through one dot of depth block_m (2 block_m u)
                                and one add per later query block (2u):
        |dv^ - dv| <= sum_i eP~ |dO| + acc_m sum_i (P + eP~)|dO|,  acc_m = (2 block_m + 2 n_m + 2) u
  dP^ = dot(dO, v_j) fp32       |dP^ - dP| <= eDP = 2(Dv + 1) u sum_d |dO_d v_jd|
  D^ = sum_d O~_d dO_d  fp32    O~ the forward's stored output, |O~ - O| <= o_err:
        |D^ - D| <= eD = sum_d o_err |dO| + 2(Dv + 1) u sum_d (|O| + o_err)|dO|
  dS^ = fl(P^ fl(dP^ - D^))     e_diff = eDP + eD + u(|dP - D| + eDP + eD)
        |dS^ - dS| <= eS = eP (|dP - D| + e_diff) + P e_diff + u (P + eP)(|dP - D| + e_diff)
  softcap: dS^ *= fl(1 - th^2), th = tanh(fl(y^/c)) within 12u|th|, y's error dy = (2D + 4)u sc A + 2u|y|:
        |f^ - f| <= ef = 2(12u |th| + f dy / c) + 3u
        eS <- eS (f + ef) + |dT| ef + u |dS|
  dS~ = fl16(dS^)               eS~ = eS + u16(|dS| + eS) + tau16
  dk += dot(dS~^T, q); dk *= sc |dk^ - dk| <= sc (sum_i eS~ |q| + acc_m sum_i (|dS| + eS~)|q|) + u |dk|
  dq += dot(dS~, k);  dq *= sc  |dq^ - dq| <= sc (sum_j eS~ |k| + acc_n sum_j (|dS| + eS~)|k|) + u |dq|,
                                acc_n = (2 block_n + 2 n_n + 2) u
  final rounding                fp16/bf16: 1 ulp(|r| + pre); fp32: half an ulp (section 3.5's rule)

Everything is first order in u with the cross terms kept (products such as P + eP), so the bound
stays an upper bound for the model's arithmetic as long as g and the rounding units are small.
o_err and lse_err default to the forward's own bounds (`attention_error_bound` plus half an ulp
of the rounded output, `attention_lse_bound`) with the same block_n, i.e. a forward kernel of the
modelled kind; a caller who knows its forward's error passes it (arrays (B, Hq, M, Dv), (B, Hq, M)
or scalars). Exact specials (NaN, structural zeros) get bound 0.
"""
from __future__ import annotations

import math

import numpy as np

from .formats import Format, format_of, ulp_of

U32 = 2.0**-24


def _forward_errors(bwd, block_n: int, n_blocks: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    from .attention import attention_oracle
    from .bounds import attention_error_bound, attention_lse_bound

    inp = bwd.inputs
    fwd = attention_oracle(inp["q"], inp["k"], inp["v"], causal=inp["causal"], scale=inp["scale"],
                           kv_lens=inp["kv_lens"], window=inp["window"], softcap=inp["softcap"] or 0.0,
                           attn_mask=inp["attn_mask"], causal_align=inp["causal_align"], fmt=bwd.fmt)
    N = inp["k"].shape[2]
    nb = n_blocks or max(1, math.ceil(N / block_n))
    o_err = attention_error_bound(fwd, block_n=block_n, n_blocks=nb) + ulp_of(np.nan_to_num(fwd.out), bwd.fmt) / 2
    lse_err = attention_lse_bound(fwd, block_n=block_n, n_blocks=nb)
    return np.where(np.isfinite(o_err), o_err, 0.0), np.where(np.isfinite(lse_err), lse_err, 0.0)


def attention_backward_bound(bwd, *, fmt: Format | None = None, block_m: int, block_n: int, lse_err=None,
                             o_err=None, forward_blocks: tuple[int, int] | None = None
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Allowed |kernel - oracle| per element of dq, dk, dv (absolute), the oracle the correctly rounded
    gradients of `bwd` (`attention_backward_quantities`). See the module docstring. Without o_err and
    lse_err they are the forward's own bounds at `forward_blocks` ((block_n, n_blocks) of the forward
    that saved o and lse; default: a forward blocked like this backward's dq kernel)."""
    fmt = bwd.fmt if fmt is None else format_of(fmt)
    u = U32
    is16 = fmt.bits == 16
    u16 = fmt.unit_roundoff if is16 else 0.0
    tau16 = fmt.min_subnormal / 2 if is16 else 0.0
    q = np.nan_to_num(bwd.inputs["q"], nan=0.0, posinf=0.0, neginf=0.0)
    k = np.nan_to_num(bwd.inputs["k"], nan=0.0, posinf=0.0, neginf=0.0)
    v = np.nan_to_num(bwd.inputs["v"], nan=0.0, posinf=0.0, neginf=0.0)
    do = np.nan_to_num(bwd.inputs["do"], nan=0.0, posinf=0.0, neginf=0.0)
    B, Hq, M, D = q.shape
    Hkv, N, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // Hkv
    sc, cap = abs(bwd.scale), bwd.softcap  # a negative scale flips signs, never the error's size
    if o_err is None or lse_err is None:
        fo, fl = _forward_errors(bwd, *(forward_blocks or (block_n, None)))
        o_err = fo if o_err is None else o_err
        lse_err = fl if lse_err is None else lse_err
    o_err = np.broadcast_to(np.asarray(o_err, dtype=np.float64), (B, Hq, M, Dv))
    lse_err = np.broadcast_to(np.asarray(lse_err, dtype=np.float64), (B, Hq, M))
    n_m = G * max(1, math.ceil(M / block_m))
    n_n = max(1, math.ceil(N / block_n))
    acc_m = (2 * block_m + 2 * n_m + 2) * u
    acc_n = (2 * block_n + 2 * n_n + 2) * u

    vis = bwd.visible
    P = bwd.p
    lse = np.where(np.isfinite(bwd.lse), bwd.lse, 0.0)
    t = bwd.t
    b_abs = np.zeros_like(P)
    if bwd.inputs["attn_mask"] is not None:
        from .attention import _mask_arrays

        _, bb = _mask_arrays(bwd.inputs["attn_mask"], P.shape)
        if bb is not None:
            b_abs = np.where(vis, np.abs(np.nan_to_num(bb, nan=0.0, posinf=0.0, neginf=0.0)), 0.0)
    f = bwd.factor if cap > 0 else np.ones_like(P)
    a = np.abs(bwd.a_raw) * f
    th = np.abs(np.tanh(bwd.y / cap)) if cap > 0 else 0.0
    t_cap = cap * th if cap > 0 else 0.0
    g = (u * ((2 * D + 4) * a + 3 * np.abs(t) + 2 * np.abs(t - lse[..., None]) + 2 * np.abs(lse)[..., None] + 4)
         + 20 * u * t_cap + 3 * u * b_abs + lse_err[..., None] + D * 2.0**-125 * sc)
    g = np.minimum(g, 700.0)
    eP = np.where(vis, P * (np.expm1(g) * (1 + 4 * u) + 4 * u) + 2.0**-126, 0.0)
    ePt = np.where(vis, eP + u16 * (P + eP) + tau16, 0.0)

    absdo = np.abs(do)
    # dv (summed over the group's heads): (B, Hkv, G, M, N) x (B, Hkv, G, M, Dv)
    def grp(x):
        return x.reshape(B, Hkv, G, *x.shape[2:])

    ePt_g, P_g, do_g = grp(ePt), grp(P), grp(absdo)
    dv_b = (np.einsum("bhgmn,bhgmd->bhnd", ePt_g, do_g)
            + acc_m * np.einsum("bhgmn,bhgmd->bhnd", P_g + ePt_g, do_g))

    vrep = np.repeat(np.abs(v), G, axis=1)  # (B, Hq, N, Dv)
    eDP = 2 * (Dv + 1) * u * np.einsum("bhmd,bhnd->bhmn", absdo, vrep)
    eD = (o_err * absdo).sum(-1) + 2 * (Dv + 1) * u * ((np.abs(bwd.o) + o_err) * absdo).sum(-1)
    diff = np.abs(bwd.dp - bwd.D[..., None])
    ediff = eDP + eD[..., None] + u * (diff + eDP + eD[..., None])
    eS = eP * (diff + ediff) + P * ediff + u * (P + eP) * (diff + ediff)
    if cap > 0:
        dy = (2 * D + 4) * u * np.abs(bwd.a_raw) + 2 * u * np.abs(bwd.y)
        ef = 2 * (12 * u * th + f * dy / cap) + 3 * u
        eS = eS * (f + ef) + np.abs(bwd.dt) * ef + u * np.abs(bwd.ds)
    eS = np.where(vis, eS, 0.0)
    absdS = np.abs(bwd.ds)
    eSt = np.where(vis, eS + u16 * (absdS + eS) + tau16, 0.0)

    krep = np.repeat(np.abs(k), G, axis=1)
    dq_pre = sc * (np.einsum("bhmn,bhnd->bhmd", eSt, krep) + acc_n * np.einsum("bhmn,bhnd->bhmd", absdS + eSt, krep))
    dq_pre = dq_pre + u * (np.abs(np.nan_to_num(bwd.dq_approx)) + dq_pre)
    eSt_g, dS_g, q_g = grp(eSt), grp(absdS), grp(np.abs(q))
    dk_pre = sc * (np.einsum("bhgmn,bhgmd->bhnd", eSt_g, q_g)
                   + acc_m * np.einsum("bhgmn,bhgmd->bhnd", dS_g + eSt_g, q_g))
    dk_pre = dk_pre + u * (np.abs(np.nan_to_num(bwd.dk_approx)) + dk_pre)
    dv_pre = dv_b

    outs = []
    for pre, r, special in ((dq_pre, bwd.dq, bwd.dq_special), (dk_pre, bwd.dk, bwd.dk_special),
                            (dv_pre, bwd.dv, bwd.dv_special)):
        pre = pre * (1 + 1e-6)
        rr = np.abs(np.nan_to_num(r, nan=0.0, posinf=0.0))
        last = ulp_of(rr + pre, fmt) * (1.0 if is16 else 0.5)
        outs.append(np.where(special, 0.0, pre + last))
    return tuple(outs)


__all__ = ["attention_backward_bound"]
