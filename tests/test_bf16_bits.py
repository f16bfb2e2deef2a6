"""The interpreter's bf16 emulation, bit for bit: `kernels/_common.py`'s `store_f32`, `load_f32`,
`load_f32_zero` with BF16_BITS, and attention's `_round_bf16_in_f32` (NUMERICS.md section 8).

Under the interpreter bf16 moves as int16 bits and is rounded by integer arithmetic, because the
interpreter's own fp32 -> bf16 cast truncates. The suite's bf16 verdicts on the CPU rest on that
arithmetic, and a slip at a tie or in a NaN stays inside every bound, so here it is held to torch's
conversion (round to nearest even; NaN stays NaN, its payload aside) on exact ties, the bits next
to them, NaN payloads that a rounding add would carry out of, infinities, subnormals and random
bit patterns. The mutation runs of these helpers run this file too (`flashcheck.mutation.generate`).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck.kernels import INTERPRET
from flashcheck.kernels._common import load_f32, load_f32_zero, store_f32, tl, triton
from flashcheck.kernels.attention import _round_bf16_in_f32

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the BF16_BITS branches run only under the interpreter "
                                "(a GPU converts with its own cvt.rn.bf16)")

BLOCK = 1024
EDGE_BITS = [
    0x3F808000, 0x3F818000,  # exact ties: kept bit even (rounds down), odd (rounds up)
    0x3F807FFF, 0x3F808001, 0x3F817FFF, 0x3F818001,  # one bit either side of a tie
    0x3F80C000, 0x3F804081, 0x3F804080, 0x3F80BF7F,  # the thresholds a wrong bias would move
    0x00008000, 0x00018000, 0x00007FFF, 0x80008000,  # ties among subnormals, and negative ones
    0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000,  # the largest values: round to +-inf at the tie
    0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # infinities and zeros
    0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF,  # NaNs (one all ones below)
]


def _inputs() -> torch.Tensor:
    rng = np.random.default_rng(0)
    bits = np.concatenate([np.array(EDGE_BITS, dtype=np.uint32), rng.integers(0, 2**32, 4096, dtype=np.uint32)])
    return torch.from_numpy(bits.view(np.int32).copy()).view(torch.float32)


def _assert_same(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: str) -> None:
    nan = torch.isnan(want)
    same = torch.where(nan, torch.isnan(got), got.view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32)
                       == want.view(torch.int16 if want.dtype == torch.bfloat16 else torch.int32))
    if not bool(same.all()):
        i = int(torch.nonzero(~same)[0])
        xb = int(x.view(torch.int32)[i]) & 0xFFFFFFFF
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.numel()} differ; first at input bits "
                             f"0x{xb:08X} ({float(x[i])!r}): got {float(got[i])!r}, torch {float(want[i])!r}")


@triton.jit
def _store_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    store_f32(y_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0), mask, True)


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _round_bf16_in_f32(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _load_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # lanes past n are padding: -inf from load_f32, +0 from load_f32_zero
    tl.store(y_ptr + offs, load_f32(x_ptr + offs, mask, True))
    tl.store(z_ptr + offs, load_f32_zero(x_ptr + offs, mask, True))


def test_store_f32_rounds_to_nearest_even_as_torch_does() -> None:
    x = _inputs()
    y = torch.empty(x.numel(), dtype=torch.int16)
    _store_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    _assert_same(y.view(torch.bfloat16), x.to(torch.bfloat16), x, "store_f32 (bf16 bits)")


def test_attention_rounds_p_to_bf16_as_torch_does() -> None:
    x = _inputs().abs()  # P values: >= 0 or NaN
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    _assert_same(y, x.to(torch.bfloat16).to(torch.float32), x, "_round_bf16_in_f32")


def test_bf16_bits_load_widen_exactly_and_pad() -> None:
    x = _inputs().to(torch.bfloat16)
    n = x.numel()
    padded = -(-n // BLOCK) * BLOCK + BLOCK  # a whole block of padding lanes past n
    y = torch.empty(padded, dtype=torch.float32)
    z = torch.empty(padded, dtype=torch.float32)
    _load_kernel[(padded // BLOCK,)](x.view(torch.int16), y, z, n, BLOCK=BLOCK)
    want = x.to(torch.float32)
    _assert_same(y[:n], want, want, "load_f32 (bf16 bits)")
    _assert_same(z[:n], want, want, "load_f32_zero (bf16 bits)")
    pad_inf = torch.full((padded - n,), float("-inf"))
    _assert_same(y[n:], pad_inf, pad_inf, "load_f32's padding (-inf)")
    pad_zero = torch.zeros(padded - n)
    _assert_same(z[n:], pad_zero, pad_zero, "load_f32_zero's padding (+0)")
