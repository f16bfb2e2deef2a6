"""The templates of the known-bad training kernels (training_bugs.py): small Triton kernels in the style
fused cross-entropy, softmax-backward and log-softmax kernels use, each with a `BUG` constexpr switching
exactly one defect on (BUG = 0 is the correct kernel, the "fixed twin"), and their launchers.

* `_ce_kernel`: one program a row walks the vocabulary in chunks of 64 with an online (max, sum), then
  a second walk for the smoothing sum and the gradient (weights, ignore_index, label smoothing, z-loss,
  softcap, a per-row or scalar grad_output); a row's loss combined in float64, reduced on the host.
* `_bwd_kernel`: softmax backward (dx = y (dy - sum y dy)) or log-softmax backward (dx = dy - exp(logp)
  sum dy), a whole row a program, in float64.
* `_log_softmax_kernel`: a whole row a program, (x - m) - log sum exp(x - m).

The launchers validate lightly (one line for a bad target) and detach their inputs: a checker calls them
with logits requiring grad, and they have no autograd (their gradient is `*_with_grad`).
"""
from __future__ import annotations

import torch

from flashcheck import kernels  # noqa: F401  (the interpreter switch, before triton)
from flashcheck.kernels._common import bf16_as_bits, kernel_view, load_f32, load_f32_zero, store_f32, tl, triton
from flashcheck.kernels.attention import _round_bf16_in_f32

