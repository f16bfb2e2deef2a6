"""Certified, correctly rounded cross-entropy loss and gradient oracles, and the error bounds of
a fused fp32 cross-entropy kernel (the second half of this file, kept apart from the oracles).

Function (torch.nn.functional.cross_entropy, plus two options of fused LLM kernels), per row i
with logits x (V classes), target t, class weights w (1 when absent, W = sum_j w_j), label
smoothing eps, z-loss coefficient z and logit softcap c:

    x'_j   = c tanh(x_j / c)            (softcap; x' = x without it)
    lse    = log sum_j exp(x'_j)
    loss_i = (1 - eps) w_t (lse - x'_t) + (eps / V) sum_j w_j (lse - x'_j) + z lse^2
    reduction "none": loss_i (0 on ignored rows); "sum": sum_i loss_i;
    "mean": sum_i loss_i / sum_i w_{t_i} over the rows not ignored (torch's weighted mean)
    d loss_i / d x_j = g_i sech^2(x_j / c) [ (1 - eps) w_t (p_j - [j = t]) + (eps / V)(W p_j - w_j)
                                             + 2 z lse p_j ],   p = softmax(x')
    g_i = grad_output[i] ("none"), grad_output ("sum"), grad_output / sum_i w_{t_i} ("mean").

Every value is the exact function of the exact inputs, rounded once to `fmt`, certified with
ball arithmetic (`oracles/ball.py`) and Ziv's loop (`rounding.round_certified`); results that are
exact rationals (ties, -inf columns, ignored rows) are computed as Fractions. The loss
lse - x'_t is formed as (x'_m - x'_t) + log1p(T) (two non-negative terms), the target's p_t - 1 as
-(sum of the other terms) / S, so confident rows keep full relative accuracy. Special values and
the torch behaviours matched: docs/NUMERICS.md section 9.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from .ball import ZERO, Ball
from .formats import FP32, Format, format_of, ulp_of
from .log_softmax import _LseRow, as_rows, exact_values, nudged
from .rounding import round_certified, round_fraction

__all__ = [
    "cross_entropy_oracle",
    "cross_entropy_grad_oracle",
    "cross_entropy_loss_bound",
    "cross_entropy_grad_bound",
]

FormatLike = Format | str | torch.dtype
REDUCTIONS = ("none", "mean", "sum")


class _Config:
    def __init__(self, logits, target, *, ignore_index, label_smoothing, reduction, weight, z_loss,
                 softcap):
        x, shape = as_rows(logits)
        if len(shape) not in (1, 2):
            raise ValueError(f"cross_entropy: logits must be (N, V) or (V,), got shape {tuple(shape)}")
        self.one_row = len(shape) == 1
        tg = target.detach().cpu().numpy() if isinstance(target, torch.Tensor) else np.asarray(target)
        tg = np.atleast_1d(tg).astype(np.int64).reshape(-1)
        if tg.shape[0] != x.shape[0]:
            raise ValueError(f"cross_entropy: {tg.shape[0]} targets for {x.shape[0]} rows of logits")
        self.N, self.V = x.shape
        if self.V == 0 and self.N:
            raise ValueError("cross_entropy: logits have no classes (V = 0)")
        if reduction not in REDUCTIONS:
            raise ValueError(f"cross_entropy: reduction {reduction!r}, expected one of {REDUCTIONS}")
        eps = float(label_smoothing)
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"cross_entropy: label_smoothing {eps} outside [0, 1]")
        z = float(z_loss)
        if not (math.isfinite(z) and z >= 0):
            raise ValueError(f"cross_entropy: z_loss {z} must be finite and >= 0")
        if softcap is not None and not (math.isfinite(float(softcap)) and float(softcap) > 0):
            raise ValueError(f"cross_entropy: softcap {softcap} must be finite and > 0")
        self.ignored = tg == int(ignore_index)
        bad = np.flatnonzero(~self.ignored & ((tg < 0) | (tg >= self.V)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"cross_entropy: target {int(tg[i])} of row {i} is outside [0, {self.V}) "
                             f"and is not ignore_index ({ignore_index})")
        if weight is None:
            w = np.ones(self.V)
        else:
            w = exact_values(weight).reshape(-1)
            if w.shape[0] != self.V or not np.isfinite(w).all():
                raise ValueError(f"cross_entropy: weight must hold {self.V} finite values")
        self.x, self.t, self.w = x, tg, w
        self.eps, self.z, self.reduction = eps, z, reduction
        self.c = None if softcap is None else float(softcap)
        self.wq = [Fraction(float(v)) for v in w]
        self.Wq = sum(self.wq, Fraction(0))
        self.epsq = Fraction(eps)
        self.sq = self.epsq / self.V if self.V else Fraction(0)  # eps / V
        # the mean's denominator: sum of w_t over the rows not ignored (exact)
        self.Wt = sum((self.wq[int(tg[i])] for i in np.flatnonzero(~self.ignored)), Fraction(0))
        self.rows: dict[int, _LseRow] = {}

    def special(self, i: int) -> bool:
        """Rows whose loss and gradient are NaN: torch's log_softmax NaN rows (NaN, +inf, all -inf);
        with softcap only NaN (tanh maps +-inf to +-1)."""
        r = self.x[i]
        if np.isnan(r).any():
            return True
        return self.c is None and ((r == np.inf).any() or not np.isfinite(r).any())

    def row(self, i: int) -> _LseRow:
        r = self.rows.get(i)
        if r is None:
            r = self.rows[i] = _LseRow(self.x[i], self.c)
        return r

    # ---- loss of one row -----------------------------------------------------------------------
    def loss_special(self, i: int) -> float | None:
        """The row's loss when it is NaN or infinite, from IEEE arithmetic on placeholders.

        Each lse - x'_j is +inf at a -inf logit (no softcap) and finite (1.0 stands in) elsewhere;
        the combination follows torch's order: nll = w_t (lse - x_t), smooth = sum_j w_j (lse - x_j)
        (only when eps > 0), loss = (1 - eps) nll + (eps / V) smooth + z lse^2. So 0 * inf = NaN
        where torch has it: weight 0 on a -inf target or (with smoothing) on a -inf column,
        eps = 1 with a -inf target."""
        if self.special(i):
            return math.nan
        x, t, w = self.x[i], int(self.t[i]), self.w
        term = np.where((x == -np.inf) & (self.c is None), np.inf, 1.0)
        with np.errstate(invalid="ignore"):
            loss = w[t] * term[t]
            if self.eps > 0:
                loss = (1.0 - self.eps) * loss + (self.eps / self.V) * float((w * term).sum())
            loss = loss + self.z
        return None if math.isfinite(loss) else float(loss)

    def loss_fraction(self, i: int) -> Fraction | None:
        """The row's loss when it is rational: lse rational (a single kept entry, no softcap or
        at 0) and every x' it meets rational."""
        row = self.row(i)
        lse = row.lse_exact()
        if lse is None:
            return None
        t = int(self.t[i])
        # only the entries the loss meets: the target, and with smoothing those of nonzero weight (a
        # -inf among them makes the loss +inf, decided before); a -inf elsewhere is no Fraction
        need = [t] + ([j for j in range(row.n) if self.wq[j] != 0] if self.eps > 0 else [])
        xs = {}
        for j in need:
            xs[j] = row.xprime_exact(j) if math.isfinite(self.x[i][j]) else None
            if xs[j] is None:
                return None
        out = (1 - self.epsq) * self.wq[t] * (lse - xs[t]) + Fraction(self.z) * lse * lse
        if self.eps > 0:
            out += self.sq * sum((self.wq[j] * (lse - xs[j]) for j in need[1:]), Fraction(0))
        return out

    def loss_split(self, i: int) -> tuple[Fraction, int] | None:
        """(q, sign) when the row's loss is q + tau, q exact and tau of that sign too small for any
        working precision (`_LseRow.negligible_L`; with lse = x_m + L):
        q = (1-eps) w_t (x_m - x_t) + (eps/V) sum_j w_j (x_m - x_j) + z x_m^2,
        tau = L ((1-eps) w_t + (eps/V) W + 2 z x_m) + z L^2. None otherwise."""
        row = self.row(i)
        if not row.negligible_L():
            return None
        t, xm = int(self.t[i]), Fraction(row.m)
        q = (1 - self.epsq) * self.wq[t] * (xm - Fraction(float(row.x[t])))
        if self.eps > 0:
            q += self.sq * sum((self.wq[j] * (xm - Fraction(float(row.x[j]))) for j in np.flatnonzero(row.fin)),
                               Fraction(0))
        z = Fraction(self.z)
        a = (1 - self.epsq) * self.wq[t] + self.sq * self.Wq + 2 * z * xm
        return q + z * xm * xm, (1 if a > 0 else -1 if a < 0 else (1 if z else 0))

    def loss_ball(self, i: int, prec: int) -> Ball:
        """(1-eps) w_t (L - d_t) + (eps/V) (W L + sum_j w_j (-d_j)) + z lse^2: every term >= 0
        for non-negative weights, so the sum has no cancellation."""
        row = self.row(i)
        st = row.balls(prec)
        t = int(self.t[i])
        L, d = st["L"], st["d"]
        out = Ball.fraction((1 - self.epsq) * self.wq[t], prec).mul(L.sub(d[t], prec), prec)
        if self.eps > 0:
            sm = Ball.fraction(self.Wq, prec).mul(L, prec)
            for j, dj in d.items():
                if self.wq[j]:
                    sm = sm.add(Ball.fraction(self.wq[j], prec).mul(-dj, prec), prec + 8)
            out = out.add(Ball.fraction(self.sq, prec).mul(sm, prec), prec)
        if self.z:
            lse = st["lse"]
            out = out.add(Ball.fraction(Fraction(self.z), prec).mul(lse.mul(lse, prec), prec), prec)
        return out

    # ---- gradient of one element ---------------------------------------------------------------
    def grad_fraction(self, i: int, j: int, scale: Fraction) -> Fraction | None:
        row = self.row(i)
        ch = row.chain_exact(j)
        if ch is None:
            return None
        if ch == 0:
            return Fraction(0)
        p = row.p_exact(j)
        if p is None:
            return None
        t = int(self.t[i])
        lse = Fraction(0)
        if self.z and p:
            lse = row.lse_exact()
            if lse is None:
                return None
        g = (1 - self.epsq) * self.wq[t] * (p - (1 if j == t else 0))
        g += self.sq * (self.Wq * p - self.wq[j]) + 2 * Fraction(self.z) * lse * p
        return g * ch * scale

    def grad_ball(self, i: int, j: int, scale: Fraction, prec: int) -> Ball:
        """A_j p_j - (eps/V) w_j - [j = t] (1-eps) w_t (1 - p_t), A_j = (eps/V) W + 2 z lse
        (+ (1-eps) w_t when j != t), times the softcap's chain factor and the scale."""
        row = self.row(i)
        t = int(self.t[i])
        p = row.p(j, prec)
        cw = Ball.fraction((1 - self.epsq) * self.wq[t], prec)
        a = Ball.fraction(self.sq * self.Wq, prec)
        if self.z:
            a = a.add(Ball.fraction(2 * Fraction(self.z), prec).mul(row.balls(prec)["lse"], prec), prec)
        if j != t:
            a = a.add(cw, prec)
        g = a.mul(p, prec).sub(Ball.fraction(self.sq * self.wq[j], prec), prec)
        if j == t:
            g = g.sub(cw.mul(row.one_minus_p(t, prec), prec), prec)
        if self.c is not None:
            g = g.mul(row.chain(j, prec), prec)
        return g.mul(Ball.fraction(scale, prec), prec)


