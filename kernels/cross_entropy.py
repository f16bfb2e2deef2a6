"""Fused cross-entropy in Triton: loss and gradient in one launch (issue 52; kernels in
kernels/cross_entropy_kernels.py, arithmetic and bounds in docs/NUMERICS.md 9.4 and 9.7).

`cross_entropy(logits, target, ...)` has torch.nn.functional.cross_entropy's semantics for the
arguments they share (2-D logits (N, V), int64/int32 targets (N,), class weights, ignore_index, label
smoothing, reductions "none"/"mean"/"sum"; a weighted mean divides by sum of w[t] over the counted rows;
a mean over none is NaN), plus a z-loss z lse^2 per counted row (unweighted) and a logit softcap
c tanh(x / c) (oracles/cross_entropy.py's docstring is the function). When logits require grad under
grad mode, the launch also writes d loss / d logits for a unit grad_output (the mean's 1 / sum w[t]
folded in) and the autograd backward multiplies it by grad_output in place (a kernel; a row whose
grad_output is exactly 1 is not touched). With `inplace_backward=True` that gradient is written into
the logits' own buffer: the logits are overwritten by the call (as Liger's and flash-attn's kernels do;
only safe when nothing else needs them, e.g. the output of a linear layer whose backward needs its
inputs, not its output). In 16-bit the autograd gradient is rounded twice when grad_output is not 1
(stored, then scaled); `cross_entropy_with_grad` (explicit, no autograd) folds grad_output in and
rounds once.

Host work: the targets are checked (a target outside [0, V) that is not ignore_index is a ValueError
naming the first such row) and the weights checked finite with one device-to-host copy of a few numbers
per call (a sync). A row's loss is combined in fp64 in the kernel (fp32 everywhere else), the
reductions are float64 sums of those, rounded once to the logits' dtype. The logits and targets are
read with their strides (no copies); the weights are copied to fp32 (V values, exactly); the gradient
is contiguous (or the logits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ._common import (
    INTERPRET, LOG2E, bf16_as_bits, by16, check_float, check_knob, check_tensor, has_internal_overlap, kernel_view,
    triton,
)
from ._runtime import cdiv, launch, on_input_device
from .cross_entropy_kernels import _ce_kernel, _ce_scale_kernel
from .softmax import UNFUSED  # every rounding the bounds count is the source's

REDUCTIONS = ("none", "mean", "sum")
# Chunk of the vocabulary a program walks (a power of two): on the GPU a 128K vocabulary is 32 chunks
# of 4096 per walk; under the interpreter 128, so CPU-sized rows of a few hundred take several chunks.
BLOCK_V = 128 if INTERPRET else 4096
SCALE_BLOCK = 128 if INTERPRET else 4096


@dataclass(frozen=True)
class CEConfig:
    block: int  # columns a chunk (decides the bits)
    num_warps: int

    def n_chunks(self, v: int) -> int:
        return max(1, cdiv(v, self.block))


def ce_config(v: int, block_v: int | None = None) -> CEConfig:
    """The launch's chunk and warps for a vocabulary of v; block_v (a power of two >= 16) overrides."""
    block = block_v or max(16, min(BLOCK_V, triton.next_power_of_2(max(v, 1))))
    return CEConfig(block, 1 if INTERPRET else max(1, min(16, block // 256)))


@dataclass(frozen=True)
class _Options:
    ignore_index: int
    label_smoothing: float
    reduction: str
    z_loss: float
    softcap: float | None
    inplace_backward: bool
    block_v: int | None


def _options(ignore_index, label_smoothing, reduction, z_loss, softcap, inplace_backward, block_v) -> _Options:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, not {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} is not one of {REDUCTIONS}")
    eps, z = float(label_smoothing), float(z_loss)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (math.isfinite(z) and z >= 0.0):
        raise ValueError(f"z_loss must be finite and >= 0, got {z_loss}")
    if softcap is not None and not (math.isfinite(float(softcap)) and float(softcap) > 0.0):
        raise ValueError(f"softcap must be None or finite and > 0, got {softcap}")
    check_knob("block_v", block_v, lo=16, pow2=True)
    return _Options(int(ignore_index), eps, reduction, z, None if softcap is None else float(softcap),
                    bool(inplace_backward), block_v)


def _check_inputs(logits, target, weight, opts: _Options) -> None:
    """One line for each bad input, before any launch (the tensors' requires_grad is the caller's)."""
    with torch.no_grad():  # check_tensor refuses grad-requiring tensors under grad mode; autograd is ours
        check_float("logits", logits)
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D (N, V), got {logits.dim()}-D with shape {tuple(logits.shape)}")
        check_tensor("target", target)
        if target.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"target has dtype {target.dtype}; supported: int64, int32")
        if tuple(target.shape) != (logits.shape[0],):
            raise ValueError(f"target has shape {tuple(target.shape)}, expected ({logits.shape[0]},)")
        if weight is not None:
            check_float("weight", weight)
            if tuple(weight.shape) != (logits.shape[1],):
                raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({logits.shape[1]},)")
        for name, t in (("target", target), ("weight", weight)):
            if t is not None and t.device != logits.device:
                raise ValueError(f"{name} is on {t.device}, logits on {logits.device}")
    if logits.shape[1] == 0 and logits.shape[0]:
        raise ValueError("logits have no classes (V = 0)")
    if opts.inplace_backward and has_internal_overlap(logits):
        raise ValueError(f"inplace_backward needs logits with distinct elements (stride {logits.stride()})")


def _host_checks(target, weight, opts: _Options, v: int) -> None:
    """Targets in [0, V) or ignore_index, weights finite: one copy of a few numbers to the host."""
    flags = []
    if target.numel():
        bad = (target != opts.ignore_index) & ((target < 0) | (target >= v))
        flags += [bad.any(), bad.to(torch.int8).argmax()]
    if weight is not None:
        flags.append(~torch.isfinite(weight).all())
    if not flags:
        return
    got = torch.stack([f.to(torch.int64) for f in flags]).tolist()
    if target.numel() and got[0]:
        i = got[1]
        raise ValueError(f"target {int(target[i])} of row {i} is outside [0, {v}) and is not ignore_index "
                         f"({opts.ignore_index})")
    if weight is not None and got[-1]:
        raise ValueError("weight holds a NaN or an infinity")


def _counted_weight(target, w32, opts: _Options, v: int) -> torch.Tensor:
    """sum of w[t] over the rows not ignored (the mean's divisor), float64 on the device."""
    counted = target != opts.ignore_index
    if w32 is None:
        return counted.sum().to(torch.float64)
    return torch.where(counted, w32[target.clamp(0, max(v - 1, 0)).long()], 0.0).to(torch.float64).sum()


def _launch(logits, target, w32, opts: _Options, grad_scale: torch.Tensor | None):
    """Per-row fp64 losses, and with grad_scale (fp32 (N,) or (1,)) the gradient g * d loss_i / d x."""
    n, v = logits.shape
    cfg = ce_config(v, opts.block_v)
    per_row = torch.empty(n, dtype=torch.float64, device=logits.device)
    grad = None
    if grad_scale is not None:
        grad = logits.detach() if opts.inplace_backward else torch.empty((n, v), dtype=logits.dtype,
                                                                          device=logits.device)
    if n == 0:
        return per_row, grad
    g = grad if grad is not None else logits  # never written without GRAD
    (v_, sxm, sgm), mul = by16(v, logits.stride(0), g.stride(0))
    eps, c = opts.label_smoothing, opts.softcap
    cap = (c, 1.0 / c, 2.0 * LOG2E / c) if c is not None else (1.0, 1.0, 1.0)
    prm = torch.tensor([1.0 - eps, eps / v, opts.z_loss, *cap], dtype=torch.float64).to(logits.device)
    gs = grad_scale if grad_scale is not None else torch.ones(1, dtype=torch.float32, device=logits.device)
    launch(_ce_kernel, (n,),
           (kernel_view(logits.detach()), target, w32 if w32 is not None else gs, gs, prm, per_row, kernel_view(g),
            v_, sxm, logits.stride(1), target.stride(0), sgm, g.stride(1), 1 if gs.numel() > 1 else 0,
            opts.ignore_index),
           dict(BLOCK=cfg.block, LOG2B=cfg.block.bit_length() - 1, X_BITS=bf16_as_bits(logits.dtype),
                G_BITS=bf16_as_bits(g.dtype), MUL=mul, HAS_W=w32 is not None, SMOOTH=eps > 0.0,
                ZLOSS=opts.z_loss > 0.0, SOFTCAP=c is not None, GRAD=grad is not None, num_warps=cfg.num_warps,
                **UNFUSED))
    return per_row, grad


def _reduce(per_row: torch.Tensor, wt: torch.Tensor, reduction: str, dtype: torch.dtype) -> torch.Tensor:
    if reduction == "none":
        return per_row.to(dtype)
    total = per_row.sum()
    if reduction == "mean":
        total = torch.where(wt == 0, math.nan, total / wt)  # torch: 0/0 = NaN, also weight 0 on every target
    return total.to(dtype)


def _scale_of(grad_output, n: int, reduction: str, wt: torch.Tensor, device) -> torch.Tensor:
    """The fp32 factor of each row's gradient: grad_output (per row for "none"), / sum w[t] for "mean".
    A given grad_output must be finite (a sync: checkers' path only)."""
    if grad_output is None:
        go = torch.ones(n if reduction == "none" else 1, dtype=torch.float64, device=device)
    else:
        go = torch.as_tensor(grad_output, device=device).detach().to(torch.float64).reshape(-1)
        want = n if reduction == "none" else 1
        if go.numel() != want:
            raise ValueError(f"grad_output needs {want} value(s) for reduction {reduction!r}, got {go.numel()}")
        if not bool(torch.isfinite(go).all()):
            raise ValueError("grad_output must be finite")
    if reduction == "mean":
        go = torch.where(wt == 0, math.nan, go / wt)
    return go.to(torch.float32).contiguous()


def _prepare(logits, target, weight, opts: _Options):
    _check_inputs(logits, target, weight, opts)
    v = logits.shape[1]
    w32 = None if weight is None else weight.detach().to(torch.float32).contiguous()  # V values, exact
    _host_checks(target, w32, opts, v)
    return w32, _counted_weight(target, w32, opts, v)


class _CrossEntropyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, opts):  # noqa: ANN001, ANN205
        w32, wt = _prepare(logits, target, weight, opts)
        per_row, grad = _launch(logits, target, w32, opts, _scale_of(None, logits.shape[0], opts.reduction, wt,
                                                                      logits.device))
        ctx.save_for_backward(grad)
        ctx.reduction, ctx.used = opts.reduction, False
        return _reduce(per_row, wt, opts.reduction, logits.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):  # noqa: ANN001, ANN205
        if ctx.used:
            raise RuntimeError("cross_entropy's gradient is scaled in place: its backward runs once")
        ctx.used = True
        (grad,) = ctx.saved_tensors
        scale_rows(grad, grad_loss.detach().to(torch.float32).reshape(-1).contiguous())
        return grad, None, None, None


@on_input_device
def scale_rows(grad: torch.Tensor, go: torch.Tensor) -> torch.Tensor:
    """grad (N, V) *= go, one fp32 factor per row (go (N,)) or for all (go (1,)), in place; rows whose
    factor is exactly 1 are left untouched."""
    n, v = grad.shape
    if grad.numel() == 0:
        return grad
    (v_, sgm), mul = by16(v, grad.stride(0))
    launch(_ce_scale_kernel, (n, cdiv(v, SCALE_BLOCK)), (kernel_view(grad), go, v_, sgm, grad.stride(1),
                                                        1 if go.numel() > 1 else 0),
           dict(BLOCK=SCALE_BLOCK, G_BITS=bf16_as_bits(grad.dtype), MUL=mul, num_warps=1 if INTERPRET else 8))
    return grad


@on_input_device
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None,
                  ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                  z_loss: float = 0.0, softcap: float | None = None, inplace_backward: bool = False,
                  block_v: int | None = None) -> torch.Tensor:
    """Cross-entropy of logits (N, V) fp16/bf16/fp32 (any strides) against target (N,) int64/int32, in
    the logits' dtype: (N,) for reduction "none", () otherwise. Differentiable in the logits (not in
    the weights) when they require grad under grad mode; module docstring for the options."""
    opts = _options(ignore_index, label_smoothing, reduction, z_loss, softcap, inplace_backward, block_v)
    if isinstance(logits, torch.Tensor) and logits.requires_grad and torch.is_grad_enabled():
        return _CrossEntropyFn.apply(logits, target, weight, opts)
    w32, wt = _prepare(logits, target, weight, opts)
    per_row, _ = _launch(logits, target, w32, opts, None)
    return _reduce(per_row, wt, opts.reduction, logits.dtype)


