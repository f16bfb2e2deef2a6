"""A kernel that kills its process or its CUDA context is ONE named failure and the run goes on.

Unit tests (fast): the context-killing errors are recognised, the guarded call names kernel and
input, a GpuFault is not shrunk (one example, fixture saved). End to end (`slow`, subprocesses):
tiny kernels that call os._exit(0), segfault, hang or raise CUDA's illegal-memory-access text on one
input (rows holding a NaN; `all4` does each on its own special row, so one run sees all four),
checked with and without `-n 2`, replayed and reported: each run exits 1, names kernel, test and
input, writes the fixture, and finishes every other test.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashcheck.isolation import faults

from flashcheck.fixtures import store as fixtures

from flashcheck.properties import runner as properties
from flashcheck.families import load_properties
from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.plugin.selftest import clean_env
from flashcheck.strategies.case import Case

ILLEGAL = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"

CRASHERS = textwrap.dedent('''
    import os, signal, time
    import torch

    def _softmax(x, **kw):
        return torch.softmax(x.float(), -1).to(x.dtype)

    def _crash(x, how):
        if bool(torch.isnan(x).any()):  # one input class only: rows holding a NaN
            how()
        return _softmax(x)

    def exit0(x, **kw):
        return _crash(x, lambda: os._exit(0))

    def segv(x, **kw):
        return _crash(x, lambda: os.kill(os.getpid(), signal.SIGSEGV))

    def hang(x, **kw):
        return _crash(x, lambda: time.sleep(10**6))

    def illegal():
        raise RuntimeError(%r)

    def fault(x, **kw):
        return _crash(x, illegal)

    def all4(x, **kw):  # one cause per special row: four crashes in one supervised run
        if bool(torch.isnan(x).any()):
            os._exit(0)
        if bool(torch.isposinf(x).any()):
            os.kill(os.getpid(), signal.SIGSEGV)
        if bool(torch.isneginf(x).all(dim=-1).any()):
            time.sleep(10**6)
        if bool((x == -60000.0).any()):
            illegal()
        return _softmax(x)

    for f in (exit0, segv, hang, fault, all4):
        f.flashcheck = {"dtypes": ["fp32"]}
''' % ILLEGAL)

# One test whose input holds a NaN (the crash) and two that do not (they must still run).
SELECT = "nan_inf or two_equal or pos_inf"
CAUSES = {"exit0": "the kernel crashers.exit0 exited with code 0",
          "segv": "the kernel crashers.segv was killed by SIGSEGV",
          "hang": "the kernel crashers.hang did not return in 4 s",
          "fault": "illegal memory access in crashers.fault on ((1, 1) float32"}
# crashers.all4 on the special rows: the row each cause is given, and how the run names it.
ALL4 = {"one_nan": "the kernel crashers.all4 exited with code 0",
        "pos_inf": "the kernel crashers.all4 was killed by SIGSEGV",
        "all_neg_inf": "the kernel crashers.all4 did not return in 4 s",
        "n_is_one_huge": "illegal memory access in crashers.all4 on ((3, 1) float32"}
ALL4_SELECT = "special_values and (one_nan or pos_inf or all_neg_inf or n_is_one_huge or two_equal)"


@pytest.fixture(autouse=True)
def _fresh_context():
    """A simulated fault marks this process's context lost: the next test gets a live one."""
    yield
    faults._LOST.clear()


# ---- recognising and naming a fault -----------------------------------------------------------------

@pytest.mark.parametrize("text, kind", [
    (ILLEGAL, "illegal memory access"),
    ("CUDA error: misaligned address", "misaligned address"),
    ("triton: an illegal instruction was encountered", "illegal instruction"),
    ("CUDA error: unspecified launch failure", "unspecified launch failure"),
    ("CUDA error: device-side assert triggered", "device-side assert"),
    ("RuntimeError: CUDA error 700 (cudaErrorIllegalAddress)", "illegal memory access"),
    ("CUDA error: out of memory", None),
    ("expected a 2-D tensor", None),
])
def test_context_killing_errors_are_recognised(text: str, kind: str | None) -> None:
    assert faults.fault_kind(RuntimeError(text)) == kind
    assert faults.fault_kind(ValueError("wrapped")) is None
    try:
        raise ValueError("in a property") from RuntimeError(text)
    except ValueError as e:
        assert faults.fault_kind(e) == kind


def _spec(fn, name: str = "fake") -> KernelSpec:
    return KernelSpec(name=name, family="softmax", fn=fn, dtypes=(torch.float32,))