# Cross-entropy bug switches (constexpr values).
CE_NONE, BF16_TRUE_CLASS, GRAD_OUTPUT_0, WRAP_OFFSETS, ALL_IGNORED_ZERO, IGNORED_GRAD, SMOOTH_MASK_MUL = 0, 1, 2, 3, 4, 5, 6
SOFTCAP_CHAIN, ZLOSS_GRAD, MEAN_BY_COUNT, TARGET_STRIDE, LSE_LOW_PRECISION, GRAD_INTO_LOGITS = 7, 8, 9, 10, 11, 12
INPLACE_STRIDES = 13
#: Where WRAP_OFFSETS wraps a row's element offset: 2^31 on a GPU (int32 offsets), a small stand-in
#: here so that the CPU's inputs reach it (a wrapped row is read from inside the buffer: a wrong
#: answer, not a fault).
FAKE_INT32_LIMIT = 256
CHUNK = 64
_P16 = {torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _round16(v, P16: tl.constexpr):
    """v rounded to the 16-bit input format (P16: 1 fp16, 2 bf16), as fp32; fp32 input: v."""
    if P16 == 1:
        return v.to(tl.float16).to(tl.float32)
    elif P16 == 2:
        return _round_bf16_in_f32(v)
    else:
        return v


@triton.jit
def _capped(x, cap, SOFTCAP: tl.constexpr):
    """c tanh(x / c) from exp (1 - 2 / (e^{2x/c} + 1): +-1 at +-inf, no NaN past 88), and tanh."""
    if SOFTCAP:
        t = 1.0 - 2.0 / (tl.exp(2.0 * (x / cap)) + 1.0)
        return cap * t, t
    else:
        return x, x


@triton.jit(do_not_specialize=["V", "sxm", "sxn", "st", "sgm", "sgn", "IGNORE", "gs"])
def _ce_kernel(x_ptr, t_ptr, w_ptr, go_ptr, loss_ptr, g_ptr, V, sxm, sxn, st, sgm, sgn, IGNORE, gs,
               eps, z, cap, W, BLOCK: tl.constexpr, X_BITS: tl.constexpr, G_BITS: tl.constexpr, HAS_W: tl.constexpr,
               SMOOTH: tl.constexpr, ZLOSS: tl.constexpr, SOFTCAP: tl.constexpr, GRAD: tl.constexpr,
               P16: tl.constexpr, LIMIT: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_off = row * sxm
    g_off = row * sgm
    if BUG == 3:  # WRAP_OFFSETS: the row offsets wrap (int32 arithmetic past 2^31 elements)
        x_off = x_off % LIMIT
        g_off = g_off % LIMIT
    if BUG == 10:  # TARGET_STRIDE: the labels read as if contiguous
        t = tl.load(t_ptr + row)
    else:
        t = tl.load(t_ptr + row * st)
    ignored = t == IGNORE
    ts = tl.where(ignored, 0, t)
    lanes = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for k in range(0, tl.cdiv(V, BLOCK)):
        cols = k * BLOCK + lanes
        mask = cols < V
        x, _ = _capped(load_f32(x_ptr + x_off + cols * sxn, mask, X_BITS), cap, SOFTCAP)
        x = tl.where(mask, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    lse = m + tl.log(l)
    if BUG == 11:  # LSE_LOW_PRECISION: lse kept in a bf16 buffer (stored for the backward), whatever the logits'
        lse = _round_bf16_in_f32(lse)
    xt, _ = _capped(load_f32(x_ptr + x_off + ts * sxn, ts < V, X_BITS), cap, SOFTCAP)
    wt = 1.0
    if HAS_W:
        wt = tl.load(w_ptr + ts).to(tl.float32)
    smooth = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    g = tl.load(go_ptr + row * gs)
    if BUG == 2:  # GRAD_OUTPUT_0: every row scaled by grad_output[0]
        g = tl.load(go_ptr)
    for k in range(0, tl.cdiv(V, BLOCK)):
        cols = k * BLOCK + lanes
        mask = cols < V
        x, th = _capped(load_f32(x_ptr + x_off + cols * sxn, mask, X_BITS), cap, SOFTCAP)
        if HAS_W:
            wj = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            wj = tl.where(mask, 1.0, 0.0)
        if SMOOTH:
            term = wj * (lse - x)
            if BUG == 6:  # SMOOTH_MASK_MUL: masked (-inf) logits dropped by a 0/1 factor: inf * 0 = NaN
                term = term * (x != float("-inf")).to(tl.float32)
            smooth += tl.sum(tl.where(mask, term, 0.0), axis=0)
        if GRAD:
            p = tl.exp(x - lse)
            onehot = (cols == ts).to(tl.float32)
            pt = p
            if BUG == 1:  # BF16_TRUE_CLASS: p written through the 16-bit logits buffer before p - 1
                pt = _round16(p, P16)
            b = (1.0 - eps) * wt * (tl.where(cols == ts, pt, p) - onehot)
            if SMOOTH:
                b += eps / V * (W * p - wj)
            if ZLOSS and BUG != 8:  # ZLOSS_GRAD: the z-loss's 2 z lse p term missing
                b += 2.0 * z * lse * p
            if SOFTCAP and BUG != 7:  # SOFTCAP_CHAIN: the chain factor 1 - tanh^2 missing
                b = b * (1.0 - th * th)
            grad = g * b
            if BUG != 5:  # IGNORED_GRAD: an ignored row's gradient left as computed
                grad = tl.where(ignored, 0.0, grad)
            if BUG == 13:  # INPLACE_STRIDES: the gradient written as if the logits were contiguous
                store_f32(g_ptr + row * V + cols, grad, mask, G_BITS)
            else:
                store_f32(g_ptr + g_off + cols * sgn, grad, mask, G_BITS)
    a = (m.to(tl.float64) - xt.to(tl.float64)) + tl.log(l).to(tl.float64)  # lse - x_t, no fp32 overflow
    if BUG == 11:
        a = lse.to(tl.float64) - xt.to(tl.float64)
    loss = (1.0 - eps) * wt * a
    if SMOOTH:
        loss += eps / V * smooth.to(tl.float64)
    if ZLOSS:
        loss += z * lse.to(tl.float64) * lse.to(tl.float64)
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))


def ce_launch(logits: torch.Tensor, target: torch.Tensor, bug: int, *, ignore_index: int = -100,
              label_smoothing: float = 0.0, reduction: str = "mean", weight: torch.Tensor | None = None,
              z_loss: float = 0.0, softcap: float | None = None, inplace_backward: bool = False,
              grad_output=None, want_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, gradient or None): the loss in the logits' dtype, reduced in float64 on the host."""
    logits = logits.detach()
    if logits.dim() != 2 or logits.dtype not in _P16 and logits.dtype != torch.float32:
        raise TypeError(f"logits must be 2-D fp16/bf16/fp32, got {tuple(logits.shape)} {logits.dtype}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction {reduction!r}")
    n, v = logits.shape
    bad = (target != ignore_index) & ((target < 0) | (target >= v))
    if bool(bad.any()):
        raise ValueError(f"target {int(target[bad][0])} outside [0, {v})")
    w64 = None if weight is None else weight.detach().double()
    counted = target != ignore_index
    wt = (torch.where(counted, w64[target.clamp(0, v - 1)], 0.0).sum() if w64 is not None
          else counted.sum().double())
    denom = counted.sum().double() if bug == MEAN_BY_COUNT else wt
    go = torch.ones(n if reduction == "none" else 1, dtype=torch.float64) if grad_output is None else \
        torch.as_tensor(grad_output).detach().double().reshape(-1)
    if reduction == "mean":
        go = go / denom
    grad = None
    if want_grad:
        grad = logits if (inplace_backward or bug == GRAD_INTO_LOGITS) else torch.empty((n, v), dtype=logits.dtype)
    rows = torch.zeros(n, dtype=torch.float64, device=logits.device)
    if n:
        g = grad if grad is not None else logits
        _ce_kernel[(n,)](kernel_view(logits), target, w64.float() if w64 is not None else go.float(),
                         go.float().contiguous(), rows, kernel_view(g), v, logits.stride(0), logits.stride(1),
                         target.stride(0), g.stride(0), g.stride(1), ignore_index, 1 if go.numel() > 1 else 0,
                         float(label_smoothing), float(z_loss), float(softcap or 1.0),
                         float(w64.sum()) if w64 is not None else float(v),
                         BLOCK=CHUNK, X_BITS=bf16_as_bits(logits.dtype), G_BITS=bf16_as_bits(g.dtype),
                         HAS_W=w64 is not None, SMOOTH=label_smoothing > 0, ZLOSS=z_loss > 0,
                         SOFTCAP=softcap is not None, GRAD=grad is not None, P16=_P16.get(logits.dtype, 0),
                         LIMIT=FAKE_INT32_LIMIT, BUG=bug)
    if reduction == "none":
        return rows.to(logits.dtype), grad
    total = rows.sum()
    if reduction == "mean":
        if bug == ALL_IGNORED_ZERO:
            total = total / denom.clamp(min=1.0)  # "no NaN when every row is ignored": 0 instead of 0/0
        else:
            total = total / denom
    return total.to(logits.dtype), grad


# --------------------------------------------------------------------------------------------
# Softmax and log-softmax backward, log-softmax
# --------------------------------------------------------------------------------------------
SB_NONE, LOG_FORMULA, DY_STRIDES, DX_INTO_DY, CONTIGUOUS_ROWS, SUM_16BIT = 0, 1, 2, 3, 4, 5


@triton.jit(do_not_specialize=["N", "sam", "san", "sdm", "sdn", "sxm", "sxn"])
def _bwd_kernel(a_ptr, d_ptr, x_ptr, N, sam, san, sdm, sdn, sxm, sxn, BLOCK_N: tl.constexpr,
                A_BITS: tl.constexpr, D_BITS: tl.constexpr, X_BITS: tl.constexpr, LOG: tl.constexpr,
                P16: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if BUG == 4:  # CONTIGUOUS_ROWS: both inputs read as if contiguous
        a = load_f32_zero(a_ptr + row * N + cols, mask, A_BITS).to(tl.float64)
        dy = load_f32_zero(d_ptr + row * N + cols, mask, D_BITS).to(tl.float64)
    else:
        a = load_f32_zero(a_ptr + row * sam + cols * san, mask, A_BITS).to(tl.float64)
        if BUG == 2:  # DY_STRIDES: dy read with y's strides
            dy = load_f32_zero(d_ptr + row * sam + cols * san, mask, D_BITS).to(tl.float64)
        else:
            dy = load_f32_zero(d_ptr + row * sdm + cols * sdn, mask, D_BITS).to(tl.float64)
    if LOG:
        s = tl.sum(dy, axis=0)
        if BUG == 5:  # SUM_16BIT: the row's sum of dy kept in the inputs' 16-bit dtype
            s = _round16(s.to(tl.float32), P16).to(tl.float64)
        dx = dy - tl.exp(a) * s
    else:
        if BUG == 1:  # LOG_FORMULA: log-softmax's sum(dy) in place of sum(y dy)
            s = tl.sum(dy, axis=0)
        else:
            s = tl.sum(a * dy, axis=0)
        dx = a * (dy - s)
    store_f32(x_ptr + row * sxm + cols * sxn, dx.to(tl.float32), mask, X_BITS)


def bwd_launch(a: torch.Tensor, dy: torch.Tensor, *, log: bool, bug: int) -> torch.Tensor:
    """dx of softmax (a = y) or log-softmax (a = logp), contiguous (DX_INTO_DY: dy's own storage)."""
    if a.dim() != 2 or a.shape != dy.shape or a.dtype != dy.dtype:
        raise ValueError(f"two 2-D inputs of one shape and dtype, got {tuple(a.shape)} {a.dtype}, "
                         f"{tuple(dy.shape)} {dy.dtype}")
    m, n = a.shape
    dx = dy if bug == DX_INTO_DY else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if a.numel():
        _bwd_kernel[(m,)](kernel_view(a), kernel_view(dy), kernel_view(dx), n, a.stride(0), a.stride(1), dy.stride(0),
                          dy.stride(1), dx.stride(0), dx.stride(1), BLOCK_N=max(16, triton.next_power_of_2(n)),
                          A_BITS=bf16_as_bits(a.dtype), D_BITS=bf16_as_bits(dy.dtype), X_BITS=bf16_as_bits(dx.dtype),
                          LOG=log, P16=_P16.get(a.dtype, 0), BUG=bug)
    return dx


LS_NONE, LOG_OF_SOFTMAX, NO_MAX, ROW_STRIDE_IGNORED, INTO_INPUT = 0, 1, 2, 3, 4


@triton.jit(do_not_specialize=["N", "sxm", "sxn", "sym", "syn"])
def _log_softmax_kernel(x_ptr, y_ptr, N, sxm, sxn, sym, syn, BLOCK_N: tl.constexpr, X_BITS: tl.constexpr,
                        Y_BITS: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if BUG == 3:  # ROW_STRIDE_IGNORED: rows taken N apart whatever the row stride
        x = load_f32(x_ptr + row * N * sxn + cols * sxn, mask, X_BITS)
    else:
        x = load_f32(x_ptr + row * sxm + cols * sxn, mask, X_BITS)
    if BUG == 2:  # NO_MAX: log sum exp(x) without the max: exp overflows past 88.72
        y = x - tl.log(tl.sum(tl.exp(x), axis=0))
    else:
        mx = tl.max(x, axis=0)
        e = tl.exp(x - mx)
        s = tl.sum(e, axis=0)
        if BUG == 1:  # LOG_OF_SOFTMAX: log(softmax): exp(x - m) underflows to 0, log 0 = -inf
            y = tl.log(e / s)
        else:
            y = (x - mx) - tl.log(s)
    store_f32(y_ptr + row * sym + cols * syn, y, mask, Y_BITS)


def log_softmax_launch(x: torch.Tensor, *, bug: int) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D, got {tuple(x.shape)}")
    m, n = x.shape
    y = x if bug == INTO_INPUT else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if x.numel():
        _log_softmax_kernel[(m,)](kernel_view(x), kernel_view(y), n, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                                  BLOCK_N=max(16, triton.next_power_of_2(n)), X_BITS=bf16_as_bits(x.dtype),
                                  Y_BITS=bf16_as_bits(y.dtype), BUG=bug)
    return y