@on_input_device
def cross_entropy_with_grad(logits: torch.Tensor, target: torch.Tensor, grad_output=None, *,
                            weight: torch.Tensor | None = None, ignore_index: int = -100,
                            label_smoothing: float = 0.0, reduction: str = "mean", z_loss: float = 0.0,
                            softcap: float | None = None, inplace_backward: bool = False,
                            block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logits times grad_output) without autograd, one launch, the gradient rounded
    once: for checkers. grad_output: None (1), a number or tensor, (N,) values for "none". With
    inplace_backward the gradient is written into (and returned as) the logits."""
    opts = _options(ignore_index, label_smoothing, reduction, z_loss, softcap, inplace_backward, block_v)
    w32, wt = _prepare(logits, target, weight, opts)
    scale = _scale_of(grad_output, logits.shape[0], opts.reduction, wt, logits.device)
    per_row, grad = _launch(logits, target, w32, opts, scale)
    loss = _reduce(per_row, wt, opts.reduction, logits.dtype)
    return loss, (logits if opts.inplace_backward else grad)


def ce_n_chunks(v: int, block_v: int | None = None) -> tuple[int, int]:
    """(n_chunks, block) of a launch over v classes: the bounds' blocking (NUMERICS.md 9.4)."""
    cfg = ce_config(v, block_v)
    return cfg.n_chunks(v), cfg.block


__all__ = ["cross_entropy", "cross_entropy_with_grad", "scale_rows", "ce_config", "ce_n_chunks", "CEConfig",
           "BLOCK_V", "REDUCTIONS"]
