"""Property tests for every registered attention-family kernel, for every dtype it supports.

The properties live in `flashcheck.properties.attention` (engine code, registered by name for
the fixtures); this module only parametrizes and drives them. Each adversarial class of
NUMERICS.md section 4 items 13-14 gets its own Hypothesis test, drawn within what the kernel
declares (KernelSpec's attention fields: a feature it lacks is never drawn); every example is
checked against the certified oracle within the derived componentwise bound (and the lse within
its own), for the special values of NUMERICS.md section 2, for an untouched input and for the
output's shape and dtype. One kernel call serves all of them. Metamorphic properties run on the
union of the dense classes; varlen cases are also checked sequence by sequence against each
sequence run alone.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from flashcheck.properties import attention as pa
from flashcheck.properties.fit import fitted, nothing_to_draw
from flashcheck.plugin.launches import RELATIONS, Launch
from flashcheck.properties.runner import check, check_all
from flashcheck.strategies.case import Case
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import attention_oracle
from flashcheck.oracles.formats import format_of, to_float64
from flashcheck.properties.attention import (
    CORE_PROPERTIES, METAMORPHIC_PROPERTIES, VARLEN_PROPERTIES, fit_to_declarations, outcome,
)
from flashcheck.properties.attention.sdpa import sdpa_error_ratio, sdpa_output
from flashcheck.strategies.attention import (
    CLASS_FEATURES, CLASSES, LAYOUTS, ODD_HEAD_DIMS, Caps, Shapes, attention_cases, case_inputs, class_strategy,
    is_varlen,
)
from flashcheck.strategies.attention_features import FEATURES as ATTENTION_FEATURES
from flashcheck.strategies.sample import draw_examples

FAMILY = "attention"
# The metamorphic test calls the kernel several times per example: smaller shapes on the CPU.
META_LIMITS = dict(max_m=32, max_n=48, max_head_dim=32) if INTERPRET else {}


# ---- tests -------------------------------------------------------------------------------------

def _class_strategy(spec: KernelSpec, dtype: torch.dtype, cls: str):
    """The class's strategy at the CPU defaults, or up to the kernel's head dim on a GPU, within
    the kernel's declared features."""
    limits = {} if INTERPRET else {"max_head_dim": spec.max_head_dim}
    return class_strategy(cls, dtype=dtype, caps=Caps.of(spec), shapes=Shapes.of(spec), **limits)


# What the draws aim at, for the skip message when a class draws nothing the kernel declares.
_DRAWS_AIM = "draws aim at declared head dims and square_only, not yet at the other declarations"


def _fit(spec: KernelSpec, case: Case) -> Case:
    """Reject a drawn case the kernel's declarations exclude (never call it on one). When a
    class draws nothing the declarations allow (e.g. only N = 128 on a CPU whose draws stay
    short), the test is skipped saying so, never failed (flashcheck.properties.fit)."""
    return fitted(spec, case, fit_to_declarations, hint=_DRAWS_AIM)


def _fixed_or_skip(spec: KernelSpec, case: Case) -> Case:
    fitted = fit_to_declarations(spec, case)
    if fitted is None:
        pytest.skip(f"{nothing_to_draw(spec).replace('every input this test draws', 'this case')} ({case.label}: "
                    f"q {tuple(case.tensors['q'].shape)}, k {tuple(case.tensors['k'].shape)}, {case.kwargs})")
    return fitted


def _skip_undeclared(spec: KernelSpec, cls: str) -> None:
    lacking = sorted(f for f in CLASS_FEATURES.get(cls, ()) if not spec.has(f))
    if lacking:
        pytest.skip(f"{spec.name} does not declare {lacking}")


@pytest.mark.parametrize("cls", sorted(CLASSES))
@given(data=st.data())
def test_adversarial_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
    _skip_undeclared(spec, cls)
    case = _fit(spec, data.draw(_class_strategy(spec, dtype, cls), label="case"))
    check_all(spec, CORE_PROPERTIES + (VARLEN_PROPERTIES if is_varlen(case) else ()), case)


# One test per relation: each compiles its own launch variants (configs, tunings, layouts), so
# under xdist they spread over the workers instead of one test compiling them all (over 9
# minutes for fp32 on an H100). Every relation still gets the profile's examples.
@pytest.mark.parametrize("relation", [r for r in METAMORPHIC_PROPERTIES if r not in RELATIONS])
@given(data=st.data())
def test_metamorphic(spec: KernelSpec, dtype: torch.dtype, relation: str, data: st.DataObject) -> None:
    case = _fit(spec, data.draw(attention_cases(dtype=dtype, caps=Caps.of(spec), shapes=Shapes.of(spec), **META_LIMITS), label="case"))
    check(spec, relation, case)


