"""Torch references for the training families, registered until their Triton kernels land (branch
k52): each computes in fp32 or float64 from the exact inputs and rounds once to the input's dtype, so
it meets the families' derived bounds and lets the suites run."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def softmax_backward_reference(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    # float64: fp32 products near the format's max overflow where the exact result is finite
    y64, dy64 = y.double(), dy.double()
    return (y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))).to(y.dtype)


def log_softmax_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.float(), -1).to(x.dtype)


def log_softmax_backward_reference(logp: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dy64 = dy.double()
    return (dy64 - torch.exp(logp.double()) * dy64.sum(-1, keepdim=True)).to(logp.dtype)


def cross_entropy_reference(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                            label_smoothing: float = 0.0, reduction: str = "mean", weight: torch.Tensor | None = None,
                            z_loss: float = 0.0, softcap: float | None = None) -> torch.Tensor:
    """F.cross_entropy in float64 (differentiable), with softcap c tanh(x / c) first and z lse^2 per row:
    in fp32 a row near the format's max loses 2 max, infinite where the mean of such rows is not."""
    ignored = target == ignore_index
    # an ignored row's garbage (NaN, inf) never reaches torch's backward, which would spread it (NUMERICS 9.2)
    x = torch.where(ignored[:, None], torch.zeros((), dtype=torch.float64, device=logits.device), logits.double())
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    w = None if weight is None else weight.double()
    loss = F.cross_entropy(x, target, weight=w, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    if z_loss:
        lse = torch.logsumexp(x, -1)
        zl = torch.where(ignored, 0.0, z_loss * lse * lse)
        if reduction == "none":
            loss = loss + zl
        else:
            loss = loss + zl.sum() / (1.0 if reduction == "sum" else _weight_sum(target, ignored, w))
    return loss.to(logits.dtype)


def _weight_sum(target: torch.Tensor, ignored: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """The "mean" denominator: sum of w_t over the rows not ignored (their count without weights)."""
    if w is None:
        return (~ignored).sum().double()
    return torch.where(ignored, 0.0, w[torch.where(ignored, 0, target)]).sum()
