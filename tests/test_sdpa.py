"""`flashcheck.properties.attention.sdpa`: a forced SDPA backend that refuses a case raises without a warning.

On a GPU torch warns every reason a forced backend declines (head_dim, dtype, "runtime disabled")
before raising; the attention report runs every backend on every case, and its output on an H200
held 650 such lines. On the CPU torch does not warn, so there this only checks the refusal."""
from __future__ import annotations

import warnings

import pytest
import torch

from flashcheck import kernels
from flashcheck.properties.attention.sdpa import sdpa_output


def test_a_refused_backend_raises_without_warnings() -> None:
    from torch.nn.attention import SDPBackend

    q = torch.randn(1, 1, 3, 1, device=kernels.DEVICE)  # head dim 1: the efficient backend declines
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError):
            sdpa_output(q, q, q, backend=SDPBackend.EFFICIENT_ATTENTION)
    assert not [w for w in caught if issubclass(w.category, UserWarning)], [str(w.message) for w in caught]