def test_guarded_call_names_kernel_and_input_then_refuses() -> None:
    calls = []

    def kernel(x):
        calls.append(x)
        raise RuntimeError(ILLEGAL)

    spec = _spec(kernel)
    x = torch.zeros(8, 3)[::2]
    with pytest.raises(faults.GpuFault, match=r"illegal memory access in fake on \(\(4, 3\) float32 stride=\(6, 1\)"):
        spec.fn(x)
    with pytest.raises(faults.GpuFault, match="CUDA context was lost"):
        spec.fn(x)
    assert len(calls) == 1, "a call in a dead context must not reach the kernel"
    assert KernelSpec(name="again", family="softmax", fn=spec.fn).fn is spec.fn, "hooking is idempotent"


def test_an_unsynchronised_call_is_counted_and_refused_in_a_lost_context(monkeypatch) -> None:
    """The GPU stream and graph tests call the kernel past the hook (no synchronisation after
    each call): each call still counts as checked, so a run of those tests alone is not 'nothing
    checked', and a dead context is still refused before the kernel."""
    calls = []
    before = faults.CALLS[0]
    assert faults.unsynchronised_call(lambda x: calls.append(x) or x + 1, "fake", (1,), {}) == 2
    assert faults.CALLS[0] == before + 1 and calls == [1]
    monkeypatch.setattr(faults, "_LOST", ["an earlier fault"])
    with pytest.raises(faults.GpuFault, match="context was lost"):
        faults.unsynchronised_call(lambda x: calls.append(x), "fake", (2,), {})
    assert calls == [1]


def test_ordinary_errors_pass_through_unchanged() -> None:
    def kernel(x):
        raise ValueError("bad rank")

    with pytest.raises(ValueError, match="bad rank"):
        _spec(kernel).fn(torch.zeros(2, 2))
    assert faults.context_lost() is None


def test_fault_is_not_shrunk_and_its_input_is_saved(tmp_path: Path) -> None:
    """Hypothesis stops at the first fault (no shrinking in a dead context); the fixture holds it."""
    calls = []

    def kernel(x):
        calls.append(x.clone())
        if x.shape[1] > 3:
            raise RuntimeError(ILLEGAL)
        return torch.softmax(x, -1)

    spec = _spec(kernel)
    load_properties()
    fixtures.configure(save=True, directory=tmp_path)
    try:
        @settings(max_examples=50, derandomize=True, database=None, deadline=None)
        @given(n=st.integers(1, 40))
        def run(n: int) -> None:
            x = torch.arange(2 * n, dtype=torch.float32).reshape(2, n) / 8
            properties.check(spec, "in_unit_interval", Case(tensors={"x": x}, kwargs={}, label="test/fault"))

        with pytest.raises(faults.GpuFault) as info:
            run()
    finally:
        fixtures.configure(save=None)
        fixtures._SETTINGS["directory"] = None
    faulting = [c for c in calls if c.shape[1] > 3]
    assert len(faulting) == 1, f"the kernel ran {len(faulting)} times on faulting inputs: Hypothesis shrank"
    msg = str(info.value)
    assert "illegal memory access in fake on ((2, " in msg and "property in_unit_interval on Case(test/fault" in msg
    (path,) = tmp_path.glob("*.json")
    payload = json.loads(path.read_text())
    assert payload["property"] == "in_unit_interval" and payload["tensors"]["x"]["shape"] == list(faulting[0].shape)
    assert "illegal memory access" in payload["message"]
    assert any(str(path) in n for n in getattr(info.value, "__notes__", []))


@pytest.mark.skipif(INTERPRET, reason="GPU only: a real out-of-bounds store needs a GPU")
def test_real_out_of_bounds_triton_kernel_is_one_named_fault(tmp_path: Path) -> None:
    """In a subprocess: the fault kills that process's context, not this one's."""
    script = tmp_path / "oob.py"
    script.write_text(textwrap.dedent('''
        import torch, triton, triton.language as tl
        from flashcheck.isolation import hooks as kernel_hooks
        from flashcheck.isolation.faults import GpuFault
        from flashcheck.kernels.registry import KernelSpec

        kernel_hooks.attach()  # what every engine entry point does before it runs a kernel

        @triton.jit
        def _oob(x_ptr):
            tl.store(x_ptr + (1 << 40), 1.0)

        def oob(x):
            _oob[(1,)](x)
            return x

        spec = KernelSpec(name="oob", family="softmax", fn=oob)
        try:
            spec.fn(torch.zeros(4, 4, device="cuda"))
        except GpuFault as e:
            print("FAULT", e)
    '''))
    p = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True, timeout=300)
    assert "FAULT illegal memory access in oob on ((4, 4) float32" in p.stdout, p.stdout + p.stderr


# ---- end to end: check, replay, report ------------------------------------------------------------

def _cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcheck.cli.main", *args], cwd=cwd, env=clean_env({"CI": "true"}),
                          capture_output=True, text=True, timeout=timeout)


