"""Error bounds of an fp32-computing cross-entropy kernel with every option: class weights, label
smoothing, z-loss, a logit softcap and each reduction (docs/NUMERICS.md 9.6). The same model as
`oracles/log_softmax_bound.py` (its `lse_error`: the row's lse within Delta); the options' own
arithmetic on top, first order, each term named below. `cross_entropy_loss_error` and
`cross_entropy_grad_error` return the allowed |kernel - r|, r the correctly rounded oracle of
`oracles/cross_entropy.py`, in the loss's and the gradient's shapes; 0 where r is not finite or a row
is ignored (exact there).

Softcap: x'^ = fl(c fl(tanh(fl(x / c)))) with tanh off by 8u |t| + 4u (a libdevice tanh, or one built
from exp2 whose 1 - 2 / (e + 1) is off by a few u absolute near 0), so |x'^ - x'| <= delta =
c (10u |t| + 6u) (the division's u |x / c| sech^2 <= 0.45u included); lse is 1-Lipschitz in the logits,
so Delta grows by max delta. The chain factor 1 - t^2 from t^: 16u t^2 + 8u |t| + 3u.

Coefficients: eps, z and the weights reach a Triton kernel as fp32 (eps = 0.1 is not exact there):
each product with one is u more, and 1 - eps is off by u eps absolute.
"""
from __future__ import annotations

import numpy as np
import torch

from .cross_entropy import _Config, cross_entropy_grad_oracle, cross_entropy_oracle
from .formats import FP32, Format, format_of, ulp_of
from .log_softmax_bound import FTZ, U, finish, gamma, lse_error

__all__ = ["cross_entropy_loss_error", "cross_entropy_grad_error"]

FormatLike = Format | str | torch.dtype


