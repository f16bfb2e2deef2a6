"""The cross-entropy, softmax-backward and log-softmax-backward strategies
(strategies/cross_entropy.py) draw valid, adversarial cases: shapes, dtypes and targets the oracles
accept, probability rows, each class's defining feature, and counterexamples that shrink.
Small shapes and few examples: the whole file runs in well under a minute on one core."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

from flashcheck.oracles.cross_entropy import cross_entropy_oracle
from flashcheck.oracles.formats import FP32, format_of
from flashcheck.oracles.log_softmax import exact_values
from flashcheck.strategies import cross_entropy as ce
from flashcheck.strategies import softmax as sm

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_N = 48
FEW = settings(max_examples=6, database=None, derandomize=True, deadline=None,
               suppress_health_check=list(HealthCheck))
SEARCH = settings(max_examples=300, database=None, derandomize=True, deadline=None,
                  suppress_health_check=list(HealthCheck))


def reaches(strategy, pred, *, n: int = 300):
    """Some derandomized draw of `strategy` among the first `n` satisfies `pred` (no shrinking:
    `find` is kept for the test that is about shrinking); returns it."""
    hits = []

    @settings(SEARCH, max_examples=n, phases=[Phase.generate], report_multiple_bugs=False)
    @given(strategy)
    def run(case):
        if pred(case):
            hits.append(case)
            raise _Found  # stop at the first hit
    try:
        run()
    except _Found:
        return hits[0]
    raise AssertionError(f"none of {n} draws satisfied the predicate")


class _Found(Exception):
    pass


def _ids(table):
    return [pytest.param(name, dt, id=f"{name}-{format_of(dt).name}") for name in table for dt in DTYPES]


def _target(case) -> np.ndarray:
    return case.tensors["target"].cpu().numpy()


def _logits(case) -> np.ndarray:
    return exact_values(case.tensors["logits"])


def _target_logits(case) -> np.ndarray:
    x, t = _logits(case), _target(case)
    ok = (t >= 0) & (t < x.shape[1])
    return x[np.flatnonzero(ok), t[ok]]


def check_ce_case(case, dtype, *, oracle: bool = True) -> None:
    x, t = case.tensors["logits"], case.tensors["target"]
    assert x.dim() == 2 and x.dtype == dtype and x.shape[0] >= 1 and x.shape[1] >= 1
    n, v = x.shape
    assert t.dtype == torch.int64 and tuple(t.shape) == (n,)
    kw = case.kwargs
    assert {"ignore_index", "label_smoothing", "reduction"} <= set(kw)
    assert kw["reduction"] in ("mean", "sum", "none") and 0.0 <= kw["label_smoothing"] <= 1.0
    tv = t.cpu().numpy()
    assert (((tv >= 0) & (tv < v)) | (tv == kw["ignore_index"])).all(), (tv, kw)
    # the labels' guard elements hold ignore_index
    buf = t.untyped_storage()
    whole = torch.tensor([], dtype=torch.int64, device=t.device).set_(buf).cpu().numpy()
    inside = np.zeros(whole.size, dtype=bool)
    inside[t.storage_offset() + np.arange(n) * t.stride(0)] = True
    assert (whole[~inside] == kw["ignore_index"]).all()
    if "weight" in case.tensors:
        w = exact_values(case.tensors["weight"])
        assert w.shape == (v,) and np.isfinite(w).all() and (w >= 0).all()
    if "grad_output" in case.tensors:
        g = exact_values(case.tensors["grad_output"])
        assert g.shape == ((n,) if kw["reduction"] == "none" else ()) and np.isfinite(g).all()
    if not oracle:
        return
    # the oracle accepts it (targets, options) and gives one loss per row
    extra = {k: kw[k] for k in ("z_loss", "softcap") if k in kw}
    w = case.tensors.get("weight")
    loss = cross_entropy_oracle(x, t, FP32, ignore_index=kw["ignore_index"], reduction="none",
                                label_smoothing=kw["label_smoothing"], weight=w, **extra)
    assert loss.shape == (n,)


@pytest.mark.parametrize("name, dtype", _ids(ce.CE_CLASSES))
def test_ce_class_draws_valid_cases(name, dtype):
    strategy = ce.CE_CLASSES[name](dtype=dtype, max_n=MAX_N)

    @FEW
    @given(strategy)
    def run(case):
        check_ce_case(case, dtype)
        assert case.label.split("/")[0] == name
    run()


def _prob_rows_ok(y: np.ndarray, fmt) -> None:
    assert (y >= 0).all() and (y <= 1).all()
    n = y.shape[1]
    # each element rounded once: |sum - 1| <= u (relative) plus subnormal absolute errors
    tol = fmt.unit_roundoff * 1.01 + n * fmt.min_subnormal
    assert np.all(np.abs(y.sum(axis=1) - 1.0) <= tol), y.sum(axis=1) - 1.0


@pytest.mark.parametrize("out, table", [("y", ce.SOFTMAX_BACKWARD_CLASSES), ("logp", ce.LOG_SOFTMAX_BACKWARD_CLASSES)])
@pytest.mark.parametrize("name", list(ce.SOFTMAX_BACKWARD_CLASSES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
def test_backward_class_draws_valid_cases(out, table, name, dtype):
    fmt = format_of(dtype)

    @FEW
    @given(table[name](dtype=dtype, max_n=32))
    def run(case):
        assert set(case.tensors) == {out, "dy"} and case.label.split("/")[0] == name
        a, dy = case.tensors[out], case.tensors["dy"]
        assert a.dtype == dy.dtype == dtype and a.shape == dy.shape and a.dim() == 2
        av, dv = exact_values(a), exact_values(dy)
        assert np.isfinite(dv).all()
        if out == "y":
            _prob_rows_ok(av, fmt)
        else:
            assert (av <= 0).all() and not np.isnan(av).any()
            p = np.exp(av)  # logp_i off by u |logp_i|: exp(logp_i) off by that relatively
            spread = np.where(p > 0, p * (np.abs(np.where(p > 0, av, 0.0)) + 1), 0.0)
            tol = float(np.max(2 * fmt.unit_roundoff * spread.sum(axis=1))) + av.shape[1] * 1e-300
            assert np.all(np.abs(p.sum(axis=1) - 1.0) <= tol)
    run()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
def test_confident_lands_in_window(dtype):
    """The oracle's p_t = exp(-loss) of every row is in [0.99, 0.9999]."""
    lo, hi = ce.CONFIDENT

    @settings(FEW, max_examples=10)
    @given(ce.ce_confident(dtype=dtype, max_n=16))
    def run(case):
        loss = cross_entropy_oracle(case.tensors["logits"], case.tensors["target"], FP32, reduction="none")
        p = np.exp(-loss)
        assert np.all((p >= lo) & (p <= hi)), p
    run()


