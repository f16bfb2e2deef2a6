"""Counterexamples shrink to the elements that matter.

Softmax rows are a cheap background (seeded noise, a few values, or a constant) plus a few exact
overrides (`strategies.floats.backgrounds`, `with_overrides`), so Hypothesis can shrink a failing
row to a constant plus the handful of elements the bug needs, instead of a wall of seeded random
numbers (the committed fixture `softmax_online__matches_oracle__15cc3acdfa61.json`: 4 x 769 values
drawn from a seed, one of which mattered).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings, strategies as st

from flashcheck.mutation.probe import same_output
from flashcheck.oracles.formats import FP16, FP32, to_float64
from flashcheck.strategies.case import Case
from flashcheck.strategies.floats import backgrounds, non_background, with_overrides
from flashcheck.strategies.softmax import benign_rows, nan_and_inf_rows
from flashcheck.suite.zoo.softmax_bugs import ZOO

_FIND = settings(database=None, derandomize=True, max_examples=300, deadline=None,
                 phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))


def _wrong(name: str):
    z = ZOO[name]

    def pred(case: Case) -> bool:
        x = case.tensors["x"]
        return not same_output(z.broken(x), z.fixed(x))
    return pred


def test_nan_swallowed_shrinks_to_a_handful_of_elements() -> None:
    # Derandomized, the first failure found is an every-kind case (one row per kind of special
    # value); the shrinker cannot leave that mode (the rows' kinds are its structure), but it shrinks
    # N to 2 and every background to the constant 0: a dozen elements, the specials and zeros.
    case = find(nan_and_inf_rows(dtype=FP32, max_n=256, strided=False), _wrong("nan_swallowed"), settings=_FIND)
    v = to_float64(case.tensors["x"])
    assert np.isnan(v).sum() >= 1
    assert v.size <= 16 and non_background(v) <= 6, f"not shrunk: {v.shape}, {non_background(v)} off the background: {v}"


def test_zero_padding_shrinks_to_a_short_constant_row() -> None:
    # padding lanes read 0 instead of -inf: any row shorter than its power-of-two block shows it
    case = find(benign_rows(dtype=FP16, max_n=300, strided=False), _wrong("zero_padding"), settings=_FIND)
    v = to_float64(case.tensors["x"])
    assert v.shape[0] == 1 and non_background(v) <= 1, f"not shrunk: {v.shape}, {non_background(v)} off the background"


def test_backgrounds_and_overrides_shrink_to_constant_and_nothing() -> None:
    st_v = backgrounds((3, 50), scale=4.0).flatmap(lambda v: with_overrides(v, st.floats(-1, 1)))
    v = find(st_v, lambda v: True, settings=_FIND)
    assert non_background(v) == 0 and np.all(v == 0.0)
    v = find(st_v, lambda v: bool((v > 0.5).sum() == 1 and (v == 0).sum() == v.size - 1), settings=_FIND)
    assert non_background(v) == 1


def test_mutation_probes_reach_every_attention_feature() -> None:
    """`--probe-first` skips the suite for a mutant bit-identical on every probe: a feature no probe
    reaches made each of its mutants look equivalent (all of softcap's tanh mutants did)."""
    import torch

    from flashcheck.kernels.attention_spec import ATTENTION_FEATURES, CAUSAL_ALIGNS
    from flashcheck.mutation.probe import _attention_probe_inputs

    reached = set()
    for _, kw in _attention_probe_inputs():
        q, k, v = kw["q"], kw["k"], kw["v"]
        heads = (-2, -2) if kw.get("_fn") == "attention_varlen" else (1, 1)
        reached |= {f for f, on in (
            ("gqa", q.shape[heads[0]] != k.shape[heads[1]]), ("dv", v.shape[-1] != q.shape[-1]),
            ("window", kw.get("window") is not None), ("softcap", kw.get("softcap", 0.0) > 0),
            ("varlen", kw.get("_fn") == "attention_varlen"), ("lse", kw.get("return_lse", False)),
            ("attn_mask", kw.get("attn_mask") is not None), ("splits", kw.get("num_splits", 1) > 1),
            ("causal", kw.get("causal", False)), ("kv_lens", kw.get("kv_lens") is not None)) if on}
        reached.add(kw.get("causal_align", "top_left"))
        if isinstance(kw.get("attn_mask"), torch.Tensor):
            reached.add("bool_mask" if kw["attn_mask"].dtype == torch.bool else "float_mask")
    missing = (set(ATTENTION_FEATURES) | set(CAUSAL_ALIGNS) | {"bool_mask", "float_mask"}) - reached
    assert not missing, f"no mutation probe reaches {sorted(missing)}"


def test_mutation_resume_runs_undecided_results_again() -> None:
    """A mutant whose run errored (the test files moved under it) or timed out on a loaded CPU
    decided nothing; `--resume` skipped it forever."""
    from flashcheck.mutation.runner import decided

    store = {"k": {"status": "killed"}, "s": {"status": "survived"}, "e": {"status": "error"},
             "t": {"status": "timed_out"}, "q": {"status": "equivalent_candidate"}}
    assert [key for key in "ksetqx" if decided(store, key)] == ["k", "s", "q"]


def _run_result(wall: float, *, failed: str | None = None, summary: str = "AssertionError", timed_out: bool = False,
                tail: str = "", **data) -> dict:
    """What `killrun.run_pytest` returns, for a faked run: passed, failed at test `failed`, or timed
    out; `data` adds to the plugin's JSON."""
    if failed:
        data = {"tests_failed": [{"nodeid": failed, "summary": summary}], "first": {"message": summary.split(":")[0]},
                **data}
    rc = -1 if timed_out else 1 if failed else 0
    return {"returncode": rc, "timed_out": timed_out, "wall_seconds": wall, "tail": tail, "data": data}


def test_a_kill_counts_only_where_the_unmutated_kernels_pass_the_test(monkeypatch) -> None:
    """An environment that fails every test (Triton 3.6's interpreter under NumPy 2.4 did) once
    "killed" every mutant: each kill is confirmed against the unmodified module, or it is an error."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner
    from flashcheck.mutation.generate import all_mutants

    m = next(x for x in all_mutants(modules=["attention_merge"]) if x.operator == "off_by_one")
    calls = []

    def fake(args, **kw):  # noqa: ANN001, ANN003
        calls.append(args[0])
        return _run_result(1.0, failed="t.py::test_x", summary="InterpreterError: TypeError(...)")

    monkeypatch.setattr(killrun, "run_pytest", fake)
    monkeypatch.setattr(runner, "_BASELINE", {})
    r = runner.run_mutant(m, timeout=5)
    assert r["status"] == "error" and "fails on the unmutated kernels too" in r["message"]
    assert calls[-1] == "t.py::test_x"  # the baseline ran the killing test alone


def test_a_helper_mutant_the_suite_misses_runs_the_helpers_own_test(monkeypatch) -> None:
    """A slip in the interpreter's bf16 emulation stays inside every bound: where the suite passes
    such a mutant, the helpers' exactness self-test runs (without --family, which keeps only tests
    that check a kernel), and its kill is confirmed the same way."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner
    from flashcheck.mutation.generate import all_mutants

    m = next(x for x in all_mutants(modules=["_common"]) if x.function == "store_f32")
    unit = runner.unit_tests(m)[0]
    calls = []

    def fake(args, **kw):  # noqa: ANN001, ANN003
        calls.append(args)
        if args[0] == unit:  # the helpers' test: fails
            return _run_result(2.0, failed=f"{unit}::test_x")
        return _run_result(5.0)

    monkeypatch.setattr(killrun, "run_pytest", fake)
    monkeypatch.setattr(runner, "_BASELINE", {})
    r = runner.run_mutant(m, timeout=60)
    assert r["status"] == "killed" and r["caught_by_test"] == f"{unit}::test_x", r
    assert r["wall_seconds"] == 7.0
    suite, units, baseline = calls
    assert any(a.startswith("--family") for a in suite) and not any(a.startswith("--family") for a in units + baseline)