def _check_grad_output(cfg: _Config, grad_output) -> list[Fraction]:
    g = exact_values(grad_output).reshape(-1)
    want = cfg.N if cfg.reduction == "none" and not cfg.one_row else 1
    if g.shape[0] != want:
        raise ValueError(f"cross_entropy grad: grad_output needs {want} value(s) for reduction "
                         f"{cfg.reduction!r}, got {g.shape[0]}")
    if not np.isfinite(g).all():
        raise ValueError("cross_entropy grad: grad_output must be finite")
    gq = [Fraction(float(v)) for v in g]
    if cfg.reduction == "none":
        return gq if len(gq) == cfg.N else gq * cfg.N
    if cfg.reduction == "mean":
        return [gq[0] / cfg.Wt] * cfg.N if cfg.Wt else [None] * cfg.N
    return gq * cfg.N


def cross_entropy_oracle(logits, target, fmt: FormatLike, *, ignore_index: int = -100,
                         label_smoothing: float = 0.0, reduction: str = "mean", weight=None,
                         z_loss: float = 0.0, softcap: float | None = None) -> np.ndarray:
    """Correctly rounded cross-entropy loss: shape (N,) for reduction "none", () otherwise.

    logits (N, V) or (V,) (then target is a scalar), any float dtype and strides; target
    integers; weight (V,) exact values; softcap c > 0 applies c tanh(x / c) to the logits first.
    An out-of-range target (not ignore_index) raises ValueError."""
    fmt = format_of(fmt)
    cfg = _Config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                  reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)
    per = np.zeros(cfg.N)
    specials: dict[int, float] = {}
    exact: dict[int, Fraction] = {}
    split: dict[int, tuple[Fraction, int]] = {}
    for i in range(cfg.N):
        if cfg.ignored[i]:
            continue
        s = cfg.loss_special(i)
        if s is not None:
            specials[i] = per[i] = s
            continue
        q = cfg.loss_fraction(i)
        if q is not None:
            exact[i] = q
            per[i] = round_fraction(q, fmt)
        elif (sp := cfg.loss_split(i)) is not None:
            split[i] = sp
            per[i] = nudged(sp[0], sp[1], fmt)
        elif cfg.reduction == "none":
            row = cfg.row(i)
            per[i] = round_certified(lambda prec, i=i: cfg.loss_ball(i, prec).pair(), fmt,
                                     start_prec=row.prec0)
    if cfg.reduction == "none":
        return per[0:1].reshape(()) if cfg.one_row else per
    if cfg.reduction == "mean" and cfg.Wt == 0:
        return np.array(math.nan)
    if specials:
        total = float(np.sum(list(specials.values())))  # inf, -inf or NaN by IEEE rules
        return np.array(total if cfg.reduction == "sum" else total / float(cfg.Wt))
    rest = [i for i in range(cfg.N) if not cfg.ignored[i] and i not in exact]
    qsum = sum(exact.values(), Fraction(0))
    div = cfg.Wt if cfg.reduction == "mean" else Fraction(1)
    if not rest:
        return np.array(round_fraction(qsum / div, fmt))
    signs = {split[i][1] for i in rest if i in split} - {0}
    if all(i in split for i in rest) and len(signs) <= 1:  # q + tau with one sign: as one row's
        q = (qsum + sum((split[i][0] for i in rest), Fraction(0))) / div
        return np.array(nudged(q, signs.pop() if signs else 0, fmt))

    def total_ball(prec: int):
        b = Ball.fraction(qsum, prec)
        for i in rest:
            b = b.add(cfg.loss_ball(i, prec), prec + 8)
        return b.div(Ball.fraction(div, prec), prec).pair()

    p0 = max(cfg.row(i).prec0 for i in rest) + 2 * len(rest).bit_length()
    return np.array(round_certified(total_ball, fmt, start_prec=p0))