class _Model:
    """Per-row float64 quantities of the counted, non-special rows, shared by the loss and the gradient."""

    def __init__(self, cfg: _Config, depth: int | None) -> None:
        self.cfg = cfg
        N, V = cfg.N, cfg.V
        x = cfg.x
        c = cfg.c
        with np.errstate(invalid="ignore", over="ignore"):
            if c is not None:
                self.t = np.tanh(x / c)
                xp = c * self.t
                self.delta = np.where(np.isfinite(xp), c * (10 * U * np.abs(self.t) + 6 * U), 0.0)
            else:
                self.t = np.zeros_like(x)
                xp = x
                self.delta = np.zeros_like(x)
        self.xp = xp
        self.D = max(1, int(depth if depth is not None else V))
        self.Delta, self.p, self.d, self.L, self.m = lse_error(xp, self.D)
        self.Delta = self.Delta + self.delta.max(axis=1, initial=0.0)
        self.lse = self.m + self.L
        with np.errstate(invalid="ignore"):
            self.a = np.where(np.isfinite(xp), self.d + self.L[:, None], np.inf)  # lse - x'_j >= 0
        self.counted = ~cfg.ignored & np.array([not cfg.special(i) for i in range(N)], dtype=bool)
        self.w = cfg.w
        self.W = float(np.sum(cfg.w))
        self.eps, self.z = cfg.eps, cfg.z

    def row_loss(self, i: int) -> tuple[float, float]:
        """(float64 loss_i, its error bound) for a counted row whose loss is finite."""
        t = int(self.cfg.t[i])
        eps, z, V, w = self.eps, self.z, self.cfg.V, self.w
        a, Delta, lse = self.a[i], self.Delta[i], self.lse[i]
        t1 = (1 - eps) * w[t] * a[t]
        err = (1 - eps) * w[t] * (Delta + self.delta[i, t] + 2 * U * a[t]) + U * eps * w[t] * a[t]
        t2 = t3 = 0.0
        if eps > 0:
            s = float(np.sum(w * a))
            t2 = eps / V * s
            e_s = (self.W * Delta + float(np.sum(w * self.delta[i]))
                   + gamma(self.D + 2) * (s + self.W * abs(lse) + float(np.sum(w * np.abs(self.xp[i])))))
            err += eps / V * e_s
        if z > 0:
            t3 = z * lse * lse
            err += z * (2 * abs(lse) * Delta + Delta * Delta + 3 * U * lse * lse)
        err += 4 * U * (abs(t1) + abs(t2) + abs(t3))
        return t1 + t2 + t3, float(err)

    def grad_row(self, i: int, g: float) -> np.ndarray:
        """The error bound of row i's gradient for the scale g (grad_output, or grad_output / W_t)."""
        cfg = self.cfg
        t = int(cfg.t[i])
        eps, z, V, w, W = self.eps, self.z, cfg.V, self.w, self.W
        p, Delta, lse = self.p[i], self.Delta[i], self.lse[i]
        onehot = np.zeros(cfg.V)
        onehot[t] = 1.0
        rho = Delta + self.delta[i] + 3 * U * (self.d[i] + self.L[i]) + 4 * U
        b1 = (1 - eps) * w[t] * (p - onehot)
        e_b = (1 - eps) * w[t] * (p * rho + U * np.abs(p - onehot)) + U * eps * w[t] * np.abs(p - onehot)
        b2 = b3 = np.zeros(cfg.V)
        if eps > 0:
            b2 = eps / V * (W * p - w)
            e_b = e_b + eps / V * (W * p * rho + U * W * p * (1 + 1.01 * self.D) + U * np.abs(W * p - w))
        if z > 0:
            b3 = 2 * z * lse * p
            e_b = e_b + 2 * z * (abs(lse) * p * rho + Delta * p + 2 * U * abs(lse) * p)
        bracket = b1 + b2 + b3
        e_b = e_b + 4 * U * (np.abs(b1) + np.abs(b2) + np.abs(b3)) + FTZ * ((1 - eps) * w[t] + eps / V * W + 2 * z * abs(lse))
        if cfg.c is not None:
            tt = self.t[i]
            chain = 1 - tt * tt
            e_c = 16 * U * tt * tt + 8 * U * np.abs(tt) + 3 * U
        else:
            chain, e_c = np.ones(cfg.V), np.zeros(cfg.V)
        return abs(g) * (chain * e_b + np.abs(bracket) * e_c + 3 * U * chain * np.abs(bracket)) + FTZ * abs(g)


def _config(logits, target, *, ignore_index, label_smoothing, reduction, weight, z_loss, softcap) -> _Config:
    return _Config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                   reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)