def test_a_baseline_verdict_is_saved_for_the_next_process(monkeypatch, tmp_path) -> None:
    """A compiled baseline costs minutes and each device call is a new process: its verdict is
    kept beside the store, for this code only, and a timeout (maybe load) is not kept."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner

    calls = []

    def fake(args, **kw):  # noqa: ANN001, ANN003
        calls.append(args[0])
        return _run_result(7.0, timed_out=args[0] == "t.py::test_slow")

    monkeypatch.setattr(killrun, "run_pytest", fake)
    monkeypatch.setattr(baselines, "BASELINE_FILE", baselines.baselines_file(tmp_path / "store.json"))
    for _ in range(2):  # two processes: the in-process cache starts empty in each
        monkeypatch.setattr(runner, "_BASELINE", {})
        assert runner.baseline_run("softmax", "softmax", "t.py::test_ok", timeout=9) == (None, 7.0)
        assert runner.baseline_run("softmax", "softmax", "t.py::test_slow", timeout=9)[0].endswith("(timed out)")
    assert calls == ["t.py::test_ok", "t.py::test_slow", "t.py::test_slow"]
    monkeypatch.setattr(baselines, "_code_digest", lambda test_file: "other code")
    monkeypatch.setattr(runner, "_BASELINE", {})
    runner.baseline_run("softmax", "softmax", "t.py::test_ok", timeout=9)
    assert calls[-1] == "t.py::test_ok"


def test_a_kill_by_a_quick_copy_is_confirmed_on_the_test_it_copies(monkeypatch, tmp_path) -> None:
    """Where the quick pass is on (a GPU machine), a mutant's first failure is often a quick copy,
    `test_x_quick[...]`, which exists only after collection: its baseline and a later run's first
    test name the test it copies. Naming the copy selected nothing (pytest's exit 4), and a GPU
    machine's mutation run recorded 55 kills as errors (fourteenth session)."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner
    from flashcheck.plugin.quick_first import selectable_nodeid

    base = "flashcheck/suite/test_softmax.py::test_adversarial_class[softmax_split-fp16-benign]"
    quick = base.replace("test_adversarial_class[", "test_adversarial_class_quick[")
    assert selectable_nodeid(quick) == base and selectable_nodeid(base) == base
    assert selectable_nodeid("t.py::C::test_y_quick") == "t.py::C::test_y"
    assert selectable_nodeid("t.py::test_y[a_quick]") == "t.py::test_y[a_quick]"
    calls = []
    monkeypatch.setattr(killrun, "run_pytest", lambda args, **kw: calls.append(args[0]) or _run_result(3.0))
    monkeypatch.setattr(baselines, "BASELINE_FILE", baselines.baselines_file(tmp_path / "store.json"))
    monkeypatch.setattr(runner, "_BASELINE", {})
    assert runner.baseline_run("softmax", "softmax", quick, timeout=9) == (None, 3.0)
    assert calls == [base]
    assert runner.first_tests_from({"k": {"status": "killed", "caught_by_test": quick}}) == {"k": base}


def test_a_first_test_recorded_in_a_checkout_is_found_in_an_installed_package(monkeypatch, tmp_path) -> None:
    """The interpreter's store names suite tests from a checkout (`flashcheck/suite/...`); an
    installed package's suite is `suite/...` under its own folder: --first-test-from finds them there."""
    from flashcheck.mutation import baselines, runner

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_softmax.py").write_text("")
    monkeypatch.setattr(runner, "HOME", tmp_path)
    monkeypatch.setattr(runner, "SUITE", tmp_path / "suite")
    store = {"k": {"status": "killed", "caught_by_test": "flashcheck/suite/test_softmax.py::test_x[a-b]"},
             "u": {"status": "killed", "caught_by_test": "tests/test_bf16_bits.py::test_y"}}
    assert runner.first_tests_from(store) == {"k": "suite/test_softmax.py::test_x[a-b]",
                                              "u": "tests/test_bf16_bits.py::test_y"}


@pytest.mark.parametrize("caught,only,expect", [(True, False, "killed"), (False, False, "survived"),
                                                 (False, True, "error")])
def test_a_first_test_from_another_store_runs_alone_and_decides_only_a_kill(monkeypatch, caught, only, expect) -> None:
    """--first-test-from: the test that killed the same mutant elsewhere runs alone first (a compiled
    suite costs a binary per launch variant); passing it decides nothing, so the whole suite runs,
    or with --first-test-only the mutant stays undecided."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner
    from flashcheck.mutation.generate import all_mutants

    m = next(x for x in all_mutants(modules=["attention_merge"]) if x.operator == "off_by_one")
    calls = []

    def fake(args, **kw):  # noqa: ANN001, ANN003
        calls.append(args[0])
        if args[0] == "t.py::test_k" and caught and len(calls) == 1:
            return _run_result(3.0, failed="t.py::test_k")
        return _run_result(3.0)

    monkeypatch.setattr(killrun, "run_pytest", fake)
    monkeypatch.setattr(runner, "_BASELINE", {})
    monkeypatch.setattr(runner, "FIRST_TESTS", runner.first_tests_from(
        {m.key: {"status": "killed", "caught_by_test": "t.py::test_k"}, "other": {"status": "survived"}}))
    monkeypatch.setattr(runner, "FIRST_TEST_ONLY", only)
    r = runner.run_mutant(m, timeout=60)
    assert r["status"] == expect, r
    assert calls[0] == "t.py::test_k"
    whole_suite = calls[1:2] != ["t.py::test_k"] and len(calls) > 1
    assert whole_suite == (expect == "survived")
    if expect == "survived":
        assert r["wall_seconds"] == 6.0 and r["only_tests"] is None  # both runs' time; decided by the suite


@pytest.mark.parametrize("unmutated_wall,expect", [(2.0, "hung"), (30.0, "timed_out")])
def test_a_timeout_counts_as_caught_only_far_past_the_unmutated_time(monkeypatch, unmutated_wall, expect) -> None:
    """A mutant stuck in one test is "hung" (caught) only where the unmutated kernels pass that test
    in a small fraction of the time the mutant spent in it; nearer, it may be load, and stays undecided."""
    import flashcheck.plugin.killrun as killrun
    from flashcheck.mutation import baselines, runner
    from flashcheck.mutation.generate import all_mutants

    m = next(x for x in all_mutants(modules=["attention_merge"]) if x.operator == "off_by_one")

    def fake(args, **kw):  # noqa: ANN001, ANN003
        if args[0] == "t.py::test_slow":  # the baseline: that one test, unmutated
            return _run_result(unmutated_wall)
        return _run_result(60.0, timed_out=True, tail="timed out", hung_test={"nodeid": "t.py::test_slow", "seconds": 50.0})

    monkeypatch.setattr(killrun, "run_pytest", fake)
    monkeypatch.setattr(runner, "_BASELINE", {})
    r = runner.run_mutant(m, timeout=60)
    assert r["status"] == expect, r["message"]
    assert "t.py::test_slow" in r["message"]
    assert (r["caught_by_test"] == "t.py::test_slow") == (expect == "hung")


def test_a_run_past_its_time_limit_names_the_test_it_was_stuck_in(tmp_path) -> None:
    from flashcheck.plugin.killrun import run_pytest

    (tmp_path / "test_stuck.py").write_text("import time\n\ndef test_fast():\n    pass\n\n"
                                            "def test_stuck():\n    time.sleep(600)\n")
    r = run_pytest([str(tmp_path / "test_stuck.py"), f"--rootdir={tmp_path}"], timeout=15)
    assert r["timed_out"]
    assert r["data"]["hung_test"]["nodeid"].endswith("test_stuck.py::test_stuck")


def test_every_triage_argument_names_a_mutant_generated_today() -> None:
    """The triage is keyed by mutant id, which holds a line number: when a kernel's lines move, an
    argument left under the old id argues for nothing and its mutant goes unargued (nine softmax
    arguments had drifted so)."""
    import json
    import re

    from flashcheck import HOME
    from flashcheck.mutation.generate import all_mutants
    from flashcheck.mutation.report import GPU_TRIAGE, TRIAGE_FILE

    ids = {m.id for m in all_mutants()}
    triage = json.loads(TRIAGE_FILE.read_text())
    stale = sorted({k.removeprefix(GPU_TRIAGE) for k in triage} - ids)
    assert not stale, f"{TRIAGE_FILE.relative_to(HOME)} argues for mutants no longer generated: {stale}"
    # An argument may lean on another ("as drop_mask:353:1", "as 311:1": same function, and the
    # same operator when none is named); when lines move, that reference must move with them.
    dangling = []
    for key, text in triage.items():
        module, function, operator = key.removeprefix(GPU_TRIAGE).split(":")[:3]
        for op, line in re.findall(r"\bas (?:([a-z_]+):)?(\d+:\d+)\b", text):
            if f"{module}:{function}:{op or operator}:{line}" not in ids:
                dangling.append(f"{key} -> {op or operator}:{line}")
    assert not dangling, f"{TRIAGE_FILE.relative_to(HOME)} refers to mutants no longer generated: {dangling}"


def test_hand_mutants_of_state_between_launches_apply_once_and_run_only_on_a_gpu(monkeypatch) -> None:
    """Split-KV's arrival counters and per-stream workspace have hand-written mutants (no AST
    operator reaches them); each changes exactly one line of today's source, and, like the int32
    narrowing, only a GPU run selects them: the interpreter never shares state between launches."""
    from flashcheck.mutation import between_launches, generate

    hand = [m for m in generate.all_mutants(modules=["attention_merge"]) if m.operator == between_launches.OPERATOR]
    assert len(hand) == len(between_launches.HAND_MUTANTS) == len({m.key for m in hand})
    assert all(m.diff().count("\n-") == 1 and m.specs == ("attention",) for m in hand)
    assert not set(m.id for m in hand) & set(m.id for m in generate.select(
        hand, functions=None, operators=None, sample=None, seed=0))
    assert generate.all_mutants(modules=["attention_merge"], operators=["constant"])  # still generated
    assert not [m for m in generate.all_mutants(modules=["attention_merge"], operators=["constant"])
                if m.operator == between_launches.OPERATOR]
    moved = between_launches.HandMutant("attention_merge", "split_workspace", "no such line\n", "", "gone")
    monkeypatch.setattr(between_launches, "HAND_MUTANTS", (moved,))
    with pytest.raises(ValueError, match="appears 0 times"):
        generate.hand_mutants("attention_merge", "attention")


def test_a_gpu_triage_argument_replaces_the_plain_one_in_the_compiled_report_only() -> None:
    """A mutant bit-identical under the interpreter may differ in its last bits compiled (the GPU
    schedules each loop on its own): its GPU argument stands in the GPU report, the plain one in
    the interpreter's."""
    from flashcheck.mutation.report import GPU_TRIAGE, for_device

    triage = {"a:f:op:1:1": "equivalent: same bits", GPU_TRIAGE + "a:f:op:1:1": "not equivalent, cannot matter",
              "b:f:op:2:1": "equivalent: b"}
    assert for_device(triage, compiled=False) == {"a:f:op:1:1": "equivalent: same bits", "b:f:op:2:1": "equivalent: b"}
    assert for_device(triage, compiled=True) == {"a:f:op:1:1": "not equivalent, cannot matter", "b:f:op:2:1": "equivalent: b"}


