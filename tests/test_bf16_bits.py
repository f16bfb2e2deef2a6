"""The interpreter's bf16 emulation, bit for bit: `kernels/_common.py`'s `store_f32`, `load_f32`,
`load_f32_zero` with BF16_BITS, and attention's `_round_bf16_in_f32` (NUMERICS.md section 8).

Under the interpreter bf16 moves as int16 bits and is rounded by integer arithmetic, because the
interpreter's own fp32 -> bf16 cast truncates. The suite's bf16 verdicts on the CPU rest on that
arithmetic, and a slip at a tie or in a NaN stays inside every bound, so here it is held to torch's
conversion (round to nearest even; NaN stays a quiet NaN, its payload aside) on the rounding
cases of `tests/bits.py` (every bf16 value, its midpoints and their neighbours, subnormals, the
overflow boundary, NaN payloads), a few thresholds and random bit patterns; loads on every pattern. The mutation runs of these helpers run this file too (`flashcheck.mutation.generate`).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck.kernels import INTERPRET
from flashcheck.kernels._common import load_f32, load_f32_zero, store_f32, tl, triton
from flashcheck.kernels.attention import _round_bf16_in_f32
from tests.bits import ALL16, assert_quiet_nans, assert_same_bits, f32_rounding_cases

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the BF16_BITS branches run only under the interpreter "
                                "(a GPU converts with its own cvt.rn.bf16)")

BLOCK = 1024
# Beyond tests/bits.py's rounding cases: the round-up thresholds a wrong bias would move (0x8000
# minus 0x3F80, the bits b >> 16 adds for values near 1), and the NaN whose rounding add carries
# into the sign.
EXTRA_BITS = [0x3F80C000, 0x3F804081, 0x3F804080, 0x3F80BF7F, 0xFFFFFFFF]


def _inputs() -> torch.Tensor:
    """Every bf16 value, its upper midpoint and their fp32 neighbours, subnormals, the overflow
    boundary, NaN payloads (`f32_rounding_cases`), the extra bits above and random bit patterns."""
    rng = np.random.default_rng(0)
    extra = np.concatenate([np.array(EXTRA_BITS, dtype=np.uint32), rng.integers(0, 2**32, 4096, dtype=np.uint32)])
    return torch.cat([f32_rounding_cases(), torch.from_numpy(extra.view(np.float32).copy())])


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
    assert_same_bits(y.view(torch.bfloat16), x.to(torch.bfloat16), "store_f32 (bf16 bits)")
    assert_quiet_nans(y.view(torch.bfloat16), "store_f32 (bf16 bits)")


def test_attention_rounds_p_to_bf16_as_torch_does() -> None:
    x = _inputs().abs()  # P values: >= 0 or NaN
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    assert_same_bits(y, x.to(torch.bfloat16).to(torch.float32), "_round_bf16_in_f32")


def test_bf16_bits_load_widen_exactly_and_pad() -> None:
    x = ALL16.view(torch.bfloat16)
    n = x.numel()
    padded = -(-n // BLOCK) * BLOCK + BLOCK  # a whole block of padding lanes past n
    y = torch.empty(padded, dtype=torch.float32)
    z = torch.empty(padded, dtype=torch.float32)
    _load_kernel[(padded // BLOCK,)](ALL16, y, z, n, BLOCK=BLOCK)
    want = x.to(torch.float32)
    assert_same_bits(y[:n], want, "load_f32 (bf16 bits)")
    assert_same_bits(z[:n], want, "load_f32_zero (bf16 bits)")
    assert_same_bits(y[n:], torch.full((padded - n,), float("-inf")), "load_f32's padding (-inf)")
    assert_same_bits(z[n:], torch.zeros(padded - n), "load_f32_zero's padding (+0)")