# The launch relations, one item per config or tuning (flashcheck.plugin.launches).
@given(data=st.data())
def test_launches(spec: KernelSpec, dtype: torch.dtype, launch: Launch, data: st.DataObject) -> None:
    case = _fit(spec, data.draw(attention_cases(dtype=dtype, caps=Caps.of(spec), shapes=Shapes.of(spec), **META_LIMITS), label="case"))
    check(launch.spec_for(spec), launch.relation, case)


def _fixed_case(dtype: torch.dtype, *, b=2, h=2, hkv=None, m=5, n=7, d=8, causal=False, kv_lens=None,
                **options) -> Case:
    g = torch.Generator().manual_seed(0)
    t = [torch.randn(b, hh, s, d, generator=g).to(dtype).to(DEVICE) for hh, s in ((h, m), (hkv or h, n), (hkv or h, n))]
    tensors = {"q": t[0], "k": t[1], "v": t[2]}
    if kv_lens is not None:
        tensors["kv_lens"] = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    return Case(tensors=tensors, kwargs={"causal": causal, "scale": None, **options}, label="fixed")


def test_bad_input_raises(spec: KernelSpec, dtype: torch.dtype) -> None:
    if not spec.validates_input:
        pytest.skip(f"{spec.name} does not declare input validation (capability validates_input)")
    check(spec, "rejects_bad_input", _fixed_case(dtype))


SPECIAL_CASES = {
    "kv_len_zero_and_one": dict(kv_lens=[0, 1]),
    "kv_len_zero_causal": dict(kv_lens=[0, 7], causal=True),
    "causal_m_gt_n": dict(m=9, n=4, causal=True),
    "causal_m_lt_n": dict(m=3, n=9, causal=True),
    "single_key": dict(n=1),
    # features (NUMERICS.md s. 4 item 14): skipped for a kernel that does not declare them
    "bottom_right_m_gt_n_empties_rows": dict(m=9, n=4, causal=True, causal_align="bottom_right"),
    "window_0_0": dict(window=(0, 0)),
    "window_wider_than_n_bottom_right": dict(window=(20, 20), causal_align="bottom_right", kv_lens=[3, 7]),
    "softcap_far_below": dict(softcap=0.01),
    "gqa_group_3": dict(h=6, hkv=2, m=3),
    "split_empty_and_more_splits_than_blocks": dict(kv_lens=[0, 7], num_splits=5),
}
_SPECIAL_NEEDS = {"window": "window", "softcap": "softcap", "num_splits": "splits", "hkv": "gqa"}


@pytest.mark.parametrize("which", sorted(SPECIAL_CASES))
def test_special_cases(spec: KernelSpec, dtype: torch.dtype, which: str) -> None:
    opts = SPECIAL_CASES[which]
    lacking = [f for key, f in _SPECIAL_NEEDS.items() if key in opts and not spec.has(f)]
    if lacking or opts.get("causal_align", "top_left") not in spec.causal_align:
        pytest.skip(f"{spec.name} does not declare {lacking or opts['causal_align']}")
    case = _fixed_or_skip(spec, _fixed_case(dtype, **opts))
    check_all(spec, CORE_PROPERTIES + ("ones_v", "hidden_and_layout_invariance"), case)


def test_nan_in_visible_key_and_value(spec: KernelSpec, dtype: torch.dtype) -> None:
    """NaN in a visible key: its rows NaN; in a visible value: that column of those rows NaN;
    everything else finite and within the bound."""
    case = _fixed_or_skip(spec, _fixed_case(dtype, kv_lens=[7, 4]))
    case.tensors["k"][0, 1, 3, 2] = float("nan")
    case.tensors["v"][1, 0, 2, 5] = float("nan")
    case.tensors["k"][1, 1, 6, 0] = float("nan")  # hidden (kv_len 4): must not leak
    case.tensors["v"][1, 1, 5, 1] = float("nan")  # hidden
    check_all(spec, CORE_PROPERTIES, case)
    y = to_float64(outcome(spec, case).out)
    assert np.isnan(y[0, 1]).all() and np.isnan(y[1, 0, :, 5]).all()
    assert np.isfinite(y[1, 1]).all() and np.isfinite(y[0, 0]).all()


def test_sdpa_error_ratio_reported(spec: KernelSpec, dtype: torch.dtype) -> None:
    """Our max error over SDPA's (same dtype, same device), both against the oracle: reported,
    not asserted (the FlashAttention suite's criterion). Run with -s to read the numbers."""
    ratios = []
    for case in draw_examples(CLASSES["benign"](dtype=dtype), 3):
        case = fit_to_declarations(spec, case)
        if case is None:
            continue
        q, k, v, kw = case_inputs(case)
        out = spec.fn(q, k, v, **kw)
        r = sdpa_error_ratio(out, sdpa_output(q, k, v, **kw), attention_oracle(q, k, v, **kw))
        assert r is None or (r >= 0 and not math.isnan(r))
        ratios.append(r)
    if not ratios:
        pytest.skip(nothing_to_draw(spec))
    print(f"\n{spec.name} [{format_of(dtype).name}] error / SDPA error on benign cases: {ratios}")


