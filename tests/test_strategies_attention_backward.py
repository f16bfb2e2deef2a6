"""The attention backward strategies (strategies/attention_backward.py) draw valid, adversarial cases:
what each class says it draws, checked on the oracle's own quantities (`attention_backward_quantities`:
P, dP, D, the scores, the gradients), `needs` honest, modes that shrink to the simplest, the same
cases under a fixed seed. Derandomized draws at the CPU defaults, few of them: the file's default
tests run in well under a minute on one core."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, find, given, settings

from flashcheck.kernels import INTERPRET
from flashcheck.oracles.attention_backward import attention_backward_quantities
from flashcheck.oracles.formats import FP16, format_of, to_float64
from flashcheck.strategies import attention_backward as ab
from flashcheck.strategies.attention import is_varlen
from flashcheck.strategies.attention_build import Caps
from flashcheck.strategies.sample import draw_examples
from tests.test_strategies_ce import reaches

# `reaches` stops a search by failing it: Hypothesis's report of that case prints its tensors whole
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CPU_CLASSES = [c for c in ab.BACKWARD_CLASSES if c not in ab.GPU_ONLY]
EXAMPLES = 6
SHRINK = settings(max_examples=200, database=None, derandomize=True, deadline=None,
                  suppress_health_check=list(HealthCheck))
_DRAWS: dict = {}


def quantities(case) -> list:
    """The oracle's `AttentionBackward` of each call the case stands for (one per varlen sequence)."""
    return [attention_backward_quantities(q, k, v, do, **kw) for _, q, k, v, do, kw in ab.backward_calls(case)]


def draws(name: str, dtype, n: int = EXAMPLES) -> list:
    """The first `n` derandomized cases of a class, with their quantities (cached)."""
    if (name, dtype, n) not in _DRAWS:
        cases = draw_examples(ab.backward_class_strategy(name, dtype=dtype), n)
        _DRAWS[name, dtype, n] = [(c, quantities(c)) for c in cases]
    return _DRAWS[name, dtype, n]


def _mode(case) -> str:
    return case.label.split("/")[1]


def _rows_seeing(r, at_least: int = 1) -> np.ndarray:
    return r.visible.sum(-1) >= at_least


def _values(case, name: str) -> np.ndarray:
    return to_float64(case.tensors[name])


def used_features(case) -> set[str]:
    """The attention features (kernels.attention_spec.ATTENTION_FEATURES) a case uses."""
    q, k, v, kw = case.tensors["q"], case.tensors["k"], case.tensors["v"], case.kwargs
    used = {f for f, on in (("gqa", q.shape[1] != k.shape[1]), ("dv", v.shape[-1] != q.shape[-1]),
                            ("varlen", is_varlen(case)), ("kv_lens", "kv_lens" in case.tensors),
                            ("attn_mask", "attn_mask" in case.tensors), ("causal", bool(kw.get("causal"))),
                            ("window", kw.get("window") is not None), ("softcap", bool(kw.get("softcap"))),
                            ("splits", bool(kw.get("num_splits")))) if on}
    return used


def layout_of(t: torch.Tensor) -> str:
    """Which of `DO_LAYOUTS` a (B, H, S, D) view is in (the strides `attention_build.place` gives)."""
    st = t.stride()
    if st[3] != 1 and st[2] == 1 and t.shape[2] > 1:
        return "transposed"
    if st[3] == 2:
        return "dstep"
    if t.shape[1] > 1 and st[1] < st[2]:
        return "bshd"
    return "bhsd" if st[2] == t.shape[3] and st[1] == t.shape[2] * t.shape[3] else "padded"


# ---- what every class draws ---------------------------------------------------------------------

def _confident(case, rs):
    """P >= 0.99 on one key of every row that sees one; inside the mode's window where the row sees
    another key too (a row that sees one key has P = 1)."""
    lo, hi = ab.CONFIDENT[_mode(case)]
    for r in rs:
        top = r.p.max(-1)
        assert (top[_rows_seeing(r)] >= 0.99).all(), top.min()
        assert ((top >= lo) & (top <= hi))[_rows_seeing(r, 2)].all(), (lo, hi, top)