def cross_entropy_loss_error(logits, target, fmt: FormatLike, *, ignore_index: int = -100,
                             label_smoothing: float = 0.0, reduction: str = "mean", weight=None, z_loss: float = 0.0,
                             softcap: float | None = None, depth: int | None = None,
                             oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |loss^ - r| in the loss's shape ((N,) for "none", () otherwise); `fmt` is the loss's
    format, `depth` the summation depth of the kernel's row sums over the vocabulary (None: V).

    Row i: (1 - eps) w_t (lse - x'_t) off by w_t (Delta + delta_t + 2u a_t); the smoothing sum
    S = sum_j w_j (lse - x'_j), which a kernel may form as W lse - sum w_j x'_j, off by
    W Delta + sum w_j delta_j + gamma(depth + 2) (S + W |lse| + sum w_j |x'_j|); z lse^2 off by
    z (2 |lse| Delta + Delta^2 + 3u lse^2); combining them 4u each. "sum" adds gamma(N) sum |loss_i|;
    "mean" divides by W_t, itself a sum of N weights: + |mean| (gamma(N) + 2u)."""
    fmt = format_of(fmt)
    cfg = _config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction,
                  weight=weight, z_loss=z_loss, softcap=softcap)
    if oracle is None:
        oracle = cross_entropy_oracle(logits, target, fmt, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                      reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)
    r = np.asarray(oracle, dtype=np.float64)
    model = _Model(cfg, depth)
    per, err = np.zeros(cfg.N), np.zeros(cfg.N)
    for i in np.flatnonzero(model.counted):
        per[i], err[i] = model.row_loss(int(i))
    ok = np.isfinite(per) & np.isfinite(err)
    per, err = np.where(ok, per, 0.0), np.where(ok, err, 0.0)
    if reduction == "none":
        pre = err if not cfg.one_row else err[:1].reshape(())
        return finish(pre, r.reshape(np.shape(pre)), fmt)
    total = float(err.sum()) + float(gamma(cfg.N)) * float(np.abs(per).sum())
    if reduction == "mean":
        Wt = float(cfg.Wt)
        if Wt == 0:
            return np.zeros(())
        total = total / Wt + abs(float(per.sum()) / Wt) * (float(gamma(cfg.N)) + 2 * U)
    return finish(np.array(total), r.reshape(()), fmt)


def cross_entropy_grad_error(logits, target, fmt: FormatLike, grad_output=1.0, *, ignore_index: int = -100,
                             label_smoothing: float = 0.0, reduction: str = "mean", weight=None, z_loss: float = 0.0,
                             softcap: float | None = None, depth: int | None = None,
                             oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |grad^ - r| per element of d loss / d logits (`fmt`: the logits' format).

    dx_j = g C_j B_j with B_j = (1 - eps) w_t (p_j - [j = t]) + (eps / V)(W p_j - w_j) + 2 z lse p_j:
    p^_j off by p_j rho_j, rho_j = Delta + delta_j + 3u (d_j + L) + 4u (the exponent x'_j - lse^ and its
    roundings, ex2.approx); p_j - 1 one rounding; W's sum depth u W p_j; the terms combined 4u each;
    p_j flushed below 2^-126; the chain factor (softcap) C_j as above; the products 3u; for "mean" the
    scale g / W_t off by gamma(N + 2). A fused kernel may store the gradient of a unit grad_output in the
    logits' dtype and scale it afterwards (Liger's, flash-attn's, ours under autograd): a 16-bit
    gradient then rounds twice, one ulp more where grad_output is not 1."""
    fmt = format_of(fmt)
    cfg = _config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction,
                  weight=weight, z_loss=z_loss, softcap=softcap)
    if oracle is None:
        oracle = cross_entropy_grad_oracle(logits, target, fmt, grad_output, ignore_index=ignore_index,
                                           label_smoothing=label_smoothing, reduction=reduction, weight=weight,
                                           z_loss=z_loss, softcap=softcap)
    r = np.asarray(oracle, dtype=np.float64).reshape(cfg.N, cfg.V)
    g = np.atleast_1d(np.asarray(torch.as_tensor(grad_output).detach().cpu().double().numpy()
                                 if isinstance(grad_output, torch.Tensor) else grad_output, dtype=np.float64)).reshape(-1)
    model = _Model(cfg, depth)
    pre = np.zeros((cfg.N, cfg.V))
    Wt = float(cfg.Wt)
    for i in np.flatnonzero(model.counted):
        if reduction == "none":
            gi = float(g[i] if g.size == cfg.N else g[0])
        elif reduction == "sum":
            gi = float(g[0])
        elif Wt == 0:
            continue
        else:
            gi = float(g[0]) / Wt
        row = model.grad_row(int(i), gi)
        if reduction == "mean":
            row = row + float(gamma(cfg.N + 2)) * np.abs(r[i])
        pre[i] = row
    pre = np.where(np.isfinite(pre), pre, 0.0)
    out = finish(pre, r, fmt)
    if fmt != FP32:  # stored in 16 bits for a unit grad_output, then scaled: a second rounding
        scaled = (g.reshape(-1) != 1.0) if reduction == "none" and g.size == cfg.N else np.full(cfg.N, g[0] != 1.0)
        out = out + np.where(scaled[:, None] & (out > 0), ulp_of(np.abs(np.nan_to_num(r)) + pre, fmt), 0.0)
    return out[0] if cfg.one_row else out