def cross_entropy_grad_oracle(logits, target, fmt: FormatLike, grad_output=1.0, *,
                              ignore_index: int = -100, label_smoothing: float = 0.0,
                              reduction: str = "mean", weight=None, z_loss: float = 0.0,
                              softcap: float | None = None) -> np.ndarray:
    """Correctly rounded d loss / d logits, the logits' shape, for the given grad_output (a scalar
    for "mean"/"sum", one value per row for "none"; finite).

    Ignored rows: exactly 0 whatever they hold. NaN rows (see `_Config.special`): NaN. "mean"
    with sum w_t = 0 (every row ignored, or weight 0 on every target): NaN on the rows not
    ignored, as torch."""
    fmt = format_of(fmt)
    cfg = _Config(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                  reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap)
    scales = _check_grad_output(cfg, grad_output)
    out = np.zeros((cfg.N, cfg.V))
    for i in range(cfg.N):
        if cfg.ignored[i]:
            continue
        scale = scales[i]
        if scale is None or cfg.special(i):
            out[i] = math.nan
            continue
        if scale == 0:
            continue
        row = cfg.row(i)
        for j in range(cfg.V):
            q = cfg.grad_fraction(i, j, scale)
            if q is not None:
                out[i, j] = round_fraction(q, fmt)
            else:
                out[i, j] = round_certified(lambda prec, j=j: cfg.grad_ball(i, j, scale, prec).pair(), fmt,
                                            start_prec=row.prec0)
    return out[0] if cfg.one_row else out


