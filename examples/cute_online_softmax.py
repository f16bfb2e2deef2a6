"""Online softmax in the CuTe Python DSL (CUTLASS 4.x): a GPU kernel that is not Triton, checked by
flashcheck like any other (`flashcheck check examples/cute_online_softmax.py:softmax --family softmax`).

One CTA per row. Each thread streams its strided share of the row keeping a running (max, sum)
pair, the CTA merges the pairs through shared memory with the same associative rule, and a
second pass writes exp(x - max) / sum. Two things the algorithm as usually written leaves out,
and this version does not:

* rows of any length: threads loop to N, they do not read only whole multiples of the CTA;
* the -inf guard: a running max still at -inf (all of a thread's elements so far masked) makes
  the textbook rescale exp(m - m_new) = exp(-inf - -inf) = NaN; the factor is taken as 1 when the
  max did not move and a -inf element contributes 0. NaN and +inf inputs still give a NaN row (the
  contract of NUMERICS.md), because `fmax` drops NaN but the NaN's own term does not.

`seed_softmax` is the same kernel with both omissions switched back on (the version in the
project's seed document): the suite finds each of them. Both take a 2-D fp16/bf16/fp32 tensor of
any strides and return a new contiguous tensor; each kernel is compiled once per dtype (sizes
and strides are runtime arguments), then reused.
"""
from __future__ import annotations

import math

import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr

THREADS = 256
MAX_NUMEL = 2**31 - 1
LOG2E = 1.4426950408889634  # exp(x) = 2^(x log2 e): ex2.approx, as Triton's tl.exp lowers

_ELEMENT = {torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16, torch.float32: cutlass.Float32}


@cute.kernel
def _online_softmax_kernel(mX: cute.Tensor, mY: cute.Tensor, n: cutlass.Int32,
                           guarded: cutlass.Constexpr[bool], threads: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    # the seed reads V = N // THREADS elements per thread: the tail past the last whole CTA is lost
    end = n if guarded else (n // threads) * threads
    neg_inf = -cutlass.Float32.inf

    m = neg_inf
    s = cutlass.Float32(0.0)
    for i in cutlass.range(tidx, end, threads):
        x = mX[row, i].to(cutlass.Float32)
        m_new = cute.arch.fmax(m, x)
        alpha = cute.math.exp2((m - m_new) * LOG2E, fastmath=True)
        p = cute.math.exp2((x - m_new) * LOG2E, fastmath=True)
        if guarded:
            if m == m_new:
                alpha = cutlass.Float32(1.0)
            if x == neg_inf:
                p = cutlass.Float32(0.0)
        s = s * alpha + p
        m = m_new

    smem = cutlass.utils.SmemAllocator()
    sm = smem.allocate_tensor(cutlass.Float32, cute.make_layout(threads), 16)
    ss = smem.allocate_tensor(cutlass.Float32, cute.make_layout(threads), 16)
    sm[tidx] = m
    ss[tidx] = s
    cute.arch.barrier()
    offset = threads // 2
    while offset > 0:  # unrolled at trace time: offset is a Python int
        if tidx < offset:
            m_a = sm[tidx]
            m_b = sm[tidx + offset]
            m_c = cute.arch.fmax(m_a, m_b)
            f_a = cute.math.exp2((m_a - m_c) * LOG2E, fastmath=True)
            f_b = cute.math.exp2((m_b - m_c) * LOG2E, fastmath=True)
            if guarded:
                if m_a == m_c:
                    f_a = cutlass.Float32(1.0)
                if m_b == m_c:
                    f_b = cutlass.Float32(1.0)
            ss[tidx] = ss[tidx] * f_a + ss[tidx + offset] * f_b
            sm[tidx] = m_c
        cute.arch.barrier()
        offset //= 2
    m_row = sm[0]
    s_row = ss[0]

    for i in cutlass.range(tidx, end, threads):
        x = mX[row, i].to(cutlass.Float32)
        mY[row, i] = (cute.math.exp2((x - m_row) * LOG2E, fastmath=True) / s_row).to(mY.element_type)


def _launcher(element, guarded: bool, threads: int):
    @cute.jit
    def launch(px: cute.Pointer, py: cute.Pointer, rows: cutlass.Int32, n: cutlass.Int32,
               sx0: cutlass.Int32, sx1: cutlass.Int32):
        mX = cute.make_tensor(px, cute.make_layout((rows, n), stride=(sx0, sx1)))
        mY = cute.make_tensor(py, cute.make_layout((rows, n), stride=(n, 1)))
        _online_softmax_kernel(mX, mY, n, guarded, threads).launch(grid=(rows, 1, 1), block=(threads, 1, 1))
    return launch


_COMPILED: dict = {}


def _run(x: torch.Tensor, *, guarded: bool, threads: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _ELEMENT or not x.is_cuda:
        raise ValueError("cute softmax: x must be a 2-D fp16/bf16/fp32 CUDA tensor")
    rows, n = x.shape
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return y
    reach = max((rows - 1) * abs(x.stride(0)) + (n - 1) * abs(x.stride(1)), rows * n - 1)
    if reach >= MAX_NUMEL:  # CuTe layouts index in 32 bits here (64-bit strides do not lower in 4.2)
        raise ValueError(f"cute softmax: {rows} x {n} (strides {tuple(x.stride())}) is past the kernel's 32-bit offsets")
    key = (x.dtype, guarded, threads)
    element = _ELEMENT[x.dtype]
    args = (make_ptr(element, x.data_ptr(), cute.AddressSpace.gmem, assumed_align=x.element_size()),
            make_ptr(element, y.data_ptr(), cute.AddressSpace.gmem, assumed_align=y.element_size()),
            cutlass.Int32(rows), cutlass.Int32(n), cutlass.Int32(x.stride(0)), cutlass.Int32(x.stride(1)))
    if key not in _COMPILED:
        _COMPILED[key] = cute.compile(_launcher(element, guarded, threads), *args)
    _COMPILED[key](*args)
    return y


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a 2-D tensor: rows of any length, -inf guarded."""
    return _run(x, guarded=True, threads=THREADS)


def seed_softmax(x: torch.Tensor) -> torch.Tensor:
    """The seed document's version: 512 threads, only whole multiples of 512 read, no -inf guard."""
    return _run(x, guarded=False, threads=512)


def _depth(n: int, threads: int = THREADS) -> int:
    # per thread: ceil(n / T) sequential terms, each a rescale and an add; then log2(T) merge levels,
    # each rescaling both sides (oracles/bounds.py counts rounding depth in these steps)
    return 2 * math.ceil(n / threads) + 2 * int(math.log2(threads))


softmax.flashcheck = {"depth": _depth, "max_numel": MAX_NUMEL}
seed_softmax.flashcheck = {"depth": lambda n: _depth(n, 512), "max_numel": MAX_NUMEL}
