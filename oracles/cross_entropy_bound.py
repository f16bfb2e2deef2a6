"""Error bounds of the fused cross-entropy kernel with every option: class weights, label smoothing,
z-loss, logit softcap, the reductions, and the autograd gradient stored in the logits' dtype then
scaled by grad_output (docs/NUMERICS.md 9.7). Beside `cross_entropy.cross_entropy_loss_bound` /
`cross_entropy_grad_bound` (9.4, plain cross-entropy, which the kernel also meets), not replacing them.

Kernel model (kernels/cross_entropy_kernels.py; u = 2^-24; logits exact in fp32; n_chunks chunks of
`block` columns, D = ceil(log2 block) + n_chunks):

  x'_j   = fl(fl(c) attention._tanh(fl(x_j fl(1/c)))): |x'^_j - x'_j| <= delta_j = u (14 |x'_j| + 2 |x_j|
           sech^2(x_j / c)) + 2^-126 (tanh <= 12u, the cap's and the product's roundings, a's two
           roundings through tanh's slope); no softcap: delta = 0. delta^ = max_j delta_j.
  (m, l) 9.4's online sum of x'^ (per lane, the same roundings): sigma = u (6E + 5 n_chunks + 4 + D)
           + V 2^-126, E, L from the exact x'; Lambda = 1.01 sigma + 2^-22 ln 2 + 3u L bounds L^ = fl(ln 2)
           log2(l^) against L(x'^), and lse(x'^) is within delta^ of lse(x'), L(x'^) within 2 delta^.
  loss   fp64 per row: nll = (m - x'_t) + L^ (m - x'_t exact): Lambda + 2 delta^ + 2^-53 nll;
         c0 = (1 - eps) w_t: t1 = c0 nll; W = sum w (per-lane fp32 sums: u (n_chunks + log2 block) W,
         exact unweighted); T = sum_j w_j (m - x'_j), every term >= 0: u Dt T + 2 delta^ W,
         Dt = 4 n_chunks + ceil(log2 block) + 4 + Dw; t2 = (eps / V)(W L + T); t3 = (z lse) lse with lse
         within Lambda + 3 delta^; the fp64 products and sums 2^-51 of the terms.
  reduction: float64 sum and division of the rows' fp64 losses, rounded once to fmt: (sum_i pre_i +
         N 2^-52 sum_i |loss_i|) / divisor, and one ulp (the oracle's half and ours).
  grad   fp32: p^_j = exp2(fl(fl(x'_j - m) log2 e) - lg2 l) within p_j expm1(rho_j), rho_j = 1.01 sigma +
         2^-22 ln 2 + 2u L + 4u d_j + 4u + delta_j + delta^; r = fl(c0 fl(p - [j = t])) + fl(fl(K p) -
         fl(eps/V) w_j), K = fl(eps/V) W + 2 fl(z) fl(m + L) (each product and sum one u); times g (the
         mean's go / W_t rounded to fp32: u; the product u), times sech^2 from e = exp2(-|x| fl(2 log2 e / c))
         (relative u (4 |x / c| + 12): the exponent's two roundings, ex2, 1 + e, the square, the division)
         and its product u; flushed p and products 2^-125 (c0 + |K| + 1) |g|.
  rescaled (autograd, grad_output != 1): the gradient for the unit scale is stored in fmt (its bound
  plus half an ulp for 16-bit), multiplied by grad_output in fp32 (u) and rounded again.
  natural (a kernel that does not declare this arithmetic: 9.4's natural kernel, torch's fp32 path):
  lse = fl(m + L^) formed in fp32 and the loss and exponents taken from it, the terms combined and the
  rows reduced in fp32, tanh as 1 - 2 / (e^{2a} + 1) and the chain factor as 1 - t^2: 3u (|m| + L) more
  on lse (Lambda), u (|m| + 2L + d_j) more on each exponent, 4u of the row's terms, N u of a
  reduction's, 6u c more on each capped logit and 7u absolute on each chain factor. (At |m| ~ 1e30 the
  first-order |p^ - p| passes 1, which p^ and p, both in [0, 1], never do: it is capped at 1.)
Elements whose oracle value is not finite, ignored rows and rows of a NaN mean must match exactly: 0.
Class weights are taken >= 0 (T's terms then never cancel); torch's class weights are.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .cross_entropy import _Config, cross_entropy_grad_oracle, cross_entropy_oracle
from .formats import FP32, Format, format_of
from .log_softmax import finish_bound, lse_rows

__all__ = ["cross_entropy_full_loss_bound", "cross_entropy_full_grad_bound"]

FormatLike = Format | str | torch.dtype
_U = 2.0**-24
_FTZ = 2.0**-126
_SECOND = 1.0 + 2.0**-20


class _Rows:
    """First-order float64 quantities of every row, at the exact x' (softcapped logits)."""

    def __init__(self, cfg: _Config, n_chunks: int, block: int, natural: bool = False):
        x, c = cfg.x, cfg.c
        with np.errstate(invalid="ignore", over="ignore"):
            if c is None:
                xp, delta, self.a = x, np.zeros_like(x), np.zeros_like(x)
            else:
                self.a = x / c
                xp = c * np.tanh(self.a)
                sech2 = 1.0 / np.cosh(np.where(np.isfinite(self.a), self.a, 0.0)) ** 2
                slope = np.where(np.isfinite(x), np.abs(x) * sech2, 0.0)
                delta = _U * (14 * np.abs(np.nan_to_num(xp)) + 2 * slope) + _FTZ + (6 * _U * c if natural else 0.0)
            self.a = np.where(np.isfinite(self.a), np.abs(self.a), 0.0)
        self.m, self.d, _, L, self.p, E = lse_rows(xp)
        self.L = L[:, 0]
        self.dbar = np.nan_to_num(delta).max(axis=1) if x.shape[1] else np.zeros(x.shape[0])
        self.delta = np.nan_to_num(delta)
        D = math.ceil(math.log2(max(block, 1))) + n_chunks
        sigma = _U * (6 * E[:, 0] + 5 * n_chunks + 4 + D) + cfg.V * _FTZ
        self.lam = 1.01 * sigma + 2.0**-22 * math.log(2) + 3 * _U * self.L
        self.natural = natural
        if natural:
            self.lam = self.lam + 3 * _U * (np.abs(self.m[:, 0]) + self.L)
        self.sigma = sigma
        self.dw = (n_chunks + math.ceil(math.log2(max(block, 1)))) if cfg.w is not None and not (cfg.w == 1).all() \
            else 0
        self.dt = 4 * n_chunks + math.ceil(math.log2(max(block, 1))) + 4 + self.dw
        self.lse = self.m[:, 0] + self.L
        self.W = float(np.sum(cfg.w))
        with np.errstate(invalid="ignore"):
            self.T = np.where(np.isfinite(self.d), cfg.w[None, :] * self.d, 0.0).sum(axis=1)


