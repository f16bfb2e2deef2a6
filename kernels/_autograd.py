"""Autograd for the row-wise forwards (softmax, log-softmax): a launcher becomes differentiable
through `differentiable(fn, backward)`, whose backward takes the forward's output and the
incoming gradient (`softmax_backward(y, dy)`, `log_softmax_backward(logp, dy)`).

The autograd path is taken only when grad mode is on and x requires grad; otherwise the wrapper
calls the launcher itself, so the non-grad path launches exactly what it did before (same
kernels, same bits). `backward` is a zero-argument callable returning the backward launcher,
resolved at the first backward: the softmax module can then be imported without its backward's.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.autograd.function import once_differentiable

__all__ = ["differentiable"]


class _RowwiseFunction(torch.autograd.Function):
    """y = fn(x, **kwargs); dx = backward()(y, dy), cast to x's dtype when fn took out_dtype."""

    @staticmethod
    def forward(ctx, x, fn, kwargs, backward):  # noqa: ANN001, ANN205
        y = fn(x, **kwargs)
        ctx.save_for_backward(y)
        ctx.backward_fn, ctx.x_dtype = backward, x.dtype
        return y

    @staticmethod
    @once_differentiable  # the backward kernels have no backward of their own: a clear error on double backward
    def backward(ctx, dy):  # noqa: ANN001, ANN205
        (y,) = ctx.saved_tensors
        dx = ctx.backward_fn()(y, dy)
        return (dx if dx.dtype == ctx.x_dtype else dx.to(ctx.x_dtype)), None, None, None


def differentiable(fn: Callable[..., torch.Tensor], backward: Callable[[], Callable]) -> Callable[..., torch.Tensor]:
    """`fn(x, **kwargs)` that records a graph when x requires grad under grad mode. out= is
    refused there (as torch's out= functions do under autograd): the result would be a view of a
    buffer autograd does not own."""

    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            if args:
                raise TypeError(f"{fn.__name__}: pass options by keyword when x requires grad")
            if kwargs.get("out") is not None:
                raise ValueError(f"{fn.__name__}: out= does not support autograd (x requires grad); "
                                 "drop out= or call under torch.no_grad()")
            return _RowwiseFunction.apply(x, fn, kwargs, backward)
        return fn(x, *args, **kwargs)

    return wrapper