def test_masked_vocab_reaches_a_neg_inf_target_and_shrinks():
    """Some case has a -inf target logit; the search for one with V > 1 shrinks to a tiny case."""
    def pred(case):
        return case.tensors["logits"].shape[1] > 1 and bool(np.any(_target_logits(case) == -math.inf))

    case = find(ce.ce_masked_vocab(dtype=torch.float32, max_n=256), pred, settings=SEARCH)
    n, v = case.tensors["logits"].shape
    assert (n, v) == (1, 2), case
    assert case.tensors["logits"].is_contiguous() and case.tensors["logits"].storage_offset() == 0


def test_ignored_rows_all_ignored_mean_is_nan():
    case = reaches(ce.ce_ignored_rows(dtype=torch.float32, max_n=16),
                   lambda c: c.kwargs["reduction"] == "mean" and (_target(c) == c.kwargs["ignore_index"]).all())
    loss = cross_entropy_oracle(case.tensors["logits"], case.tensors["target"], FP32, **case.kwargs)
    assert np.isnan(loss)
    # ignore_index inside the vocabulary and past it (a padded tile's column) are both drawn
    for pred in (lambda c: 0 <= c.kwargs["ignore_index"] < c.tensors["logits"].shape[1],
                 lambda c: c.kwargs["ignore_index"] > c.tensors["logits"].shape[1]):
        reaches(ce.ce_ignored_rows(dtype=torch.float32, max_n=16), pred)