def _check(cwd: Path, kernel: str, *extra: str) -> subprocess.CompletedProcess:
    return _cli(cwd, "check", f"crashers.py:{kernel}", "--family", "softmax", "--hypothesis-profile", "smoke",
                "-q", "-p", "no:randomly", "-k", SELECT, "--timeout", "4", *extra)


@pytest.fixture(scope="module")
def crashers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("crashers")
    (d / "crashers.py").write_text(CRASHERS)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_check_names_the_crash_and_finishes_the_run(crashers: Path, workers: tuple) -> None:
    """Each way a kernel can take its process down (exit, a signal, a hang, a lost CUDA context), in
    one supervised run: every crash is one named failure with its test, cause and fixture, and the
    run goes on to finish every other test. (One run for the four causes: a run per cause cost a
    CPU CI machine 260 s of the suite's time, mostly Python processes starting.)"""
    d = crashers / f"all4-{len(workers)}"
    d.mkdir()
    (d / "crashers.py").write_text(CRASHERS)
    p = _check(d, "all4", "-k", ALL4_SELECT, *workers)  # the last -k selects
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    for row, cause in ALL4.items():
        assert f"test_special_values[crashers.all4-fp32-{row}]" in out and cause in out, (row, out)
    assert "flashcheck: 5 tests: 1 passed, 0 failed, 4 crashed, 0 skipped, 0 not run" in out, out
    fixtures = sorted((d / "flashcheck-regressions").glob("*.json"))
    assert len(fixtures) == 4 and {json.loads(f.read_text())["kernel"] for f in fixtures} == {"crashers.all4"}, out
    for fixture in fixtures:
        assert f"flashcheck replay {fixture}" in out, (fixture, out)


@pytest.mark.slow
def test_plain_pytest_skips_the_rest_after_a_fault(crashers: Path) -> None:
    """No parent, no -n: the faulting test fails, every later one is skipped as not run."""
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "flashcheck.plugin", "--kernel", "crashers.py:fault",
                        "--family", "softmax", "--hypothesis-profile", "smoke", "-q", "-p", "no:randomly", "-rs",
                        "-p", "no:xdist", "-k", SELECT, "--no-save-fixtures"],
                       cwd=crashers, env=clean_env({"CI": "true"}), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 failed, 2 skipped" in out and "not run: CUDA context lost after the fault in" in out, out
    assert out.count("illegal memory access in crashers.fault") >= 1 and "2 later tests not run" in out, out


@pytest.mark.slow
def test_never_run_tests_are_counted(crashers: Path) -> None:
    """xdist out of worker restarts: the tests it never ran are listed and fail the run."""
    d = crashers / "restarts"
    d.mkdir()
    (d / "crashers.py").write_text(CRASHERS)
    p = _check(d, "exit0", "-n", "1", "--max-worker-restart", "0", "-k", "nan_inf or one_nan or two_equal or pos_inf")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "crashed" in out and "never ran" in out and " not run: flashcheck/suite/" in out, out


@pytest.fixture(scope="module")
def saved_fixture(crashers: Path) -> Path:
    """A fixture of the crash input, from a supervised check of the faulting kernel."""
    d = crashers / "fixtures"
    d.mkdir()
    (d / "crashers.py").write_text(CRASHERS)
    p = _check(d, "fault", "-k", "nan_inf")
    (path,) = (d / "flashcheck-regressions").glob("*.json")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["exit0", "hang"])
def test_replay_names_the_crash(crashers: Path, saved_fixture: Path, kernel: str) -> None:
    passing = saved_fixture.parent / "copy"
    passing.mkdir(exist_ok=True)
    (passing / saved_fixture.name).write_text(saved_fixture.read_text())
    # Both named: a fixture file named with --kernel is replayed against it (a folder's fixtures
    # recorded for another kernel are not).
    p = _cli(crashers, "replay", str(saved_fixture), str(passing / saved_fixture.name), "--kernel",
             f"crashers.py:{kernel}", "--timeout", "4")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert f"flashcheck: 2 fixtures: 0 passed, 0 failed, 2 crashed" in out, out
    assert CAUSES[kernel].replace("4 s", "4 s") in out and str(saved_fixture) in out, out


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["segv", "hang"])
def test_report_counts_the_crash_as_the_kernels_error(crashers: Path, kernel: str, tmp_path: Path) -> None:
    p = _cli(crashers, "report", f"crashers.py:{kernel}", "--family", "softmax", "--examples", "1", "--budget", "60",
             "--no-baselines", "--no-plots", "--classes", "nan_inf,peaked", "--timeout", "4", "--out", str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 crashed" in out and CAUSES[kernel] in out, out
    assert CAUSES[kernel] in (tmp_path / "stability.md").read_text(), "the report itself names the crash"
