"""Quality tests of the strategies: every adversarial class of NUMERICS.md section 4 is really drawn.

In the spirit of Hypothesis's own `find_any`, but stricter: the examples inspected are exactly the
ones the `ci` profile feeds to the property tests. `ci_draws` re-runs the real, @given-decorated
`flashcheck.suite.test_softmax.test_adversarial_class` for a node id, with the `ci` settings and the
per-test seed a suite run gives it (derandomized runs are seeded from the test function's digest
plus the key `flashcheck.suite.seed_key` makes of the node id), and records each case instead of running the kernel. A
feature listed below must appear in at least one of those 12 (ci `max_examples`) cases, for every
registered softmax kernel and dtype: what the CI run of that kernel really checks.

Size and layout features are cross-cutting: they must appear in some class test of the kernel and
dtype (every class draws its shape and layout the same way). Features that need long rows need
`max_n` > 1024, which every CPU run has (test_softmax.MAX_N = 2048).
"""
from __future__ import annotations

import math
from typing import Callable
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from flashcheck.kernels.registry import REGISTRY, KernelSpec
from flashcheck.oracles.formats import Format, format_of, round_float64, to_float64
from flashcheck.oracles.softmax import softmax_oracle
from flashcheck.strategies.attention_features import FEATURES as ATTENTION_FEATURES
from flashcheck.strategies.case import Case
from flashcheck.strategies.records import Feature, pow2 as _pow2
from flashcheck.strategies.softmax import CLASSES
from flashcheck.fixtures.store import storage_of
from flashcheck.suite import seed_key

NEG_INF = -math.inf
CI_PROFILE = "ci"


def _ci_settings() -> settings:
    ci = settings.get_profile(CI_PROFILE)
    # What the Hypothesis pytest plugin applies to parametrized tests (it only adds a health check).
    return settings(ci, suppress_health_check=set(ci.suppress_health_check) | {HealthCheck.differing_executors})


def node_id(spec: KernelSpec, dtype: torch.dtype, cls: str) -> str:
    """The key the suite's derandomized draws of this test are seeded from (flashcheck.suite.seed_key)."""
    return seed_key(f"test_{spec.family}.py", f"test_adversarial_class[{spec.name}-{format_of(dtype).name}-{cls}]")


softmax_node_id = node_id
_CACHE: dict[tuple[str, str, str], list[Case]] = {}


def ci_draws(spec: KernelSpec, dtype: torch.dtype, cls: str, *, node_id: str | None = None) -> list[Case]:
    """The cases `flashcheck/suite/test_<family>.py::test_adversarial_class[spec-dtype-cls]` draws
    under the ci profile, in order."""
    import importlib

    ts = importlib.import_module(f"flashcheck.suite.test_{spec.family}")
    node_id = node_id or globals()["node_id"](spec, dtype, cls)
    key = (node_id, spec.name, cls)
    if key in _CACHE:
        return _CACHE[key]
    wrapped = ts.test_adversarial_class
    inner = wrapped.hypothesis.inner_test
    cases: list[Case] = []

    def record(spec_: KernelSpec, name: str, case: Case) -> None:
        if name == ts.CORE_PROPERTIES[0]:
            cases.append(case)

    def record_all(spec_: KernelSpec, names, case: Case) -> None:
        cases.append(case)

    # The module runs its properties through check_all (softmax) or check (attention).
    hook, fake = ("check_all", record_all) if hasattr(ts, "check_all") else ("check", record)

    old_digest = getattr(inner, "_hypothesis_internal_add_digest", None)
    old_settings = wrapped._hypothesis_internal_use_settings
    try:
        inner._hypothesis_internal_add_digest = node_id.encode()
        wrapped._hypothesis_internal_use_settings = _ci_settings()
        with mock.patch.object(ts, hook, fake):
            wrapped(spec=spec, dtype=dtype, cls=cls)
    finally:
        wrapped._hypothesis_internal_use_settings = old_settings
        if old_digest is None:
            del inner._hypothesis_internal_add_digest
        else:
            inner._hypothesis_internal_add_digest = old_digest
    _CACHE[key] = cases
    return cases


# ---- feature predicates ------------------------------------------------------------------------

def _v(case: Case) -> np.ndarray:
    return to_float64(case.tensors["x"])


def _rows(case: Case) -> np.ndarray:
    v = _v(case)
    return v if v.size else np.zeros((0, 0))


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, int(n**0.5) + 1))