# =================================================================================================
# Error bounds of a fused fp32 cross-entropy kernel (not oracles: tolerances, docs/NUMERICS.md 9.4)
# =================================================================================================
#
# Kernel model (u = 2^-24; logits exact in fp32): one program per row walks the vocabulary in
# n_chunks chunks of `block` columns, keeping an online (m, l): m_c = max(m_{c-1}, chunk max),
# l_c = l_{c-1} exp(m_{c-1} - m_c) + sum_chunk exp(x_j - m_c) (a tree of depth ceil(log2 block)),
# exponentials as exp2(fl(fl(x - m) * fl(log2 e))) (ex2.approx, 2 ulp = 4u); then
# lse = m + fl(ln 2) lg2(l) (lg2.approx: 2^-22 absolute in log2 units), loss = fl(lse - x_t),
# grad_j = fl(fl(exp(x_j - lse)) - [j = t]) * g.  d_j = m - x_j, p the exact softmax, L = log S.
#   term j: exponent off by u d_j (subtraction) + 2u d_j (log2 e and the product) and, through
#           the rescales, by 3u (m - m_b) <= 3u d_j: 6u d_j; ex2 4u per call, one call for the
#           term and one per later rescale (<= n_chunks), each rescale product u: relative
#           theta_j <= u (6 d_j + 5 n_chunks + 4)
#   l:      l^ = S (1 + sigma), |sigma| <= sum_j p_j theta_j + D u, D = ceil(log2 block) + n_chunks
#           (the tree inside a chunk, one add per chunk): |sigma| <= u (6 E + 5 n_chunks + 4 + D),
#           E = sum_j p_j d_j
#   lse:    |log l^ - log S| <= 1.01 |sigma|; lg2.approx 2^-22 ln 2; m + fl(ln2) lg2(l) three
#           roundings: 3u (|m| + L):  Delta_lse = 1.01 |sigma| + 2^-22 ln 2 + 3u (|m| + L)
#   loss:   fl(lse^ - x_t) adds u |loss|: |loss^ - loss| <= Delta_lse + u |loss| + 4u (slack),
#           an absolute bound: next to 0 (confident rows) it is a large relative error, which is
#           the cancellation the oracle avoids.
#   grad:   p^_j = exp2(fl(fl(x_j - lse^) log2 e)): exponent off by Delta_lse + 3u |x_j - lse|,
#           ex2 4u: |p^_j - p_j| <= p_j (Delta_lse + 3u (d_j + L) + 4u) (first order);
#           fl(p^ - onehot) and the product with g (or g / W_t: one more rounding) 3u |p - onehot|;
#           |grad^ - grad| <= |g| (p_j rho_j + 3u |p_j - [j = t]|) + 4u slack.
#   output: fp32 output is the kernel's value: half an ulp for the oracle's own rounding;
#           fp16/bf16 output rounds once more: one ulp. Rows whose oracle value is special get 0.


