"""The attention oracle's log-sum-exp where float64 is not enough, and the kernel bug it showed.

A row whose every key carries a bias near -3.4e38 (Hugging Face masks with torch.finfo(dtype).min
in bf16 and fp32) still has a finite softmax: softmax(s + c) = softmax(s). Beside such a bias the
float64 scores vanish, the fast path's error bound on the lse is no longer small (it was -inf,
which made every kernel lse "exceed" a negative bound), and the exact path answers instead.
Our kernel scaled such a bias by log2 e in fp32, which overflowed to -inf and emptied the row
(output 0, lse -inf); it now keeps a float mask's rows in natural units (kernels/attention.py).
"""
from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels import DEVICE
from flashcheck.kernels.registry import REGISTRY
from flashcheck.oracles.attention import attention_oracle
from flashcheck.properties import attention as properties_attention  # noqa: F401  (registers the attention properties)
from flashcheck.families import PROPERTIES
from flashcheck.strategies.case import Case

Q = [[[[0.5, -1.0, 2.0]]]]
K = [[[[1.0, 2.0, 0.25], [-1.0, 0.5, 3.0]]]]


@pytest.mark.parametrize("c", [-1.0e4, -3.0e38, float(torch.finfo(torch.float32).min)])
def test_lse_of_a_row_under_a_huge_equal_bias_is_exact(c: float) -> None:
    q, k, v = torch.tensor(Q), torch.tensor(K), torch.ones(1, 1, 2, 3)
    mask = torch.full((1, 1, 1, 2), c)
    plain, o = attention_oracle(q, k, v), attention_oracle(q, k, v, attn_mask=mask)
    want = float(mask[0, 0, 0, 0]) + plain.lse[0, 0, 0]  # lse(s + c) = lse(s) + c
    assert o.lse_err[0, 0, 0] >= 0 and math.isfinite(o.lse_err[0, 0, 0])
    assert abs(o.lse[0, 0, 0] - want) <= o.lse_err[0, 0, 0] + plain.lse_err[0, 0, 0] + 2 * 2.0**-53 * abs(want)
    assert o.lse_err[0, 0, 0] <= 8 * 2.0**-53 * abs(want) + 2.0**-20  # not a vacuous bound


def test_the_outputs_are_softmax_of_the_scores_whatever_the_equal_bias() -> None:
    q, k = torch.tensor(Q), torch.tensor(K)
    v = torch.tensor([[[[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]]]])
    plain = attention_oracle(q, k, v)
    for c in (-1.0e4, float(torch.finfo(torch.float32).min)):
        assert (attention_oracle(q, k, v, attn_mask=torch.full((1, 1, 1, 2), c)).out == plain.out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_finite_min_mask_row(dtype: torch.dtype) -> None:
    spec = next(s for s in REGISTRY if s.name == "attention")
    t = {n: torch.tensor(x, dtype=dtype, device=DEVICE) for n, x in (("q", Q), ("k", K))}
    t["v"] = torch.tensor([[[[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]]]], dtype=dtype, device=DEVICE)
    t["attn_mask"] = torch.full((1, 1, 1, 2), torch.finfo(dtype).min, dtype=dtype, device=DEVICE)
    case = Case(tensors=t, kwargs={"causal": False, "scale": None}, label="finfo_min_mask_row")
    for name in ("matches_oracle", "lse_matches_oracle"):
        PROPERTIES[("attention", name)](spec, case)