def any_row(pred: Callable[[np.ndarray], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: any(pred(r) for r in _rows(case))


def _lead_block_then_below_90(block: int) -> Callable[[np.ndarray], bool]:
    def pred(r: np.ndarray) -> bool:
        rest = r[block:]
        fin = rest[np.isfinite(rest)]
        return (len(r) > block and bool(np.all(r[:block] == NEG_INF)) and fin.size > 0
                and bool(np.all(fin < -90)) and not np.isnan(rest).any() and not (rest == np.inf).any())
    return pred


def _aligned_interior_block(min_block: int) -> Callable[[np.ndarray], bool]:
    """A whole aligned block (>= min_block, power of two) of -inf after some finite value."""
    def pred(r: np.ndarray) -> bool:
        n = len(r)
        ninf = r == NEG_INF
        b = min_block
        while b < n:
            for k in range(1, n // b):
                if ninf[k * b:(k + 1) * b].all() and np.isfinite(r[:k * b]).any():
                    return True
            b *= 2
        return False
    return pred


def _run_kind(kind: str) -> Callable[[np.ndarray], bool]:
    def pred(r: np.ndarray) -> bool:
        ninf, fin = r == NEG_INF, np.isfinite(r)
        if not fin.any() or not ninf.any():
            return False
        if kind == "prefix":
            return bool(ninf[0])
        if kind == "suffix":
            return bool(ninf[-1])
        idx = np.nonzero(fin)[0]
        return bool(ninf[idx[0]:idx[-1]].any())  # interior: a -inf between two finite values
    return pred


def _fully_masked_at(where: str) -> Callable[[Case, Format], bool]:
    def pred(case: Case, fmt: Format) -> bool:
        v = _rows(case)
        m = v.shape[0]
        full = [bool(np.all(r == NEG_INF)) for r in v]
        if m < 2 or all(full):
            return False
        idx = {"first": [0], "last": [m - 1], "middle": list(range(1, m - 1))}[where]
        return any(full[i] for i in idx)
    return pred


def _specials(has_nan: bool, has_pinf: bool, has_ninf: bool) -> Callable[[np.ndarray], bool]:
    return lambda r: (bool(np.isnan(r).any()) == has_nan and bool((r == np.inf).any()) == has_pinf
                      and bool((r == NEG_INF).any()) == has_ninf)


def nan_only_in_padding(case: Case, fmt: Format) -> bool:
    """A NaN-free row of the view with NaN guard elements between it and the next row."""
    x = case.tensors["x"]
    m, n = x.shape
    s0, s1 = x.stride()
    if m < 2 or n < 1 or s0 <= (n - 1) * s1 + 1:
        return False
    storage = storage_of(x).cpu()
    v = _rows(case)
    for i in range(m - 1):
        gap = storage[x.storage_offset() + i * s0 + (n - 1) * s1 + 1: x.storage_offset() + (i + 1) * s0]
        if not np.isnan(v[i]).any() and gap.numel() and bool(torch.isnan(gap.float()).all()):
            return True
    return False


def _shape(pred: Callable[[int, int], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: pred(*case.tensors["x"].shape)


def _layout(pred: Callable[[torch.Tensor], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: pred(case.tensors["x"])


def _near_pow2(offset: int) -> Callable[[int, int], bool]:
    return lambda m, n: n >= 64 and _pow2(n - offset)


def _peak_in_tail(r: np.ndarray) -> bool:
    n = len(r)
    return n >= 65 and _pow2(n - 1) and r[-1] == r.max() and r[-1] - np.median(r) >= 19


def _k_maxima(r: np.ndarray) -> bool:
    fin = r[np.isfinite(r)]
    k = fin.size
    return (k >= 2 and _pow2(k) and bool(np.all(fin == fin[0])) and bool(np.all(r[~np.isfinite(r)] == NEG_INF))
            and k < len(r))


def _constant_pow2(r: np.ndarray) -> bool:
    return len(r) >= 2 and _pow2(len(r)) and bool(np.all(np.isfinite(r))) and bool(np.all(r == r[0]))


def subnormal_inputs(case: Case, fmt: Format) -> bool:
    a = np.abs(_v(case))
    return bool(((a > 0) & (a < fmt.min_normal)).any())


def subnormal_outputs(case: Case, fmt: Format) -> bool:
    y = np.abs(softmax_oracle(_v(case), fmt))
    return bool(((y > 0) & (y < fmt.min_normal)).any())


def _long_uniform(exact: bool) -> Callable[[np.ndarray], bool]:
    def pred(r: np.ndarray) -> bool:
        if len(r) < 1024 or not np.isfinite(r).all():
            return False
        spread = r.max() - r.min()
        return spread == 0 if exact else 0 < spread <= 0.01
    return pred


def _halfway(case: Case, fmt: Format) -> bool:
    """A long row whose most common logit has an exponential (against the row max) that rounding to
    `fmt` moves down by >= 3/4 of the unit roundoff, and another logit's that it moves up as much:
    what 16-bit terms of the sum get wrong in one direction (strategies.softmax._halfway_row)."""
    u = fmt.unit_roundoff
    for r in _rows(case):
        if len(r) < 1024 or not np.isfinite(r).all():
            continue
        vals, counts = np.unique(r - r.max(), return_counts=True)
        e = np.exp(vals)
        rel = (round_float64(e, fmt) - e) / e
        if rel[np.argmax(counts)] <= -0.75 * u and (rel >= 0.75 * u).any():
            return True
    return False


def _increasing(min_rise: float, block: int = 256) -> Callable[[np.ndarray], bool]:
    """The max of every chunk of `block` exceeds the previous chunk's (>= 3 chunks)."""
    def pred(r: np.ndarray) -> bool:
        n = len(r)
        if n <= 2 * block or not np.isfinite(r).all():
            return False
        maxima = [r[i:i + block].max() for i in range(0, n, block)]
        return bool(np.all(np.diff(maxima) > 0)) and maxima[-1] - r[0] >= min_rise
    return pred


def _all_below(limit: float) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: _v(case).size > 0 and bool(np.all(_v(case) < limit)) and bool(np.isfinite(_v(case)).all())


def _spread_underflows(r: np.ndarray) -> bool:
    fin = r[np.isfinite(r)]
    return fin.size >= 4 and np.mean(fin < fin.max() - 104) >= 0.5


FEATURES = [
    # 1. huge magnitudes
    Feature("huge_magnitude", "near_dtype_max", lambda c, f: bool((np.abs(_v(c)) >= f.max_finite / 2).any())),
    Feature("huge_magnitude", "offset_1000_rows", any_row(lambda r: bool(np.isfinite(r).all() and r.min() >= 1000
                                                                             and r.max() - r.min() <= 64))),
    Feature("huge_magnitude", "spread_far_above_88", any_row(_spread_underflows)),
    # 2. all very negative
    Feature("very_negative", "all_below_-1e5", _all_below(-1e5), dtypes=("bf16", "fp32")),
    Feature("very_negative", "all_below_-1.1e4", _all_below(-1.1e4), dtypes=("fp16",)),
    Feature("very_negative", "all_below_-5e4", _all_below(-5e4), dtypes=("fp16",)),
    # 3. -inf padding
    Feature("neg_inf_padding", "lead_block_1024_then_below_-90", any_row(_lead_block_then_below_90(1024)),
            needs_n=1025),
    Feature("neg_inf_padding", "lead_block_256_then_below_-90", any_row(_lead_block_then_below_90(256)),
            needs_n=257),
    Feature("neg_inf_padding", "prefix_run", any_row(_run_kind("prefix"))),
    Feature("neg_inf_padding", "suffix_run", any_row(_run_kind("suffix"))),
    Feature("neg_inf_padding", "interior_run", any_row(_run_kind("interior"))),
    Feature("neg_inf_padding", "interior_aligned_block_256+", any_row(_aligned_interior_block(256)), needs_n=513),
    # 4. fully -inf rows
    Feature("fully_masked", "first_row", _fully_masked_at("first")),
    Feature("fully_masked", "middle_row", _fully_masked_at("middle")),
    Feature("fully_masked", "last_row", _fully_masked_at("last")),
    # 5. NaN and +inf
    Feature("nan_inf", "nan_alone", any_row(_specials(True, False, False))),
    Feature("nan_inf", "pos_inf_alone", any_row(_specials(False, True, False))),
    Feature("nan_inf", "nan_with_neg_inf", any_row(_specials(True, False, True))),
    Feature("nan_inf", "pos_inf_with_neg_inf", any_row(_specials(False, True, True))),
    Feature("nan_inf", "nan_only_in_padding", nan_only_in_padding),
    # 6. sizes
    Feature(None, "n_1", _shape(lambda m, n: n == 1)),
    Feature(None, "n_pow2_minus_1", _shape(_near_pow2(-1))),
    Feature(None, "n_pow2", _shape(_near_pow2(0))),
    Feature(None, "n_pow2_plus_1", _shape(_near_pow2(1))),
    Feature(None, "n_half_block_mod_block", _shape(lambda m, n: any(n % b == b // 2 for b in (256, 512, 1024)))),
    Feature(None, "n_prime", _shape(lambda m, n: n >= 100 and _is_prime(n))),
    Feature(None, "n_over_1024", _shape(lambda m, n: n > 1024), needs_n=1025),
    Feature(None, "m_1", _shape(lambda m, n: m == 1)),
    Feature(None, "m_5_or_more", _shape(lambda m, n: m >= 5)),
    # 7. layouts
    Feature(None, "transposed", _layout(lambda x: min(x.shape) > 1 and x.stride(0) < x.stride(1))),
    Feature(None, "column_step", _layout(lambda x: x.shape[1] > 1 and x.stride(0) > x.stride(1) > 1)),
    Feature(None, "row_stride_over_n", _layout(lambda x: x.shape[0] > 1 and x.stride(1) == 1
                                               and x.stride(0) > x.shape[1])),
    Feature(None, "storage_offset", _layout(lambda x: x.storage_offset() > 0)),
    # 8. peaked
    Feature("peaked", "n_pow2_plus_1_peak_in_tail", any_row(_peak_in_tail)),
    # 9. ties
    Feature("ties", "k_maxima_pow2", any_row(_k_maxima)),
    Feature("ties", "constant_row_pow2_n", any_row(_constant_pow2)),
    # 10. subnormals
    Feature("subnormal", "subnormal_inputs", subnormal_inputs),
    Feature("subnormal", "subnormal_outputs", subnormal_outputs),
    # 11. long uniform
    Feature("long_uniform", "long_exactly_uniform", any_row(_long_uniform(True))),
    Feature("long_uniform", "long_nearly_uniform", any_row(_long_uniform(False))),
    Feature("long_uniform", "halfway_exponentials", _halfway, dtypes=("fp16", "bf16"), needs_n=1024),
    # 12. increasing across blocks
    Feature("increasing", "increasing_every_block_256", any_row(_increasing(0.0)), needs_n=769),
    Feature("increasing", "increasing_rise_over_88", any_row(_increasing(88.0)), needs_n=769),
]


def _unreached(features, draws: dict[str, list[Case]], fmt, max_n: int | None = None) -> list[str]:
    """Names of the features no draw has: per class (`f.cls`) or among all draws (None)."""
    every = [c for cases in draws.values() for c in cases]
    missing = []
    for f in features:
        if fmt.name not in f.dtypes or (max_n is not None and f.needs_n > max_n):
            continue
        pool = every if f.cls is None else draws.get(f.cls, [])
        if not any(f.pred(c, fmt) for c in pool):
            missing.append(f"{f.cls or 'any'}/{f.name}")
    return missing


def missing_features(spec: KernelSpec, dtype: torch.dtype, *, salt: str = "") -> list[str]:
    """Features of `FEATURES` that the ci draws of `spec` and `dtype` never reach."""
    from flashcheck.suite import test_softmax as ts

    draws = {cls: ci_draws(spec, dtype, cls, node_id=node_id(spec, dtype, cls) + salt)
             for cls in sorted(CLASSES)}
    return _unreached(FEATURES, draws, format_of(dtype), ts.max_n_for(spec))


# ---- tests -------------------------------------------------------------------------------------

SOFTMAX = [s for s in REGISTRY if s.family == "softmax"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda d: format_of(d).name)
@pytest.mark.parametrize("kernel", SOFTMAX, ids=lambda s: s.name)
def test_ci_draws_reach_every_softmax_feature(kernel: KernelSpec, dtype: torch.dtype) -> None:
    # (not named `spec`: conftest would parametrize it over the kernel under test, and with
    # --kernel this module is not part of the suite a kernel runs)
    if dtype not in kernel.dtypes:
        pytest.skip(f"{kernel.name} does not take {dtype}")
    missing = missing_features(kernel, dtype)
    assert not missing, (f"the ci run of {kernel.name} [{format_of(dtype).name}] never draws: {missing}")


def test_ci_draws_use_the_ci_budget() -> None:
    """The recorder sees exactly what the ci profile runs: max_examples cases per class test."""
    spec = SOFTMAX[0]
    budget = settings.get_profile(CI_PROFILE).max_examples
    for cls in sorted(CLASSES):
        cases = ci_draws(spec, torch.float16, cls)
        assert 0 < len(cases) <= budget
    assert len(ci_draws(spec, torch.float16, "benign")) == budget


def test_ci_draws_are_deterministic() -> None:
    spec = SOFTMAX[0]
    a = ci_draws(spec, torch.float32, "neg_inf_padding")
    _CACHE.clear()
    b = ci_draws(spec, torch.float32, "neg_inf_padding")
    assert [c.label for c in a] == [c.label for c in b]
    assert all(torch.equal(x.tensors["x"].nan_to_num(), y.tensors["x"].nan_to_num()) for x, y in zip(a, b))
    # A suite run seeds the test from the key the recorder uses (flashcheck/suite/conftest.py), not
    # from the node id Hypothesis gave it.
    from pathlib import Path
    from types import SimpleNamespace

    from flashcheck.suite import conftest

    inner = SimpleNamespace(_hypothesis_internal_add_digest=b"the node id")
    nodeid = node_id(spec, torch.float32, "neg_inf_padding").split("::", 1)[1]
    conftest.pytest_runtest_call(SimpleNamespace(obj=SimpleNamespace(hypothesis=SimpleNamespace(inner_test=inner)),
                                                 path=Path("site-packages/flashcheck/suite/test_softmax.py"),
                                                 nodeid=f"site-packages/flashcheck/suite/test_softmax.py::{nodeid}"))
    assert inner._hypothesis_internal_add_digest == node_id(spec, torch.float32, "neg_inf_padding").encode()


# ---- attention (NUMERICS.md section 4, item 13): the feature table is strategies/attention_features.py

def missing_attention_features(spec: KernelSpec, dtype: torch.dtype) -> list[str]:
    """Features the ci draws never reach, among the classes the kernel's declared features allow
    (a class it cannot take is skipped in its suite, so its features are not required)."""
    from flashcheck.strategies.attention import Caps, classes_for

    allowed = classes_for(Caps.of(spec))
    draws = {cls: ci_draws(spec, dtype, cls) for cls in sorted(allowed)}
    features = [f for f in ATTENTION_FEATURES if f.cls is None or f.cls in allowed]
    return _unreached(features, draws, format_of(dtype))


ATTENTION = [s for s in REGISTRY if s.family == "attention"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda d: format_of(d).name)
@pytest.mark.parametrize("kernel", ATTENTION, ids=lambda s: s.name)
def test_ci_draws_reach_every_attention_feature(kernel: KernelSpec, dtype: torch.dtype) -> None:
    if dtype not in kernel.dtypes:
        pytest.skip(f"{kernel.name} does not take {dtype}")
    missing = missing_attention_features(kernel, dtype)
    assert not missing, (f"the ci run of {kernel.name} [{format_of(dtype).name}] never draws: {missing}")




def test_attention_draws_aim_at_declared_head_dims_and_square_shapes() -> None:
    """A kernel declaring square_only and head dims {16, 32, 64, 128} had every adversarial class
    skipped ("declarations exclude every input this test draws"): draws now aim at them."""
    from flashcheck.strategies.attention import CLASSES as ATTN, SHAPE_BY_DESIGN, Caps, Shapes, class_strategy, is_varlen
    from flashcheck.strategies.sample import draw_examples

    shapes = Shapes(head_dims=(16, 32, 64, 128), square=True)
    rates = {}
    for cls in sorted(set(ATTN) - SHAPE_BY_DESIGN):
        cases = draw_examples(class_strategy(cls, dtype=torch.float32, caps=Caps(), shapes=shapes), 12)
        fit = [c for c in cases if not is_varlen(c) and c.tensors["q"].shape[-1] in shapes.head_dims
               and c.tensors["q"].shape[-2] == c.tensors["k"].shape[-2]]
        rates[cls] = len(fit) / len(cases)
    # every class reaches the declared shapes (a one-query-row or two-key draw may still miss them)
    assert min(rates.values()) > 0 and sum(rates.values()) / len(rates) >= 0.75, rates


@pytest.mark.parametrize("compile_aware", [False, True])
def test_layouts_never_alias_an_element(compile_aware: bool) -> None:
    """Every layout `place` builds is a view in which no two elements share memory, with the GPU's
    odd pitches (COMPILE_AWARE) too: an aliased input is legal for a kernel, but a property that
    writes one element (varlen isolation poisons a neighbour) then writes another unseen."""
    from flashcheck.strategies import attention_build as ab

    with mock.patch.object(ab, "COMPILE_AWARE", compile_aware):
        for layout in ab.LAYOUTS:
            for shape in [(1, 2, 6, 1), (2, 3, 5, 2), (1, 1, 1, 1), (2, 2, 17, 16), (1, 4, 33, 3)]:
                for pad in range(1, 10):
                    strides, off, size = ab._layout_geometry(layout, shape, pad, 1)
                    idx = np.indices(shape).reshape(len(shape), -1).T @ np.array(strides) + off
                    assert len(np.unique(idx)) == idx.size, (layout, shape, pad, strides)
                    assert idx.max() < size, (layout, shape, pad)