def _tied(case, rs):
    for r in rs:
        t = np.where(r.visible, r.t, -np.inf)
        ties = (t == t.max(-1, keepdims=True)).sum(-1)
        assert (ties[_rows_seeing(r, 2)] >= 2).all()


def _single_key(case, rs):
    assert case.tensors["k"].shape[2] == 1
    for r in rs:
        assert (r.dq == 0).all() and (r.dk == 0).all()


def _dp_all(r) -> np.ndarray:
    """dO_i . v_j of every pair, masked ones too (a kernel computes a whole block's)."""
    return r.inputs["do"] @ np.swapaxes(np.repeat(r.inputs["v"], r.dq.shape[1] // r.dk.shape[1], 1), -1, -2)


def _large_do(case, rs):
    fmt, mode = format_of(case.tensors["q"].dtype), _mode(case)
    for r in rs:
        assert all(np.isfinite(g).all() for g in r.grads)
        top = max(float(np.abs(x).max(initial=0)) for x in (r.inputs["do"], _dp_all(r), r.ds, *r.grads))
        if mode == "near_max":
            assert top >= fmt.max_finite / 64, top
        if mode == "past_fp16":
            assert float(np.abs(r.ds).max()) > FP16.max_finite


def _do_zeros(case, rs):
    do, mode = _values(case, "do"), _mode(case)
    zero = do == 0
    if mode == "rows":
        assert zero.all(-1).any()
    elif mode == "columns":
        assert zero.all(-2).any()
    elif mode == "all":
        assert zero.all()
    elif mode == "at_peak":
        peak = np.argmax(np.abs(rs[0].o), axis=-1)
        assert np.take_along_axis(zero, peak[..., None], -1).all()
    else:
        assert zero.any()
    # -0 exactly where the label says
    assert np.signbit(do[zero]).any() == ("/neg/" in case.label)


def _dp_near_d(case, rs):
    for r in rs:
        live = _rows_seeing(r)
        if _mode(case) == "exact":
            assert (r.dq == 0).all() and (r.dk == 0).all()
            continue
        # against the size of dP's terms, sum_d |dO_id v_jd| (what a kernel's dP errs by a fraction of)
        terms = np.where(r.visible, np.abs(r.inputs["do"]) @ np.swapaxes(np.abs(r.inputs["v"]), -1, -2), 0.0)
        gap = np.abs(np.where(r.visible, r.dp - r.D[..., None], 0.0)).max(-1)
        ratio = gap[live] / np.maximum(terms.max(-1)[live], 1e-300)
        assert ratio.size == 0 or np.median(ratio) <= 2.0**-3, np.median(ratio)


def _strided_do(case, rs):
    assert all(case.tensors[n].is_contiguous() for n in "qkv") and not case.tensors["do"].is_contiguous()


def _strided_views(case, rs):
    layouts = [layout_of(case.tensors[n]) for n in ("q", "k", "v", "do")]
    assert len(set(layouts)) == 4, layouts


def _off_block(case, rs):
    assert case.tensors["q"].shape[2] in ab.OFF_BLOCK and case.tensors["k"].shape[2] in ab.OFF_BLOCK
    assert case.tensors["q"].shape[1] == 2


def _masked(case, rs):
    """Some row sees no key or some key is seen by no row; their gradients are +0 exactly."""
    for r in rs:
        rows, keys = ~_rows_seeing(r), ~r.visible.any(-2)
        assert rows.any() or keys.any(), case
        assert (r.dq[rows] == 0).all() and not np.signbit(r.dq[rows]).any()
        assert (r.dk[keys] == 0).all() and (r.dv[keys] == 0).all()
    if case.label.split("/")[0] == "masked_rows_bool":
        m = case.tensors["attn_mask"]
        assert m.dtype == torch.bool and bool((~m).all(-1).any())


def _softcap(case, rs):
    for r in rs:
        z = np.abs(r.y[r.visible]) / r.softcap
        if z.size:
            assert z.max() > 88
            assert _mode(case) != "all_saturated" or z.min() > 88, z.min()


CHECKS = {"confident": _confident, "tied_maxima": _tied, "single_key": _single_key, "large_do": _large_do,
          "do_zeros": _do_zeros, "dp_near_d": _dp_near_d, "strided_do": _strided_do,
          "strided_views": _strided_views, "off_block_sizes": _off_block, "masked_rows": _masked,
          "masked_rows_bool": _masked, "softcap_saturated": _softcap}


def check_case(case, rs, dtype) -> None:
    """What every case holds: q, k, v, do of the dtype, dO shaped as the output and guarded by NaN,
    every oracle call decided with no NaN or inf gradient (poisons stay where nothing reads them)."""
    t = case.tensors
    assert all(t[n].dtype == dtype for n in ("q", "k", "v", "do"))
    assert tuple(t["do"].shape) == (*t["q"].shape[:-1], t["v"].shape[-1])
    storage = torch.tensor([], dtype=dtype).set_(t["do"].untyped_storage())
    inside = np.zeros(storage.numel(), bool)
    idx = np.indices(t["do"].shape).reshape(t["do"].dim(), -1)
    inside[t["do"].storage_offset() + (np.array(t["do"].stride())[:, None] * idx).sum(0)] = True
    assert torch.isnan(storage[torch.from_numpy(~inside)]).all()
    for r in rs:
        assert all(np.isfinite(g).all() for g in r.grads), case


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
@pytest.mark.parametrize("name", CPU_CLASSES)
def test_class_draws_what_it_says(name, dtype):
    for case, rs in draws(name, dtype):
        assert case.label.split("/")[0] == name
        check_case(case, rs, dtype)
        CHECKS.get(name, lambda c, r: None)(case, rs)
        for feature in ab.BACKWARD_CLASS_FEATURES.get(name, ()):
            assert feature in used_features(case), (feature, case)


@pytest.mark.parametrize("name", CPU_CLASSES)
def test_needs_is_honest(name):
    """Given only the features it needs (no causal, no kv_lens, no Dv != D), a class draws nothing else."""
    needs = ab.BACKWARD_CLASS_FEATURES.get(name, frozenset())
    for case in draw_examples(ab.backward_class_strategy(name, dtype=torch.float16, caps=Caps(features=needs)), 8):
        assert used_features(case) <= needs, (used_features(case), case)
    assert needs <= set(Caps().features)


def test_tables():
    assert list(ab.BACKWARD_CLASSES) == [r.name for r in ab.BACKWARD_CLASS_RECORDS]
    assert ab.NOT_IN_UNION == {"varlen_batches", "big_offsets"}
    plain = ab.backward_classes_for(Caps(features=frozenset()))
    assert "gqa_groups" not in plain and "masked_rows" not in plain and "benign" in plain
    assert ("big_offsets" in ab.backward_classes_for()) != INTERPRET
    labels = set()
    for case in draw_examples(ab.attention_backward_cases(dtype=torch.float32, caps=Caps(features=frozenset({"gqa"}))),
                              20):
        labels.add(case.label.split("/")[0])
        assert used_features(case) <= {"gqa"} and not is_varlen(case)
    assert labels <= set(ab.backward_classes_for(Caps(features=frozenset({"gqa"})))) and len(labels) >= 3


MODES = {"confident": tuple(ab.CONFIDENT), "tied_maxima": ab.TIE_KINDS, "large_do": ab.LARGE_KINDS,
         "do_zeros": ab.DO_ZERO_KINDS, "dp_near_d": ab.DP_KINDS, "masked_rows": ab.MASKED_KINDS,
         "masked_rows_bool": ab.BOOL_MASK_SHAPES, "softcap_saturated": ab.SOFTCAP_KINDS}


@pytest.mark.parametrize("name, mode", [(n, m) for n, modes in MODES.items() for m in modes])
def test_every_mode_draws_what_it_says(name, mode):
    """Each mode of each class, drawn (bf16; fp32 for P rounding to 1 in fp32), checked as above."""
    dtype = torch.float32 if mode == "fp32_one" else torch.bfloat16
    case = reaches(ab.backward_class_strategy(name, dtype=dtype), lambda c: _mode(c) == mode, n=100)
    rs = quantities(case)
    check_case(case, rs, dtype)
    CHECKS[name](case, rs)


def test_compile_aware_geometry():
    """On a GPU every class draws inside a compile-aware geometry (attention_build.GEOMETRIES); dO
    then takes the geometry's layout, except where a class's point is the layout."""
    from flashcheck.strategies import attention_build

    with mock.patch.object(attention_build, "COMPILE_AWARE", True):
        for name in CPU_CLASSES:
            for case in draw_examples(ab.backward_class_strategy(name, dtype=torch.float16), 3):
                if not is_varlen(case) and not name.startswith("strided"):
                    assert layout_of(case.tensors["do"]) in (layout_of(case.tensors["q"]), "bhsd"), case
                assert all(np.isfinite(g).all() for r in quantities(case) for g in r.grads)


# ---- reached within the first draws ------------------------------------------------------------

@pytest.mark.parametrize("name, pred", [
    ("gqa_groups", lambda c: c.tensors["q"].shape[1] == 4 and c.tensors["k"].shape[1] == 2),
    ("gqa_groups", lambda c: c.tensors["q"].shape[1] == 8 and c.tensors["k"].shape[1] == 1),
    ("varlen_batches", lambda c: any(x <= 1 for x in np.diff(c.tensors["cu_seqlens_q"].tolist()))
     and max(np.diff(c.tensors["cu_seqlens_q"].tolist())) >= 17),
    ("masked_rows", lambda c: c.label.split("/")[1:3] == ["empty_rows_causal", "nan"]),
    ("masked_rows_bool", lambda c: bool((~c.tensors["attn_mask"]).all(-2).any())),  # a key no row sees
    ("off_block_sizes", lambda c: 129 in (c.tensors["q"].shape[2], c.tensors["k"].shape[2])),
    ("do_zeros", lambda c: bool(np.signbit(_values(c, "do")[_values(c, "do") == 0]).any())),
    ("strided_do", lambda c: layout_of(c.tensors["do"]) == "transposed" and c.tensors["do"].storage_offset() % 8 != 0),
    ("large_do", lambda c: c.label.startswith("large_do/past_fp16")),
], ids=lambda x: x if isinstance(x, str) else "")
def test_reaches(name, pred):
    dtype = torch.bfloat16
    reaches(ab.backward_class_strategy(name, dtype=dtype), pred, n=200)


def test_masked_rows_poison_reaches_do_and_hidden_kv():
    """NaN in the empty rows' dO and in the hidden keys: the oracle's gradients have none."""
    case = reaches(ab.backward_masked_rows(dtype=torch.float16),
                   lambda c: c.label.split("/")[1:3] == ["empty_batch", "nan"])
    r, = quantities(case)
    empty = ~_rows_seeing(r)
    assert np.isnan(r.inputs["do"][np.broadcast_to(empty, r.inputs["do"].shape[:3])]).all()
    assert np.isnan(r.inputs["k"][0]).all() and all(not np.isnan(g).any() for g in r.grads)


def test_varlen_calls_are_one_per_sequence():
    case, rs = draws("varlen_batches", torch.float16, 3)[-1]
    cu = case.tensors["cu_seqlens_q"].tolist()
    calls = ab.backward_calls(case)
    assert len(calls) == len(cu) - 1 == len(rs)
    for (rows, q, k, v, do, kw), a, b in zip(calls, cu, cu[1:]):
        assert rows == slice(a, b) and do.shape == (1, q.shape[1], b - a, v.shape[-1])


# ---- shrinking and determinism -----------------------------------------------------------------

FIRST_MODES = {"confident": "p99", "tied_maxima": "pair", "large_do": "moderate", "do_zeros": "rows",
               "dp_near_d": "near_equal_values", "masked_rows": "empty_batch", "masked_rows_bool": "full",
               "softcap_saturated": "mixed"}


@pytest.mark.parametrize("name", sorted(FIRST_MODES))
def test_the_simplest_draw_is_the_first_mode(name):
    """The draw every choice of which is the simplest (Hypothesis makes it first, and shrinking
    heads for it): the first mode, M = 1, contiguous, a constant dO."""
    case = draw_examples(ab.backward_class_strategy(name, dtype=torch.float32), 1)[0]
    assert _mode(case) == FIRST_MODES[name] and case.tensors["q"].shape[2] == 1, case
    assert all(case.tensors[n].is_contiguous() for n in ("q", "k", "v", "do"))
    do = _values(case, "do")
    assert np.unique(do[do != 0]).size <= 1, do  # do_zeros: a constant and its zeros


@pytest.mark.parametrize("name", ["confident", "do_zeros", "dp_near_d"])
def test_shrinks_to_the_simplest_mode(name):
    """A search for a case with two query rows shrinks back to the first mode and M = 2 (small
    limits: shrinking draws hundreds of cases)."""
    strategy = ab.backward_class_strategy(name, dtype=torch.float32, max_m=4, max_n=4, max_head_dim=4, max_bh=1)
    case = find(strategy, lambda c: c.tensors["q"].shape[2] >= 2, settings=SHRINK)
    assert _mode(case) == FIRST_MODES[name] and case.tensors["q"].shape[2] == 2, case


def test_deterministic_under_a_fixed_seed():
    for name in ("confident", "masked_rows_bool", "varlen_batches"):
        a, b = (draw_examples(ab.backward_class_strategy(name, dtype=torch.bfloat16), 4) for _ in range(2))
        for x, y in zip(a, b):
            assert x.label == y.label and x.kwargs == y.kwargs and set(x.tensors) == set(y.tensors)
            for n, t in x.tensors.items():
                u = y.tensors[n]
                assert t.stride() == u.stride() and t.storage_offset() == u.storage_offset()
                assert np.array_equal(to_float64(t), to_float64(u), equal_nan=True)


# ---- element offsets past 2^31 -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ab.BIG_KINDS)
def test_big_offset_layouts(kind):
    """One kind of offset past 2^31 in each case, every stride under 2^31; dO shaped as the output."""
    lay = ab.big_offset_layouts(kind)
    last = {n: sum((s - 1) * st for s, st in zip(shape, strides)) for n, (shape, strides) in lay.items()}
    assert max(last.values()) >= ab.INT32_LIMIT
    assert all(st < ab.INT32_LIMIT for _, strides in lay.values() for st in strides)
    (qs, _), (ks, _), (vs, _), (ds, _) = (lay[n] for n in ("q", "k", "v", "do"))
    assert ds == (*qs[:3], vs[3]) and ks[:3] == vs[:3] and qs[1] % ks[1] == 0
    if kind == "do_rows":
        assert last["do"] >= ab.INT32_LIMIT > last["q"]


def test_big_offsets_is_never_drawn_under_the_interpreter():
    if not INTERPRET:
        pytest.skip("the interpreter's refusal")
    with pytest.raises(RuntimeError, match="GPU only"):
        draw_examples(ab.backward_big_offsets(dtype=torch.float16), 1)


def test_big_offsets_assembly_on_small_storages():
    """The GPU class's assembly (kinds, views in NaN storages, the oracle's calls) on the CPU, with
    its strides shrunk so the storages fit: every view's elements are drawn values, the rest NaN."""
    from flashcheck.strategies import attention_backward_options as ao

    small = {k: {n: (shape, tuple(min(st, 97) if st > 1000 else st for st in strides))
                 for n, (shape, strides) in ao.big_offset_layouts(k, 4).items()} for k in ab.BIG_KINDS}
    with mock.patch.object(ao, "INTERPRET", False), mock.patch.object(ao, "big_offset_layouts", small.__getitem__):
        labels = set()
        for case in draw_examples(ab.backward_big_offsets(dtype=torch.bfloat16), 12):
            labels.add(_mode(case))
            for t in case.tensors.values():
                storage = torch.tensor([], dtype=t.dtype).set_(t.untyped_storage())
                assert torch.isfinite(t).all() and torch.isnan(storage).sum() == storage.numel() - t.numel()
            assert all(np.isfinite(g).all() for r in quantities(case) for g in r.grads)
        assert labels == set(ab.BIG_KINDS)


@pytest.mark.skipif(INTERPRET, reason="GPU only: storages of more than 2^31 elements")
def test_big_offsets_on_the_gpu():
    """Each case's storages pass 2^31 elements; the oracle reads the views (one case alive at a time)."""
    @settings(max_examples=4, database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ab.backward_big_offsets(dtype=torch.float16))
    def run(case):
        assert max(t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
                   for t in case.tensors.values()) >= ab.INT32_LIMIT
        assert all(np.isfinite(g).all() for r in quantities(case) for g in r.grads)
    run()