def _row_stats(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Float64 p, d = m - x, L = log S, E = sum p d and m per row (first-order bound inputs)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        xf = np.where(np.isnan(x), -np.inf, x)
        m = xf.max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        d = np.where(np.isfinite(xf), m - xf, 0.0)
        e = np.where(np.isfinite(xf), np.exp(-d), 0.0)
        S = np.maximum(e.sum(axis=1, keepdims=True), 1.0)
        p = e / S
        return p, d, np.log(S)[:, 0], (p * d).sum(axis=1), m[:, 0]


def _lse_error(x: np.ndarray, n_chunks: int, block: int) -> tuple[np.ndarray, ...]:
    u = 2.0**-24
    p, d, L, E, m = _row_stats(x)
    D = math.ceil(math.log2(max(block, 1))) + n_chunks
    sigma = u * (6 * E + 5 * n_chunks + 4 + D)
    delta = 1.01 * sigma + 2.0**-22 * math.log(2) + 3 * u * (np.abs(m) + L)
    return delta, p, d, L


def cross_entropy_loss_bound(logits, target, fmt: FormatLike, n_chunks: int, *, block: int | None = None,
                             oracle: np.ndarray | None = None, ignore_index: int = -100) -> np.ndarray:
    """Allowed |loss^_i - r_i| per row (reduction "none", no smoothing/z-loss/softcap), r the
    correctly rounded oracle; `block` defaults to ceil(V / n_chunks). Ignored rows and special
    rows (NaN, inf) must match exactly: bound 0."""
    fmt = format_of(fmt)
    x, _ = as_rows(logits)
    N, V = x.shape
    block = block or max(1, -(-V // max(n_chunks, 1)))
    u = 2.0**-24
    if oracle is None:
        oracle = cross_entropy_oracle(logits, target, fmt, reduction="none", ignore_index=ignore_index)
    r = np.asarray(oracle)
    r = np.atleast_1d(r)
    delta, *_ = _lse_error(x, n_chunks, block)
    rr = np.where(np.isfinite(r), np.abs(r), 0.0)
    pre = delta + u * rr + 4 * u
    last = ulp_of(rr + pre, fmt) * (0.5 if fmt == FP32 else 1.0)
    tg = np.atleast_1d(target.cpu().numpy() if isinstance(target, torch.Tensor) else np.asarray(target))
    return np.where(np.isfinite(r) & (tg.astype(np.int64) != ignore_index), pre + last, 0.0)


def cross_entropy_grad_bound(logits, target, fmt: FormatLike, n_chunks: int, *, block: int | None = None,
                             grad_scale: float = 1.0, oracle: np.ndarray | None = None,
                             ignore_index: int = -100) -> np.ndarray:
    """Allowed |grad^_ij - r_ij| per element (no smoothing/z-loss/softcap) for a gradient scale
    g (grad_output, or grad_output / W_t for "mean"); ignored rows and NaN rows: 0."""
    fmt = format_of(fmt)
    x, _ = as_rows(logits)
    N, V = x.shape
    block = block or max(1, -(-V // max(n_chunks, 1)))
    u = 2.0**-24
    tg = target.cpu().numpy() if isinstance(target, torch.Tensor) else np.asarray(target)
    tg = np.atleast_1d(tg).astype(np.int64)
    ign = tg == ignore_index
    delta, p, d, L = _lse_error(x, n_chunks, block)
    onehot = np.zeros((N, V))
    onehot[np.arange(N)[~ign], tg[~ign]] = 1.0
    rho = delta[:, None] + 3 * u * (d + L[:, None]) + 4 * u
    g = abs(float(grad_scale))
    pre = g * (p * rho + 3 * u * np.abs(p - onehot)) + 4 * u * g
    if oracle is None:
        oracle = cross_entropy_grad_oracle(logits, target, fmt, grad_scale, reduction="sum",
                                           ignore_index=ignore_index)
    r = np.asarray(oracle)
    rr = np.where(np.isfinite(r), np.abs(r), 0.0)
    last = ulp_of(rr + pre, fmt) * (0.5 if fmt == FP32 else 1.0)
    out = pre + last
    out[ign] = 0.0
    return np.where(np.isfinite(r), out, 0.0)