# ---- the strategies reach their classes ----------------------------------------------------------

def _scaled_spread(case: Case) -> float:
    q, k, v, kw = case_inputs(case)
    from flashcheck.oracles.attention import effective_scale

    q64, k64 = to_float64(q), to_float64(k)
    s = np.einsum("bhmd,bhnd->bhmn", np.nan_to_num(q64), np.nan_to_num(k64)) * effective_scale(kw["scale"],
                                                                                               q.shape[-1])
    return float((s.max(-1) - s.min(-1)).max()) if s.size else 0.0


def _raw_max_score(case: Case) -> float:
    q, k, _, _ = case_inputs(case)
    s = np.einsum("bhmd,bhnd->bhmn", to_float64(q), to_float64(k))
    return float(np.abs(s).max()) if s.size else 0.0


def _lens(case: Case) -> list[int]:
    kv = case.tensors.get("kv_lens")
    return kv.tolist() if kv is not None else []


def _is_bshd(t: torch.Tensor) -> bool:
    B, H, S, D = t.shape
    return t.stride() == (S * H * D, D, H * D, 1) and H > 1 and S > 1


def _hidden_poisoned(case: Case) -> bool:
    k, v = to_float64(case.tensors["k"]), to_float64(case.tensors["v"])
    fmt = format_of(case.tensors["k"].dtype)
    return any(n < k.shape[2] and not (np.isfinite(k[b, :, n:]).all() and np.abs(v[b, :, n:]).max() < fmt.max_finite)
               for b, n in enumerate(_lens(case)))


REACHES = {
    "benign": lambda cs: True,
    "wide_logit_spread": lambda cs: max(_scaled_spread(c) for c in cs) > 88,
    "fp16_overflowing_scores": lambda cs: all(_raw_max_score(c) > 65504 for c in cs),
    "odd_head_dims": lambda cs: any(c.tensors["q"].shape[-1] & (c.tensors["q"].shape[-1] - 1) for c in cs)
    and all(c.tensors["q"].shape[-1] in ODD_HEAD_DIMS for c in cs),
    "ragged_lengths": lambda cs: all(c.tensors["q"].shape[2] != c.tensors["k"].shape[2] for c in cs),
    "kv_lens_edges": lambda cs: {0, 1} <= {x for c in cs for x in _lens(c)}
    and any(c.tensors["k"].shape[2] in _lens(c) for c in cs)
    and any(x % 16 and 1 < x < c.tensors["k"].shape[2] for c in cs for x in _lens(c)),
    "causal_rectangular": lambda cs: all(c.kwargs["causal"] for c in cs)
    and any(c.tensors["q"].shape[2] > c.tensors["k"].shape[2] for c in cs)
    and any(c.tensors["q"].shape[2] < c.tensors["k"].shape[2] for c in cs),
    "fully_masked_rows": lambda cs: all(0 in _lens(c) for c in cs),
    "nan_in_hidden_kv": lambda cs: all(_hidden_poisoned(c) for c in cs if max(_lens(c)) < c.tensors["k"].shape[2])
    and any(np.isnan(to_float64(c.tensors["v"])).any() for c in cs),
    "nan_in_visible_kv": lambda cs: all(any(np.isnan(to_float64(c.tensors[n])).any() for n in "qkv") for c in cs),
    "strided_layouts": lambda cs: all(not c.tensors["q"].is_contiguous() and not c.label.endswith("/bhsd")
                                      for c in cs)
    and any(_is_bshd(c.tensors["q"]) for c in cs),
    "tied_scores": lambda cs: True,
}
# The feature classes: what the ci reachability test requires of them (the strategies' own feature
# table, strategies/attention_features.py), on 30 default draws.
for _cls in ("gqa_groups", "window_edges", "softcap_extremes", "attn_masks", "split_kv", "large_values_many_keys",
             "long_near_equal_scores", "varlen_batches"):
    REACHES[_cls] = (lambda cls: lambda cs: all(
        any(f.pred(c, format_of(c.tensors["q"].dtype)) for c in cs)
        for f in ATTENTION_FEATURES if f.cls == cls))(_cls)


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_strategy_reaches_its_class(cls: str) -> None:
    examples = draw_examples(CLASSES[cls](dtype=torch.float16), 30)
    assert REACHES[cls](examples), f"strategy {cls} never produced its defining input in 30 examples"


def test_every_layout_is_drawn() -> None:
    labels = {c.label.rsplit("/", 1)[-1] for c in draw_examples(attention_cases(dtype=torch.bfloat16), 60)}
    assert set(LAYOUTS) <= labels, labels