def test_strided_rows_layouts():
    @settings(FEW, max_examples=25)
    @given(ce.ce_strided_rows(dtype=torch.bfloat16, max_n=MAX_N))
    def run(case):
        assert not case.tensors["logits"].is_contiguous()
    run()
    s = ce.ce_strided_rows(dtype=torch.bfloat16, max_n=MAX_N)
    reaches(s, lambda c: c.tensors["logits"].storage_offset() % 2 == 1 and c.tensors["target"].storage_offset() % 2 == 1)
    reaches(s, lambda c: c.tensors["logits"].stride(0) == 1)  # transposed storage
    reaches(s, lambda c: not c.tensors["target"].is_contiguous())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
def test_class_features(dtype):
    @settings(FEW, max_examples=12)
    @given(ce.ce_past_overflow(dtype=dtype, max_n=MAX_N), ce.ce_grad_output_nonuniform(dtype=dtype, max_n=MAX_N),
           ce.ce_smoothing_with_inf(dtype=dtype, max_n=MAX_N), ce.ce_tied_maxima(dtype=dtype, max_n=MAX_N))
    def run(over, grad, smooth, tied):
        assert np.nanmax(np.abs(_logits(over))) > 88.0
        g = exact_values(grad.tensors["grad_output"])
        assert grad.kwargs["reduction"] == "none" and g.shape[0] >= 2 and not np.all(g == g[0])
        assert smooth.kwargs["label_smoothing"] > 0 and np.any(_logits(smooth) == -math.inf)
        x, t = _logits(tied), _target(tied)
        for i in range(x.shape[0]):
            ties = np.flatnonzero(x[i] == x[i].max())
            assert ties.size >= 2
            assert (t[i] in ties) == (not tied.label.endswith("target_not_tied"))
    run()


def test_weighted_reaches_zero_target_weight():
    reaches(ce.ce_weighted(dtype=torch.float16, max_n=MAX_N),
            lambda c: np.any(exact_values(c.tensors["weight"])[_target(c)] == 0))


def test_long_vocab_shapes():
    @settings(FEW, max_examples=10)
    @given(ce.vocab_shapes(max_n=300_000, big=True), ce.vocab_shapes(max_n=4096))
    def run(big, small):
        n, v = big
        assert n * v > ce.INT32_LIMIT and v in ce.VOCABS  # shapes only: never built on the CPU
        assert 2048 <= small[1] <= 4096 and small[0] <= 2
    run()

    @settings(FEW, max_examples=3)
    @given(ce.ce_long_vocab(dtype=torch.bfloat16, max_n=4096))
    def draws(case):
        check_ce_case(case, torch.bfloat16, oracle=False)  # the oracle on 4096 classes: seconds
        assert case.tensors["logits"].shape[1] >= 2048
    draws()


def test_big_logits_builder_small():
    x = ce._big_logits(3, 5, format_of(torch.float16), 7)
    assert x.shape == (3, 5) and x.dtype == torch.float16 and torch.isfinite(x).all()


def test_tables_and_features():
    assert ce.LOG_SOFTMAX_CLASSES is sm.CLASSES and ce.LOG_SOFTMAX_CLASS_RECORDS is sm.CLASS_RECORDS
    assert list(ce.SOFTMAX_BACKWARD_CLASSES) == list(ce.LOG_SOFTMAX_BACKWARD_CLASSES)
    plain = ce.ce_classes_for(frozenset())
    assert "weighted" not in plain and "softcap" not in plain and "benign" in plain
    assert set(ce.ce_classes_for({"weight", "label_smoothing", "softcap", "z_loss"})) == set(ce.CE_CLASSES)
    labels = set()

    @settings(FEW, max_examples=30)
    @given(ce.cross_entropy_cases(dtype=torch.float32, max_n=16))
    def run(case):
        check_ce_case(case, torch.float32)
        labels.add(case.label.split("/")[0])
    run()
    assert labels <= set(plain) and len(labels) >= 3