def test_interpreter_only_flags_are_set_only_by_bf16_as_bits() -> None:
    """The mutation tool leaves out of a compiled run the mutants inside `if FLAG:` for
    INTERPRETER_FLAGS, as code a GPU never compiles: that holds only while every launch sets the
    flag from `bf16_as_bits(...)` (True only under the interpreter)."""
    import ast

    from flashcheck import HOME
    from flashcheck.mutation.generate import INTERPRETER_FLAGS, interpreter_only_nodes, module_file

    def from_bits(value: ast.AST, assigned: dict[str, ast.AST]) -> bool:
        for n in ast.walk(value):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "bf16_as_bits":
                return True
            if isinstance(n, ast.Name) and n.id in assigned and from_bits(assigned[n.id], {}):
                return True
        return False

    seen = 0
    for path in sorted((HOME / "kernels").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef) or any(
                    isinstance(d, (ast.Attribute, ast.Name, ast.Call)) and "jit" in ast.unparse(d) for d in fn.decorator_list):
                continue
            assigned = {}
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        for i, name in enumerate(t.elts if isinstance(t, ast.Tuple) else [t]):
                            if isinstance(name, ast.Name):
                                val = n.value.elts[i] if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) else n.value
                                assigned[name.id] = val
            for n in ast.walk(fn):
                if isinstance(n, ast.keyword) and n.arg in INTERPRETER_FLAGS:
                    seen += 1
                    assert from_bits(n.value, assigned), (
                        f"{path.name}:{n.lineno}: {n.arg}= is not set from bf16_as_bits(...): {ast.unparse(n.value)}")
    assert seen >= 6
    assert interpreter_only_nodes(module_file("_common").read_text())  # the flags' bodies are found


