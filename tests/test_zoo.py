"""Quality test of the whole suite: every kernel of the known-bad zoo is caught by the default suite.

For each zoo kernel (flashcheck/suite/zoo/), the default ci suite runs against it as an external kernel in
a subprocess, exactly as `pytest --kernel flashcheck/suite/zoo/<family>_bugs.py:NAME --family <family> -x`
does (stopping at the first failure, Hypothesis's shrink phase skipped: the same derandomized
examples, so the same first failure, without the cost of minimizing it). A survivor means a
strategy or a property is missing: fix the suite, never drop the zoo kernel.
`python -m flashcheck.reports --kill-matrix` prints which test and property caught each one; the
CPU's ci matrix is tracked in reports/records/kill_matrix.json, and these tests hold the suite to it (every
entry recorded, every recorded kill still a kill).

Cheap checks first: on a hand-made trigger input, each broken kernel is wrong and its fixed twin
(the same kernel with the bug switched off) is right, so a kill is the bug's doing.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck import kernels
from flashcheck.kernels.registry import REGISTRY
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import format_of, to_float64
from flashcheck.fixtures.store import storage_of
from flashcheck.families import PROPERTIES
from flashcheck.interpreter.bounds import OutOfBoundsAccess
from flashcheck.suite.zoo import ZooKernel, zoo

ZOO = {z.name: z for z in zoo()}


def _softmax_wrong(fn, kw: dict) -> bool:
    try:
        return _softmax_wrong_values(fn, kw)
    except OutOfBoundsAccess:  # the interpreter's bounds check (a GPU faults or reads other data)
        return True


def _softmax_wrong_values(fn, kw: dict) -> bool:
    x = kw["x"]
    if "out" in kw:  # the out= kernels: does it write outside the view, or get the view wrong?
        out = kw["out"]
        base = storage_of(out)
        n = base.numel()
        before = base.clone()
        fn(x, out=out)
        inside = torch.zeros(n, dtype=torch.bool, device=out.device)
        idx = torch.arange(n, device=out.device).as_strided(out.shape, out.stride(), out.storage_offset())
        inside[idx.reshape(-1)] = True
        return bool((base[~inside] != before[~inside]).any()) or not torch.equal(out, fn(x))
    if "configs" in kw:
        return any(not torch.equal(fn(x), fn(x, **cfg)) for cfg in kw["configs"])
    y = fn(x)
    if "rows" in kw:  # GPU-sized triggers: only the rows that show the bug are compared
        x, y = x[kw["rows"]], y[kw["rows"]]
    c = compare_softmax(to_float64(x), to_float64(y), format_of(y.dtype), depth=x.shape[1])
    return bool(c.violations.any())


def _attention_wrong(fn, kw: dict, caps: dict | None = None) -> bool:
    """Whether any core attention property (oracle bound, lse bound, special values, ...) fails
    on the trigger, for `fn` declared with `caps` (its own `flashcheck` attribute wins)."""
    from flashcheck.properties import attention as pa
    from flashcheck.strategies.case import Case
    from flashcheck.kernels.registry import KernelSpec

    kw = dict(kw)
    kw.pop("return_lse", None)  # the properties ask for the lse whenever the kernel declares it
    tensors = {n: kw.pop(n) for n in ("q", "k", "v", "kv_lens", "attn_mask", "cu_seqlens_q", "cu_seqlens_k")
               if n in kw}
    kw.setdefault("causal", False)
    kw.setdefault("scale", None)
    spec = KernelSpec(name="zoo", family="attention", fn=fn, **dict(getattr(fn, "flashcheck", None) or caps or {}))
    case = Case(tensors=tensors, kwargs=kw, label="trigger")
    names = pa.CORE_PROPERTIES + (pa.VARLEN_PROPERTIES if "cu_seqlens_q" in tensors else ())
    return _any_property_fails(spec, case, names)


def _any_property_fails(spec, case, names) -> bool:
    for name in names:
        try:
            PROPERTIES[("attention", name)](spec, case)
        except AssertionError:
            return True
    return False


def _hinted(z: ZooKernel) -> list[str]:
    return [p.strip() for p in z.property_hint.split(",") if p.strip()]


def _failing(fn, z: ZooKernel) -> set[str]:
    """The properties of a training-family entry's `property_hint` that `fn` fails on a fresh trigger
    (declared as an author would: its `flashcheck` dict)."""
    from flashcheck.families import load_properties
    from flashcheck.kernels.registry import KernelSpec
    from flashcheck.targets.external import apply_capabilities

    load_properties()
    kwargs = apply_capabilities({}, getattr(fn, "flashcheck", None) or {}, z.family, f"zoo {fn.__name__}")
    spec = KernelSpec(name=f"zoo.{fn.__name__}", family=z.family, fn=fn, **kwargs)
    failed = set()
    for name in _hinted(z):
        try:
            PROPERTIES[(z.family, name)](spec, z.trigger())
        except AssertionError:
            failed.add(name)
    return failed


def _attention_backward_wrong(fn, kw: dict, caps: dict) -> bool:
    """Whether any backward property (contract, oracle bound, determinism, linearity in dO) fails
    on the trigger (q, k, v, do and options), for `fn` declared with `caps` (capability keys)."""
    from flashcheck.kernels.registry import KernelSpec
    from flashcheck.properties.attention.backward import BACKWARD_PROPERTIES
    from flashcheck.strategies.case import Case
    from flashcheck.targets.external import apply_capabilities

    kw = dict(kw)
    tensors = {n: kw.pop(n) for n in ("q", "k", "v", "do", "kv_lens", "attn_mask") if n in kw}
    kw.setdefault("causal", False)
    kw.setdefault("scale", None)
    spec = KernelSpec(**apply_capabilities(dict(name="zoo", family="attention", fn=fn), caps, "attention", "zoo"))
    return _any_property_fails(spec, Case(tensors=tensors, kwargs=kw, label="trigger"), BACKWARD_PROPERTIES)


def _trigger(z: ZooKernel) -> dict:
    if z.gpu_only and kernels.INTERPRET:
        pytest.skip(f"GPU only: {z.gpu_only}")
    kw = z.trigger()
    if z.caps.get("configs"):
        kw["configs"] = z.caps["configs"]
    return kw


def test_the_zoo_is_big_enough() -> None:
    fams = [z.family for z in ZOO.values()]
    assert len(ZOO) >= 24 and "softmax" in fams and "attention" in fams


def test_every_training_property_fails_on_some_zoo_kernel() -> None:
    """No vacuous property: each property of the training families is in some entry's property_hint,
    which its trigger makes fail (test_trigger_shows_the_bug_and_only_the_bug)."""
    from flashcheck import families

    families.load_properties()
    witnessed = {(z.family, p) for z in ZOO.values() for p in _hinted(z)}
    for family in ("softmax_backward", "log_softmax", "log_softmax_backward", "cross_entropy"):
        missing = [p for p in families.get(family).property_names() if (family, p) not in witnessed]
        assert not missing, f"{family}: no zoo kernel witnesses {missing}"


def test_the_zoo_is_never_registered() -> None:
    zoo_fns = {id(z.broken) for z in ZOO.values()} | {id(z.fixed) for z in ZOO.values()}
    assert not [s.name for s in REGISTRY if id(getattr(s.fn, "__wrapped__", s.fn)) in zoo_fns]
    from pathlib import Path

    for path in Path(kernels.__file__).parent.glob("*.py"):
        assert "zoo" not in path.read_text(), f"{path.name} mentions the zoo"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_trigger_shows_the_bug_and_only_the_bug(name: str) -> None:
    z = ZOO[name]
    if z.family not in ("softmax", "attention"):  # a Case and the properties it must fail
        assert _hinted(z), f"{name}: no property_hint to check its trigger against"
        assert _failing(z.broken, z) == set(_hinted(z)), f"{name}: the broken kernel passes some of {_hinted(z)}"
        assert not _failing(z.fixed, z), f"{name}: the fixed twin fails too: the zoo kernel has another defect"
        return
    if z.family == "softmax":
        wrong = _softmax_wrong
    elif z.backward:
        wrong = lambda fn, kw: _attention_backward_wrong(fn, kw, z.caps)  # noqa: E731
    else:
        wrong = lambda fn, kw: _attention_wrong(fn, kw, z.caps)  # noqa: E731
    assert wrong(z.broken, _trigger(z)), f"{name}: the broken kernel gets its own trigger right"
    assert not wrong(z.fixed, _trigger(z)), f"{name}: the fixed twin is wrong too: the zoo kernel has another defect"


def _matrix() -> dict:
    from flashcheck.reports.quality.kill_matrix import load_matrix

    return load_matrix()["entries"]


def test_the_kill_matrix_records_every_zoo_entry_caught() -> None:
    """reports/records/kill_matrix.json (tracked) lists every zoo entry, and every one the CPU can run as
    caught: a new entry is recorded with its first kill (`python -m flashcheck.reports --kill-matrix
    --no-shrink --record --zoo NAME`), and a survivor is fixed in the suite, never recorded."""
    entries = _matrix()
    assert sorted(entries) == sorted(ZOO), (
        f"reports/records/kill_matrix.json is stale: not recorded {sorted(set(ZOO) - set(entries))}, "
        f"no longer in the zoo {sorted(set(entries) - set(ZOO))}")
    for name, row in entries.items():
        if ZOO[name].gpu_only:
            assert row["caught"] is None and row.get("gpu_only"), f"{name} is GPU only: recorded as not run on the CPU"
        else:
            assert row["caught"] is True and row["test"] and row["examples"], f"{name}: recorded as not caught: {row}"


@pytest.mark.slow  # a subprocess run of the suite per zoo kernel
@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_default_suite_catches_it(name: str) -> None:
    """Every entry the tracked matrix records as killed is still killed: reach cannot regress
    silently. Where the kill now comes from another test or after more examples, the matrix is
    stale (a warning, not a failure: any change to the strategies moves the derandomized draws)."""
    from flashcheck.reports.quality.kill_matrix import matrix_row, nodeid_of, run_zoo_kernel

    z = ZOO[name]
    if z.gpu_only and kernels.INTERPRET:
        pytest.skip(f"GPU only: {z.gpu_only}")
    recorded = _matrix().get(name)
    # The recorded catching test (or the entry's GPU target) alone first; the whole suite only if it
    # no longer catches the kernel.
    first = (nodeid_of(recorded["test"]),) if recorded and recorded.get("test") else z.targets
    r = run_zoo_kernel(z, shrink=False, save_fixtures=False, first=first)
    crashed = r["returncode"] == 1 and r["all_failures"]
    assert r["caught"], (f"zoo kernel {name} ({r['bug_class']}) " + (
        f"CRASHED before the suite caught it (a crash is not a catch): {r['first_message']}" if crashed else
        f"SURVIVED the ci suite (exit {r['returncode']}): a strategy or property is missing"
        + (f"; reports/records/kill_matrix.json records it killed by {recorded['test']} [{recorded['property']}] "
           f"after {recorded['examples']} examples." if recorded and recorded.get("caught") else "."))
        + f"\n{r.get('output_tail') or ''}")
    assert recorded, f"{name} is caught but not in reports/records/kill_matrix.json: record it (see the fast test above)"
    now = matrix_row(r)
    # Examples count every test run before the catching one: comparable only after a whole-suite run.
    # (a GPU-only entry's row records no catching test: the CPU never ran it)
    stale = now["test"] != recorded.get("test") or (r["ran"] == "suite" and now["examples"] != recorded.get("examples"))
    if kernels.INTERPRET and stale:
        import warnings

        warnings.warn(f"reports/records/kill_matrix.json is stale for {name}: recorded {recorded['test']} after "
                      f"{recorded['examples']} examples, now {now['test']} after {now['examples']}", stacklevel=1)

@pytest.mark.skipif(not kernels.INTERPRET, reason="about the interpreter: a GPU's tl.maximum is maxnum anyway")
def test_exp_clamp_nan_is_seen_through_the_gpu_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """exp_clamp_nan is caught on the CPU only because flashcheck.interpreter.gpu gives tl.maximum the
    GPU's maxnum semantics: with Triton's own NaN-propagating max the broken kernel is right."""
    import triton.runtime.interpreter as interp

    z, kw = ZOO["exp_clamp_nan"], _trigger(ZOO["exp_clamp_nan"])
    assert _softmax_wrong(z.broken, kw)
    monkeypatch.setattr(interp.InterpreterBuilder, "create_maxnumf",
                        lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.maximum))
    assert not _softmax_wrong(z.broken, kw), "the bug shows without the GPU's max: this test is stale"


@pytest.mark.skipif(not kernels.INTERPRET, reason="about the interpreter: a GPU runs programs concurrently")
def test_split_merge_race_is_invisible_to_the_interpreter() -> None:
    """Why split_merge_race is GPU only: the interpreter runs programs in launch order, so the last
    span's program always finds the other partials stored. If this fails, the interpreter has
    learnt to reorder programs: drop the entry's gpu_only and let the CPU catch it."""
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((4, 1000)), dtype=torch.float32).to(kernels.DEVICE)
    assert not _softmax_wrong(ZOO["split_merge_race"].broken, {"x": x})


def test_gpu_targets_name_tests_that_exist() -> None:
    from flashcheck import HOME

    for z in ZOO.values():
        assert not z.targets or z.gpu_only, f"{z.name}: targets are for GPU-only entries (the matrix names the rest's)"
        for target in z.targets:
            file, _, test = target.partition("::")
            assert f"def {test.split('[')[0]}(" in (HOME / file).read_text(), f"{z.name}: no test {target}"


@pytest.mark.slow  # two subprocess runs of the suite
def test_a_first_test_that_misses_falls_back_to_the_whole_suite() -> None:
    from flashcheck.reports.quality.kill_matrix import run_zoo_kernel

    # a test that cannot catch a wrong read, here or on a GPU (test_softmax_gpu.py, once used here,
    # skips under the interpreter but catches the read on a GPU: its strided views pass the end)
    r = run_zoo_kernel(ZOO["read_past_row"], shrink=False, save_fixtures=False,
                       first=("flashcheck/suite/test_softmax.py::test_row_too_long_raises",))
    assert r["caught"] and r["ran"] == "suite", r
