"""Where the interpreter follows the GPU (flashcheck.interpreter.gpu, docs/interpreter.md).

The kernels here run on whatever flashcheck runs on: under the interpreter they check the patch,
on a GPU the same expectations check the claims the patch is built on (tf32 operands truncated,
maxnum NaN semantics). The checks that are the interpreter's own (globals, grid limits, shared
memory) are skipped on a GPU, where Triton itself raises.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck import kernels
from flashcheck.kernels import DEVICE
from flashcheck.kernels._common import tl, triton

interpreter_only = pytest.mark.skipif(not kernels.INTERPRET, reason="the interpreter's check; on a GPU Triton raises")


@triton.jit
def _minmax_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a, b = tl.load(a_ptr + i), tl.load(b_ptr + i)
    tl.store(out_ptr + i, tl.maximum(a, b))
    tl.store(out_ptr + N + i, tl.minimum(a, b))
    tl.store(out_ptr + 2 * N + i, tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL))
    tl.store(out_ptr + 3 * N + i, tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_maximum_minimum_nan_as_the_gpu(dtype: torch.dtype) -> None:
    nan = float("nan")
    a = torch.tensor([nan, 1.0, nan, -2.0, 3.0, -0.5, nan, 7.0] * 2, dtype=dtype)
    b = torch.tensor([1.0, nan, nan, 5.0, -1.0, -0.25, -3.0, 7.0] * 2, dtype=dtype)
    out = torch.empty(4 * a.numel(), dtype=dtype, device=DEVICE)
    _minmax_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), out, N=a.numel())
    mx, mn, mx_all, mn_all = out.cpu().float().view(4, -1)
    af, bf = a.float(), b.float()
    # default propagate_nan=NONE: maxnum/minnum, NaN only when both are NaN
    assert torch.equal(mx.nan_to_num(99.0), torch.fmax(af, bf).nan_to_num(99.0))
    assert torch.equal(mn.nan_to_num(99.0), torch.fmin(af, bf).nan_to_num(99.0))
    # propagate_nan=ALL: NaN whenever either is
    assert torch.equal(mx_all.nan_to_num(99.0), torch.maximum(af, bf).nan_to_num(99.0))
    assert torch.equal(mn_all.nan_to_num(99.0), torch.minimum(af, bf).nan_to_num(99.0))


@triton.jit
def _dot32_kernel(a_ptr, b_ptr, c_ptr, PREC: tl.constexpr):
    i = tl.arange(0, 16)
    a = tl.load(a_ptr + i[:, None] * 16 + i[None, :])
    b = tl.load(b_ptr + i[:, None] * 16 + i[None, :])
    if PREC == "default":
        c = tl.dot(a, b)
    else:
        c = tl.dot(a, b, input_precision=PREC)
    tl.store(c_ptr + i[:, None] * 16 + i[None, :], c)


def _dot32(a: torch.Tensor, b: torch.Tensor, prec: str) -> np.ndarray:
    c = torch.empty(16, 16, device=DEVICE)
    _dot32_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), c, PREC=prec)
    return c.cpu().double().numpy()


def test_fp32_dot_is_tf32_by_default() -> None:
    """One non-zero product per output: the result is that product of the operands as the tensor
    cores read them. 1 + 2^-11 + 2^-12 is between tf32 values 1 and 1 + 2^-10, nearer the upper
    one: truncated to 1 (the GPU, Triton inserting no rounding), rounded to 1 + 2^-10."""
    from flashcheck.interpreter.gpu import tf32_round, tf32_truncate

    v = np.float32(1 + 2.0**-11 + 2.0**-12)
    assert tf32_truncate(np.array([v]))[0] == 1.0 and tf32_round(np.array([v]))[0] == 1 + 2.0**-10
    a = torch.eye(16) * float(v)
    b = torch.eye(16) * 3.0
    assert _dot32(a, b, "ieee")[0, 0] == float(v) * 3.0
    assert _dot32(a, b, "default")[0, 0] == 3.0  # tf32: the operand truncated to 1
    assert _dot32(a, b, "tf32")[0, 0] == 3.0
    x3 = _dot32(a, b, "tf32x3")[0, 0]
    assert abs(x3 - float(v) * 3.0) <= 2.0**-20 * 3.0  # three tf32 products: near fp32


def test_tf32_round_ties_away_from_zero() -> None:
    from flashcheck.interpreter.gpu import tf32_round

    tie = np.array([1 + 2.0**-11, -(1 + 2.0**-11), 1 + 3 * 2.0**-11, np.inf, np.finfo(np.float32).max],
                   dtype=np.float32)
    got = tf32_round(tie)
    assert list(got[:3]) == [1 + 2.0**-10, -(1 + 2.0**-10), 1 + 2 * 2.0**-10] and got[3] == np.inf
    assert np.isinf(got[4])  # rounds past the largest tf32 value


LIMIT = 3.0  # a plain float: the GPU compiler refuses it inside a kernel
LIMIT_C = tl.constexpr(3.0)


@triton.jit
def _uses_plain_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * LIMIT)


@triton.jit
def _helper(x):
    return x * LIMIT


@triton.jit
def _uses_it_in_a_helper(x_ptr):
    tl.store(x_ptr, _helper(tl.load(x_ptr)))


@triton.jit
def _uses_constexpr_global(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) * LIMIT_C)


@interpreter_only
def test_non_constexpr_global_is_an_error_as_on_the_gpu() -> None:
    from flashcheck.interpreter.gpu import GpuIncompatible

    x = torch.ones(1)
    _uses_constexpr_global[(1,)](x)
    assert x.item() == 3.0
    with pytest.raises(GpuIncompatible, match=r"kernel _uses_plain_global reads global variable\(s\) 'LIMIT' in "
                                              r"_uses_plain_global that are not tl.constexpr"):
        _uses_plain_global[(1,)](x)
    with pytest.raises(GpuIncompatible, match="'LIMIT' in _helper"):
        _uses_it_in_a_helper[(1,)](x)


@triton.jit
def _noop(x_ptr):
    pass


@interpreter_only
@pytest.mark.parametrize("grid", [(1, 65536), (1, 1, 65536), (2**31,)])
def test_grid_beyond_the_gpu_limits_is_an_error(grid) -> None:
    from flashcheck.interpreter.gpu import GpuIncompatible

    with pytest.raises(GpuIncompatible, match="exceeds the GPU's limit"):
        _noop[grid](torch.zeros(1))
    _noop[(1, 65535)](torch.zeros(1))  # the limit itself launches


@triton.jit
def _big_dot(a_ptr, c_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i[:, None] * N + i[None, :])
    tl.store(c_ptr + i[:, None] * N + i[None, :], tl.dot(a, a, input_precision="ieee"))


@interpreter_only
def test_shared_memory_beyond_a_block_warns() -> None:
    from flashcheck.interpreter.gpu import GpuResourceWarning

    a, c = torch.zeros(256, 256), torch.empty(256, 256)
    with pytest.warns(GpuResourceWarning, match="512 KiB of shared memory"):
        _big_dot[(1,)](a, c, N=256)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpuResourceWarning)
        _big_dot[(1,)](a[:64, :64].contiguous(), c[:64, :64].contiguous(), N=64)  # 32 KiB: fine
