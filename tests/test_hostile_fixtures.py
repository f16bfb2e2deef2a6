"""Fixtures, replay and crash isolation under hostile use (issue 49, second round).

Each case is one thing a user can do to the tool: a kernel that exits or hangs on an input and is
checked again, a kernel that writes into its input, a failure next to a crash in one replay, `-x`
with a crash, Ctrl-C, a fixture folder with spaces in its name, an out= kernel's repro, a corrupt
or incomplete fixture. Each asserts the one line that says what happened, the exit status of
`flashcheck.exitcodes`, that the fixtures read are left as they were and that no half-written
file is left beside them. The unit cases run in process; the `slow` ones run the command line.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashcheck import exitcodes

from flashcheck.fixtures import store as fixtures

from flashcheck.isolation import journal as isolation, supervisor

from flashcheck.properties import runner as properties
from flashcheck.families import load_properties
from flashcheck.targets.external import load_kernel
from flashcheck.kernels.registry import KernelSpec
from flashcheck.fixtures.repro import replay_note
from flashcheck.plugin.selftest import clean_env
from flashcheck.strategies.case import Case

KERNELS = textwrap.dedent('''
    import os, torch

    def _softmax(x):
        return torch.softmax(x.float(), -1).to(x.dtype)

    def good(x):
        return _softmax(x)

    def mixed(x):  # exits on a NaN, wrong on a 2.0, right on anything else
        if bool(torch.isnan(x).any()):
            os._exit(3)
        if bool((x == 2.0).any()):
            return torch.zeros_like(x)
        return _softmax(x)

    for f in (good, mixed):
        f.flashcheck = {"dtypes": ["fp32"]}
''')


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A kernel file in a folder whose name has a space (a path the printed commands must quote)."""
    d = tmp_path / "my kernels"
    d.mkdir()
    (d / "k.py").write_text(KERNELS)
    return d


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process journalling as a supervised child would, with its own fixture settings."""
    journal = tmp_path / "journal"
    journal.mkdir()
    monkeypatch.setattr(isolation, "_DIR", str(journal))
    monkeypatch.setattr(isolation, "_J", {"fd": None, "task": None})
    monkeypatch.setattr(fixtures, "_SETTINGS", dict(fixtures._SETTINGS))
    return journal


def _row(*values: float) -> Case:
    return Case(tensors={"x": torch.tensor([values], dtype=torch.float32)}, kwargs={}, label="hostile")


def _crash_fixture(journal: Path, spec: KernelSpec, folder: Path) -> Path:
    """What the supervisor writes for a kernel that died on a NaN row (its journal, then `explain`)."""
    fixtures.configure(save=True, directory=folder)
    isolation.start("test_crash", 5)
    isolation.note_input(spec, "input_untouched", _row(float("nan")))
    supervisor.explain(isolation.in_flight(isolation.read_journal(journal)), 3, time.time())
    (path,) = folder.glob("*input_untouched*.json")
    return path


def _fixture(spec: KernelSpec, folder: Path, *values: float) -> Path:
    return fixtures.save_fixture(spec, "matches_oracle", _row(*values), AssertionError("recorded"), folder)


def _cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcheck.cli.main", *args], cwd=cwd, env=clean_env({"CI": "true"}),
                          capture_output=True, text=True, timeout=timeout)


def _check_replays(project: Path, folder: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli(project, "check", "k.py:mixed", "--family", "softmax", "-q", "-p", "no:randomly", "-p", "no:xdist",
                "-k", "replay_fixture", "--fixture-dir", str(folder), "--timeout", "60", *extra)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture
def mixed_folder(project: Path, fresh_state: Path) -> Path:
    """A crash fixture (written as the supervisor writes it), two failing and one passing fixture."""
    spec = load_kernel(f"{project}/k.py:mixed", "softmax")
    folder = project / "fixtures dir"
    _crash_fixture(fresh_state, spec, folder)
    for row in ((2.0,), (2.0, 0.0), (0.5,)):
        _fixture(spec, folder, *row)
    return folder


# ---- item 1: crash and hang fixtures are replayed ---------------------------------------------------

def test_a_crash_fixture_carries_the_kernels_identity(project: Path, fresh_state: Path) -> None:
    spec = load_kernel(f"{project}/k.py:mixed", "softmax")
    path = _crash_fixture(fresh_state, spec, project / "fx")
    assert json.loads(path.read_text())["identity"] == fixtures.kernel_identity(spec)
    (plan,) = fixtures.plan_replays([path], [spec])
    assert plan.status == "run", plan.reason


@pytest.mark.slow
def test_check_replays_a_crash_fixture_as_that_fixtures_crash(project: Path, mixed_folder: Path) -> None:
    before = _snapshot(mixed_folder)
    p = _check_replays(project, mixed_folder)
    out = p.stdout + p.stderr
    assert p.returncode == exitcodes.FAILED, out
    assert "flashcheck: 4 tests: 1 passed, 2 failed, 1 crashed" in out, out
    crash = next(n for n in before if "input_untouched" in n)
    assert f"test_replay_fixture[{crash}]: the kernel k.mixed exited with code 3" in out, out
    assert f"replaying the fixture {mixed_folder / crash}" in out, out
    assert _snapshot(mixed_folder) == before, "a replay rewrote or added fixtures"


# ---- item 8: replay's tally after a crash ----------------------------------------------------------

@pytest.mark.slow
def test_replay_counts_failures_beside_a_crash(project: Path, mixed_folder: Path) -> None:
    before = _snapshot(mixed_folder)
    p = _cli(project, "replay", str(mixed_folder), "--kernel", "k.py:mixed", "--timeout", "60")
    out = p.stdout + p.stderr
    assert p.returncode == exitcodes.FAILED, out
    assert out.count("\nFAIL ") + out.startswith("FAIL ") == 2, out
    assert "flashcheck: 4 fixtures: 1 passed, 2 failed, 1 crashed" in out, out
    assert "the kernel k.mixed exited with code 3" in out and "skip " not in out, out
    assert _snapshot(mixed_folder) == before


# ---- item 9: -x stops at a crash -------------------------------------------------------------------

@pytest.mark.slow
def test_maxfail_stops_the_run_at_a_crash(project: Path, mixed_folder: Path) -> None:
    p = _check_replays(project, mixed_folder, "-x")  # the crash fixture's test runs first (sorted names)
    out = p.stdout + p.stderr
    assert p.returncode == exitcodes.FAILED, out
    assert "stopping after the crash (-x/--maxfail reached)" in out, out
    assert "flashcheck: 4 tests: 0 passed, 0 failed, 1 crashed, 0 skipped, 3 not run" in out, out


# ---- item 3: a kernel that writes into its input ---------------------------------------------------

def _overwrites(x: torch.Tensor) -> torch.Tensor:
    y = torch.softmax(x, -1)
    x.fill_(1.0)
    return y


@pytest.mark.parametrize("all_properties", [False, True], ids=["check", "check_all"])
def test_a_fixture_holds_the_input_as_drawn(tmp_path: Path, fresh_state: Path, all_properties: bool) -> None:
    spec = KernelSpec(name="overwrites", family="softmax", fn=_overwrites, dtypes=(torch.float32,))
    load_properties()
    fixtures.configure(save=True, directory=tmp_path / "fx")

    @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    @given(n=st.integers(1, 3))
    def run(n: int) -> None:
        case = Case(tensors={"x": torch.zeros(1, n)}, kwargs={}, label="zeros")
        if all_properties:
            properties.check_all(spec, ("input_untouched", "matches_oracle"), case)
        else:
            properties.check(spec, "input_untouched", case)

    with pytest.raises(AssertionError, match="modified its input storage") as info:
        run()
    (path,) = (tmp_path / "fx").glob("*.json")
    x = json.loads(path.read_text())["tensors"]["x"]
    assert x["bits"] == ["00000000"] and x["values"] == ["0.0"], x
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "np.array([0], dtype=np.uint32)" in notes, notes


# ---- messages: quoting, the repro's call ------------------------------------------------------------

def test_the_printed_replay_command_survives_a_shell(project: Path, fresh_state: Path) -> None:
    spec = load_kernel(f"{project}/k.py:mixed", "softmax")
    path = _fixture(spec, project / "saved fixtures", 2.0)
    (line,) = [ln for ln in replay_note(path, spec).splitlines() if ln.startswith("replay: ")]
    assert shlex.split(line.removeprefix("replay: ")) == ["flashcheck", "replay", str(path), "--kernel",
                                                          f"{project}/k.py:mixed"], line


def test_a_format_1_fixtures_hint_quotes_its_path(project: Path) -> None:
    spec = load_kernel(f"{project}/k.py:mixed", "softmax")
    payload = fixtures.fixture_payload(spec, "matches_oracle", _row(2.0), AssertionError("x"))
    payload.update(format=1, identity=None)
    path = project / "old fixture.json"
    path.write_text(json.dumps(payload))
    (plan,) = fixtures.plan_replays([path], [])
    assert plan.status == "skip" and f"`flashcheck replay {shlex.quote(str(path))} --kernel TARGET`" in plan.reason


@pytest.mark.parametrize("tensors, call", [
    ({"x": torch.zeros(2, 3), "out": torch.full((2, 3), float("nan"))}, "softmax(x, out=out)"),
    ({"x": torch.zeros(2, 3), "shift": torch.tensor(4.0)}, "softmax(x)"),
], ids=["out", "shift"])
def test_the_repro_calls_the_kernel_as_the_check_did(tmp_path: Path, tensors: dict, call: str) -> None:
    seen = []

    def softmax(x, *, out=None):  # keyword-only out=, as the guard-band property passes it
        seen.append(out is not None)
        return torch.softmax(x, -1) if out is None else out.copy_(torch.softmax(x, -1))

    spec = KernelSpec(name="mine.softmax", family="softmax", fn=softmax, dtypes=(torch.float32,))
    path = fixtures.save_fixture(spec, "guard_bands", Case(tensors=tensors, kwargs={}, label="l"), AssertionError(),
                                 tmp_path)
    snippet = replay_note(path, spec).split("repro (rebuilds the exact input bits):\n", 1)[1]
    assert f"out = {call}  # the kernel" in snippet, snippet
    exec(textwrap.dedent(snippet), {"softmax": softmax})
    assert seen == ["out" in tensors]


# ---- bad fixtures: bad input, exit 2, in check and replay alike -------------------------------------

def test_a_fixture_without_the_kernels_tensor_is_a_bad_fixture(project: Path, fresh_state: Path) -> None:
    spec = load_kernel(f"{project}/k.py:good", "softmax")
    path = _fixture(spec, project / "fx", 0.5)
    payload = json.loads(path.read_text())
    payload["tensors"] = {"y": payload["tensors"]["x"]}
    path.write_text(json.dumps(payload))
    (plan,) = fixtures.plan_replays([path], [spec])
    assert plan.status == "bad" and plan.reason == f"bad fixture {path}: no tensor 'x' (the kernel is called on x)"


@pytest.mark.slow
def test_a_corrupt_fixture_is_bad_input_for_check_and_replay(project: Path) -> None:
    folder = project / "fx"
    folder.mkdir()
    corrupt = folder / "k_good__matches_oracle__0123456789ab.json"
    corrupt.write_text('{"format": 2, "kernel": "k.good", "tensors": {')  # cut short, as by a full disk
    before = _snapshot(folder)
    why = f"bad fixture {corrupt}: unreadable (JSONDecodeError"
    p = _cli(project, "replay", str(folder), "--kernel", "k.py:good", "--family", "softmax")
    assert p.returncode == exitcodes.USAGE and f"ERROR {why}" in p.stdout, p.stdout + p.stderr
    p = _cli(project, "check", "k.py:good", "--family", "softmax", "-q", "-p", "no:xdist", "-k", "replay_fixture",
             "--fixture-dir", str(folder))
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("flashcheck check: ")]
    assert p.returncode == exitcodes.USAGE and len(lines) == 1 and lines[0].startswith(f"flashcheck check: {why}"), \
        p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr and "INTERNALERROR" not in p.stdout + p.stderr
    assert _snapshot(folder) == before


# ---- Ctrl-C ------------------------------------------------------------------------------------------

CHATTY_CHILD = textwrap.dedent('''
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # deaf to Ctrl-C, as a kernel stuck in C code is
    open(sys.argv[1], "w").write(str(os.getpid()))
    while True:
        print("still here", flush=True)
        time.sleep(0.05)
''')
SUPERVISOR = textwrap.dedent('''
    import sys
    from flashcheck import exitcodes
    from flashcheck.isolation import journal as isolation, supervisor
    cmd = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
    sys.exit(exitcodes.guarded("flashcheck replay", lambda argv: supervisor.supervise(cmd), []))
''')


def test_ctrl_c_ends_the_supervised_child_before_returning(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", SUPERVISOR, CHATTY_CHILD, str(pid_file)], env=clean_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.time() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=30)
        assert parent.returncode == exitcodes.INTERRUPTED and err.count("interrupted") == 1, err
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)  # ended and reaped before the supervisor returned
    finally:
        parent.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
