"""GPU-only: a launch that replays a compiled kernel (`kernels/_runtime.py:launch`) writes the bits
Triton's own launch writes, and a call whose specialization differs (a view off a 16-byte boundary,
another dtype, another split count) gets its own binary. The interpreter never replays: the
module skips there (tests/test_replay.py covers the logic with a stand-in)."""
from __future__ import annotations

import importlib
from typing import Callable

import pytest
import torch

from flashcheck import kernels
from flashcheck.oracles.formats import bit_patterns

R = importlib.import_module("flashcheck.kernels._runtime")

pytestmark = [
    pytest.mark.skipif(kernels.INTERPRET, reason="GPU only: the interpreter returns no binary to replay"),
    pytest.mark.skipif(not R.replay_supported(R.triton.__version__), reason="this Triton launches without the replay"),
]
A = importlib.import_module("flashcheck.kernels.attention")
S = importlib.import_module("flashcheck.kernels.softmax")


def _off(shape: tuple[int, ...], dtype: torch.dtype, shift: int, seed: int) -> torch.Tensor:
    """A contiguous view `shift` elements into its buffer (off a 16-byte boundary when shift * size % 16)."""
    g = torch.Generator("cuda").manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    buf = torch.randn(n + shift, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return buf[shift:].view(shape)


def _bits(out) -> list[torch.Tensor]:
    return [bit_patterns(o) for o in (out if isinstance(out, tuple) else (out,))]


def _attn(dtype: torch.dtype, shift: int, **opts) -> Callable[[], object]:
    hq, hkv, m, n = opts.pop("heads", (8, 8)) + opts.pop("mn", (64, 300))
    q = _off((2, hq, m, 64), dtype, shift, 1)
    k, v = _off((2, hkv, n, 64), dtype, 0, 2), _off((2, hkv, n, 64), dtype, 0, 3)
    return lambda: A.attention(q, k, v, **opts)


def _softmax(fn: Callable, dtype: torch.dtype, shift: int, shape: tuple[int, int]) -> Callable[[], object]:
    x = _off(shape, dtype, shift, 4)
    return lambda: fn(x)


CASES = {
    "attn-fp16": lambda s: _attn(torch.float16, s, causal=True),
    "attn-bf16-lse": lambda s: _attn(torch.bfloat16, s, return_lse=True, window=(40, 3)),
    "attn-fp32": lambda s: _attn(torch.float32, s),
    "attn-decode-split4": lambda s: _attn(torch.float16, s, heads=(8, 2), mn=(1, 3000), num_splits=4,
                                          return_lse=True),
    "attn-decode-auto": lambda s: _attn(torch.bfloat16, s, heads=(8, 2), mn=(1, 70000), num_splits=0),
    "softmax-row": lambda s: _softmax(S.softmax_row, torch.float16, s, (33, 1000)),
    "softmax-online": lambda s: _softmax(S.softmax_online, torch.bfloat16, s, (5, 70000)),
    "softmax-split": lambda s: _softmax(S.softmax_split, torch.float32, s, (2, 300001)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_replayed_launches_write_tritons_bits(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # shift 0: 16-byte aligned; 1: 2 or 4 bytes off (Triton's alignment specialization changes)
    calls = {shift: CASES[case](shift) for shift in (0, 1)}
    monkeypatch.setattr(R, "REPLAY", False)
    want = {shift: _bits(f()) for shift, f in calls.items()}
    monkeypatch.setattr(R, "REPLAY", True)
    monkeypatch.setattr(R, "_REPLAYS", {})
    sizes = []
    for shift in (0, 1, 0, 1):  # first launches, then replays, the two alignments interleaved
        got = _bits(calls[shift]())
        for g, w in zip(got, want[shift]):
            assert torch.equal(g, w), f"{case}: the launch of shift {shift} differs from Triton's own"
        sizes.append(len(R._REPLAYS))
    assert 0 < sizes[0] < sizes[1], f"{case}: each alignment should get its own binary, got {sizes}"
    assert sizes[1] == sizes[2] == sizes[3], f"{case}: a repeated call compiled anew instead of replaying ({sizes})"