@pytest.mark.parametrize("mutated,unmutated,expect", [
    ("========= Invalid __global__ read of size 4 bytes\n=========     at _attn_merge_kernel+0x90\n", "", "killed"),
    ("========= Invalid __global__ read of size 4 bytes\n", "========= Invalid __global__ write of size 4\n", "error"),
    ("", "", "error")])
def test_a_sanitizer_kill_counts_only_where_the_unmutated_sweep_is_clean(monkeypatch, tmp_path, mutated, unmutated,
                                                                          expect) -> None:
    """--sanitizer: a memcheck error under the mutant kills it only where the same cases are clean
    unmutated; a clean run decides nothing (only memory safety was looked at)."""
    import subprocess

    from flashcheck.mutation import baselines, runner, sanitizer
    from flashcheck.mutation.generate import all_mutants
    from flashcheck.mutation.probe import MUTANT_ENV

    m = next(x for x in all_mutants(modules=["attention_merge"]) if x.operator == "drop_mask")
    seen = []

    def fake(cmd, env, **kw):  # noqa: ANN001, ANN003
        seen.append(env)
        err = mutated if MUTANT_ENV in env else unmutated
        text = "CASE 3 attention splits=3 lse float16 B2\n" + err + ("" if err else "OK 3\nDONE 1 of 9 cases, 0 failed\n")
        text += f"========= ERROR SUMMARY: {int(bool(err))} errors\n"
        return subprocess.CompletedProcess(cmd, sanitizer.ERROR_EXIT if err else 0, text, "")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU: no driver asked
    monkeypatch.setattr(subprocess, "run", fake)
    monkeypatch.setattr(sanitizer, "CASES", "splits=3 lse float16")
    monkeypatch.setattr(baselines, "BASELINE_FILE", baselines.baselines_file(tmp_path / "store.json"))
    r = runner.run_mutant(m, timeout=60)
    assert r["status"] == expect, r
    assert all(e["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1" for e in seen)  # every tensor its own allocation
    if expect == "killed":
        assert r["caught_by_test"].endswith("::attention splits=3 lse float16 B2")
        assert "_attn_merge_kernel" in r["message"] and r["caught_by_property"].startswith("memory safety")
    else:
        assert r["only_tests"] == "sanitizer:splits=3 lse float16"  # narrowed: listed as undecided


def test_job_slots_spread_over_the_gpus(monkeypatch) -> None:
    """With G GPUs each job slot (a pool thread) runs its mutants on GPU slot mod G, put first."""
    import threading

    from flashcheck.mutation import baselines, runner

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    monkeypatch.setattr(runner, "_SLOTS", iter(range(100)))
    got = []
    threads = [threading.Thread(target=lambda: got.append((runner.gpu_env(), runner.gpu_env()))) for _ in range(4)]
    for t in threads:
        t.start()
        t.join()
    firsts = [a["CUDA_VISIBLE_DEVICES"] for a, b in got]
    assert all(a == b for a, b in got)  # one slot keeps its GPU
    assert firsts == ["0,1,2", "1,2,0", "2,0,1", "0,1,2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert runner.gpu_env() == {}


def test_a_narrowed_pass_counts_only_through_its_written_argument() -> None:
    """A mutant that passed only a narrowed run (the tests aimed at it) is undecided, unless the
    triage argues it: then it is equivalent ("equivalent: ...") or a survivor ("not equivalent: ...")
    and the report shows the argument beside the run that passed."""
    from flashcheck.mutation.generate import all_mutants
    from flashcheck.mutation.report import to_markdown

    ms = [m for m in all_mutants(modules=["attention"]) if m.operator == "narrow_int64"][:2]
    results = {m.key: {"id": m.id, "status": "error", "only_tests": "past_2_31", "returncode": 0, "wall_seconds": 5.0,
                       "caught_by_test": None, "probe": None, "specs_run": list(m.specs), "tests_passed": 3}
               for m in ms}
    bare = to_markdown(ms, results, {}, [], compiled=True)
    assert "Undecided, not counted (2)" in bare and "| all | 0 |" in bare
    argued = to_markdown(ms, results, {ms[0].id: "equivalent: promoted by an int64 operand.",
                                       ms[1].id: "not equivalent, cannot matter: needs 128 GiB."}, [], compiled=True)
    assert "Undecided" not in argued
    assert "| all | 2 | 0 | 0 | 0 | 0 | 1 | 1 | 0.0% (0/1) |" in argued, argued
    assert argued.count("passed the narrowed run `past_2_31`") == 2
    extra = next(m for m in all_mutants(modules=["attention_merge"]) if m.operator == "drop_mask")
    assert f"not run yet (1): {extra.id}." in to_markdown([*ms, extra], results, {}, [], compiled=True)


def test_merging_device_stores_keeps_each_groups_result(tmp_path) -> None:
    """Groups run side by side from copies of one store: a copy's stale entries (as in the base)
    never undo another group's result, and an undecided verdict never replaces a decided one."""
    import json
    import re

    from flashcheck.mutation.cli import main

    base = {"a": {"status": "timed_out"}, "b": {"status": "error"}, "c": {"status": "killed"}}
    g1 = dict(base, a={"status": "error", "wall_seconds": 9})  # a: narrowed pass
    g2 = dict(base, b={"status": "killed"}, c={"status": "error"})  # b killed; c undecided again
    paths = []
    for name, data in (("base", base), ("g1", g1), ("g2", g2)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    (tmp_path / "g2_runs.json").write_text(json.dumps([{"command": "x"}]))
    store = tmp_path / "store.json"
    store.write_text(json.dumps(base))
    assert main(["--store", str(store), "--merge", *map(str, paths)]) == 0
    got = json.loads(store.read_text())
    assert got == {"a": {"status": "error", "wall_seconds": 9}, "b": {"status": "killed"}, "c": {"status": "killed"}}
    assert json.loads((tmp_path / "store_runs.json").read_text()) == [{"command": "x"}]
