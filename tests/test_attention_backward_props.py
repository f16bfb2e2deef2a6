"""The attention backward properties (flashcheck/properties/attention/backward.py) on kernels whose
gradients are known: a float64 reference (correct: every property passes) and references broken the
way real backward passes break (each caught by the property named). The production kernel's
backward is checked by the suite (flashcheck/suite/test_attention_backward.py)."""
from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties.attention.backward import BACKWARD_PROPERTIES, run_backward
from flashcheck.properties.runner import check
from flashcheck.strategies.case import Case


def _reference(q, k, v, *, causal=False, scale=None, kv_lens=None, dq_factor=1.0, dv_factor=1.0, mask_dead=False):
    """Attention in float64 (autograd through the casts), rounded once to q's dtype."""
    d = q.shape[-1]
    sc = 1 / math.sqrt(d) if scale is None else scale
    qd = q.double()
    qd = qd.detach() + (qd - qd.detach()) * dq_factor  # a dq scaled by dq_factor, the forward unchanged
    vd = v.double()
    vd = vd.detach() + (vd - vd.detach()) * dv_factor
    g = q.shape[1] // k.shape[1]
    kd, vd = k.double().repeat_interleave(g, 1), vd.repeat_interleave(g, 1)
    s = qd @ kd.transpose(-1, -2) * sc
    m, n = s.shape[-2:]
    vis = torch.ones(m, n, dtype=torch.bool)
    if causal:
        vis = torch.ones(m, n, dtype=torch.bool).tril()
    vis = vis.expand(s.shape).clone()
    if kv_lens is not None:
        for b, ln in enumerate(kv_lens.tolist()):
            vis[b, :, :, ln:] = False
    s = s.masked_fill(~vis, -math.inf)
    p = torch.softmax(s, -1)
    if not mask_dead:
        p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key: zeros, and zero gradients
    return (p @ vd).to(q.dtype)


def _spec(name: str, **kw) -> KernelSpec:
    def fn(q, k, v, *, causal=False, scale=None, kv_lens=None):
        return _reference(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, **kw)

    return KernelSpec(name=name, family="attention", fn=fn, gqa=True, dv=True, window=False, softcap=False,
                      varlen=False, lse=False, attn_mask=False, splits=False, deterministic_backward=True)


def _case(dtype=torch.float32, *, b=1, hq=2, hkv=1, m=5, n=7, d=8, dv=4, seed=0, **kwargs) -> Case:
    gen = torch.Generator().manual_seed(seed)
    t = {"q": torch.randn(b, hq, m, d, generator=gen).to(dtype),
         "k": torch.randn(b, hkv, n, d, generator=gen).to(dtype),
         "v": torch.randn(b, hkv, n, dv, generator=gen).to(dtype),
         "do": torch.randn(b, hq, m, dv, generator=gen).to(dtype)[..., ::1]}
    if "kv_lens" in kwargs:
        t["kv_lens"] = kwargs.pop("kv_lens")
    return Case(t, kwargs, label="hand")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"kv_lens": torch.tensor([3, 0])}, {"scale": 0.3}])
def test_a_correct_backward_passes_every_property(dtype, opts) -> None:
    spec = _spec("ref")
    case = _case(dtype, b=2 if "kv_lens" in opts else 1, **dict(opts))
    for name in BACKWARD_PROPERTIES:
        check(spec, name, case, save=False)


@pytest.mark.parametrize("broken, prop, what", [
    ({"dq_factor": 1.01}, "backward_matches_oracle", "dq"),
    ({"dv_factor": 0.5}, "backward_matches_oracle", "dv"),
    ({"mask_dead": True}, "backward_matches_oracle", "exceeds"),
])
def test_a_broken_backward_is_caught(broken, prop, what) -> None:
    spec = _spec("broken", **broken)
    case = _case(torch.float32, b=2, kv_lens=torch.tensor([7, 0])) if broken.get("mask_dead") else _case()
    with pytest.raises(AssertionError, match=what):
        check(spec, prop, case, save=False)


def test_a_nondeterministic_backward_is_caught_when_it_declares_determinism() -> None:
    calls = []

    def fn(q, k, v, *, causal=False, scale=None, kv_lens=None):
        calls.append(1)
        return _reference(q, k, v, dv_factor=1.0 + 2.0**-10 * (len(calls) % 2))

    spec = KernelSpec(name="racy", family="attention", fn=fn, deterministic_backward=True)
    with pytest.raises(AssertionError, match="differs between two identical backward runs"):
        check(spec, "backward_deterministic", _case(), save=False)


def test_dv_not_linear_in_do_is_caught() -> None:
    class Clamped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return v.clone()

        @staticmethod
        def backward(ctx, g):
            return g.clamp(-1, 1)  # a saturating dv: not linear in dO

    def fn(q, k, v, *, causal=False, scale=None, kv_lens=None):
        return _reference(q, k, Clamped.apply(v))

    spec = KernelSpec(name="clamped", family="attention", fn=fn)
    with pytest.raises(AssertionError, match="not exactly doubled"):
        check(spec, "backward_linear_in_do", _case(), save=False)


def test_a_forward_only_kernel_is_skipped_in_one_line() -> None:
    def fn(q, k, v, *, causal=False, scale=None, kv_lens=None):
        return _reference(q, k, v).detach()

    spec = KernelSpec(name="fwd_only", family="attention", fn=fn)
    with pytest.raises(pytest.skip.Exception, match="forward-only"):
        check(spec, "backward_matches_oracle", _case(), save=False)


def test_a_plain_backward_fn_is_checked_with_the_forwards_o_and_lse() -> None:
    seen = {}

    def fwd(q, k, v, *, causal=False, scale=None, kv_lens=None, return_lse=False):
        o = _reference(q, k, v).detach()
        return (o, torch.zeros(q.shape[:3])) if return_lse else o

    def bwd(q, k, v, o, lse, do, **kw):
        seen["o"] = o
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            return torch.autograd.grad(_reference(*leaves), leaves, do)

    spec = KernelSpec(name="plain", family="attention", fn=fwd, backward_fn=bwd)
    case = _case()
    grads, how = run_backward(spec, case)
    assert how == "backward_fn" and seen["o"].shape == (1, 2, 5, 4) and len(grads) == 3
    check(spec, "backward_matches_oracle", case, save=False)