def _config(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, reduction="none") -> _Config:
    return _Config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                   reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)


def _row_loss_error(cfg: _Config, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """(pre_i, |loss_i|) of every row, fp64 combination (module docstring)."""
    t = np.clip(cfg.t, 0, max(cfg.V - 1, 0))
    i = np.arange(cfg.N)
    eps, z, sv = cfg.eps, cfg.z, cfg.eps / max(cfg.V, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        c0 = (1 - eps) * cfg.w[t]
        nll = rows.d[i, t] + rows.L
        dL = rows.lam + 2 * rows.dbar
        t1 = c0 * nll
        e1 = c0 * (dL + 2.0**-53 * nll) + 2.0**-52 * t1
        sm = rows.W * rows.L + rows.T
        dsm = rows.W * dL + rows.L * _U * rows.dw * rows.W + _U * rows.dt * rows.T + 2 * rows.dbar * rows.W \
            + 2.0**-52 * sm
        t2 = sv * sm
        e2 = sv * dsm + 2.0**-52 * t2
        dlse = rows.lam + 3 * rows.dbar + 2.0**-53 * np.abs(rows.lse)
        t3 = z * rows.lse**2
        e3 = z * (2 * np.abs(rows.lse) * dlse + dlse**2) + 2.0**-51 * t3
        total = np.abs(t1) + t2 + t3
        pre = (e1 + e2 + e3 + (2.0**-51 + (4 * _U if rows.natural else 0.0)) * total) * _SECOND
    return np.where(np.isfinite(pre), pre, 0.0), np.where(np.isfinite(total), total, 0.0)


def cross_entropy_full_loss_bound(logits, target, fmt: FormatLike, n_chunks: int, *, block: int | None = None,
                                  weight=None, ignore_index: int = -100, label_smoothing: float = 0.0,
                                  z_loss: float = 0.0, softcap: float | None = None, reduction: str = "none",
                                  oracle: np.ndarray | None = None, natural: bool = False) -> np.ndarray:
    """Allowed |loss^ - r| (per row for "none", else of the reduced loss), r the correctly rounded
    oracle with the same options; `block` defaults to ceil(V / n_chunks); natural: the natural
    kernel's arithmetic (module docstring)."""
    fmt = format_of(fmt)
    cfg = _config(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, reduction)
    block = block or max(1, -(-cfg.V // max(n_chunks, 1)))
    if oracle is None:
        oracle = cross_entropy_oracle(logits, target, fmt, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                      reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)
    r = np.asarray(oracle, dtype=np.float64)
    if cfg.N == 0:
        return np.zeros(r.shape)
    pre, mag = _row_loss_error(cfg, _Rows(cfg, n_chunks, block, natural))
    counted = ~cfg.ignored
    if reduction == "none":
        return np.where(counted, finish_bound(pre, r, fmt, final=1.0), 0.0)
    div = float(cfg.Wt) if reduction == "mean" else 1.0
    if div == 0:
        return np.zeros(r.shape)
    rnd = _U if natural else 2.0**-52  # an fp32 or a float64 reduction
    red = (pre[counted].sum() + (cfg.N + 2) * rnd * mag[counted].sum()) / div * (1 + 2 * rnd)
    return finish_bound(np.asarray(red), r, fmt, final=1.0)


def _row_scales(cfg: _Config, grad_output) -> np.ndarray:
    """g_i as the oracle takes it: grad_output (per row for "none"), / sum w_t for "mean" (NaN at 0)."""
    go = np.asarray(grad_output, dtype=np.float64).reshape(-1)
    g = go if cfg.reduction == "none" else np.full(cfg.N, go[0])
    if cfg.reduction == "mean":
        g = g / float(cfg.Wt) if cfg.Wt else np.full(cfg.N, np.nan)
    return np.broadcast_to(g, (cfg.N,)).astype(np.float64)


def _grad_error(cfg: _Config, rows: _Rows, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pre_ij, |exact gradient_ij|) for row scales g (module docstring)."""
    N, V = cfg.N, cfg.V
    t = np.clip(cfg.t, 0, max(V - 1, 0))
    eps, z = cfg.eps, cfg.z
    sv = eps / max(V, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        p, d = rows.p, np.where(np.isfinite(rows.d), rows.d, 0.0)
        oh = np.zeros((N, V))
        oh[np.arange(N), t] = 1.0
        c0 = ((1 - eps) * cfg.w[t])[:, None]
        rho = (1.01 * rows.sigma + 2.0**-22 * math.log(2) + 2 * _U * rows.L)[:, None] + 4 * _U * d + 4 * _U \
            + rows.delta + rows.dbar[:, None]
        if rows.natural:  # the exponent fl(x' - fl(m + L)): lse's rounding and the subtraction's
            rho = rho + (_U * (np.abs(rows.m[:, 0]) + 2 * rows.L))[:, None] + _U * d
        dp = np.minimum(p * np.expm1(rho), 1.0)  # p^ and p both lie in [0, 1] (lg2 l^ >= 0): a blown-up rho is 1
        r1 = c0 * (p - oh)
        dr = c0 * (dp + 4 * _U * np.abs(p - oh)) * (1 + 2 * _U)
        K = np.zeros((N, 1))
        dK = np.zeros((N, 1))
        if eps > 0:
            K = K + sv * rows.W
            dK = dK + sv * rows.W * _U * (3 + rows.dw)
        if z > 0:
            lse = rows.lse[:, None]
            dlse32 = (rows.lam + 2 * rows.dbar + _U * (np.abs(rows.m[:, 0]) + rows.L) + rows.dbar)[:, None]
            K = K + 2 * z * lse
            dK = dK + 2 * z * (dlse32 + 3 * _U * np.abs(lse))
        inner = r1 + K * p - sv * cfg.w[None, :]
        if eps > 0 or z > 0:
            term2 = np.abs(K) * dp + p * dK + _U * np.abs(K) * p + 2 * _U * sv * cfg.w[None, :] \
                + _U * np.abs(K * p - sv * cfg.w[None, :])
            dr = dr + term2 + _U * np.abs(inner)
        ch = np.ones((N, V)) if cfg.c is None else np.where(np.isfinite(cfg.x), 1.0 / np.cosh(
            np.where(np.isfinite(cfg.x), cfg.x / cfg.c, 0.0)) ** 2, 0.0)
        chain_rel = _U * (4 * rows.a + 14) if cfg.c is not None else _U * np.ones((N, V))
        chain_abs = 7 * _U if rows.natural and cfg.c is not None else 0.0  # 1 - t^2 from t off by ~3u
        ga = np.abs(g)[:, None]
        pre = (ch * ga * (dr + 2 * _U * np.abs(inner)) + ga * np.abs(inner) * (ch * chain_rel + chain_abs)
               + ga * (c0 + np.abs(K) + 1) * 2.0**-125) * _SECOND
        exact = np.abs(g[:, None] * ch * inner)
    return np.where(np.isfinite(pre), pre, 0.0), np.where(np.isfinite(exact), exact, 0.0)


def cross_entropy_full_grad_bound(logits, target, fmt: FormatLike, n_chunks: int, *, block: int | None = None,
                                  grad_output=1.0, weight=None, ignore_index: int = -100,
                                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                                  reduction: str = "mean", rescaled: bool = False,
                                  oracle: np.ndarray | None = None, natural: bool = False) -> np.ndarray:
    """Allowed |grad^_ij - r_ij|, r the correctly rounded gradient oracle for grad_output (a scalar for
    "mean"/"sum", (N,) for "none"). rescaled: the autograd path, the unit-scale gradient stored in fmt
    and multiplied by grad_output afterwards (kernels/cross_entropy.py); else one launch with
    grad_output folded in (`cross_entropy_with_grad`). Ignored rows and non-finite oracle values: 0."""
    fmt = format_of(fmt)
    cfg = _config(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, reduction)
    block = block or max(1, -(-cfg.V // max(n_chunks, 1)))
    if oracle is None:
        oracle = cross_entropy_grad_oracle(logits, target, fmt, grad_output, ignore_index=ignore_index,
                                           label_smoothing=label_smoothing, reduction=reduction, weight=weight,
                                           z_loss=z_loss, softcap=softcap)
    r = np.asarray(oracle, dtype=np.float64).reshape(cfg.N, cfg.V)
    if cfg.N == 0 or cfg.V == 0:
        return np.zeros(r.shape)
    rows = _Rows(cfg, n_chunks, block, natural)
    g = _row_scales(cfg, grad_output)
    if not rescaled:
        pre, _ = _grad_error(cfg, rows, g)
    else:
        go = g * (float(cfg.Wt) if reduction == "mean" and cfg.Wt else 1.0)  # the backward's factor
        gs = _row_scales(cfg, np.ones(cfg.N if reduction == "none" else 1))  # the forward's unit scale
        pre_s, ex_s = _grad_error(cfg, rows, gs)
        stored = pre_s if fmt == FP32 else finish_bound(pre_s, np.where(np.isfinite(ex_s), ex_s, 0.0), fmt,
                                                        final=0.5)
        pre = np.abs(go)[:, None] * stored + _U * np.abs(go)[:, None] * (ex_s + stored)
    out = finish_bound(pre, r, fmt)
    out[cfg.ignored] = 0.0
    return out
