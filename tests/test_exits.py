"""The exit-status contract (flashcheck/exitcodes.py) and atomic reports (reports/stability/output.py), issue 18.3.

0 passes, 1 a kernel fails, 2 bad usage or input (one line, before any measuring), 3 the tool
itself failed (one line and a traceback file), 5 nothing was checked. A report is swapped in whole:
a crash while plotting leaves the earlier report byte-identical, and no stale picture survives.
In-process where the command allows it (fast); the subprocesses use the smallest selections.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashcheck import exitcodes

from flashcheck.isolation import journal as isolation, supervisor
from flashcheck.cli.main import main as flashcheck
from flashcheck.reports.stability import cli as report, output
from flashcheck.plugin.selftest import clean_env

ROOT = Path(__file__).resolve().parent.parent
# One dtype, one class, one input, no baselines: about a second under the interpreter.
TINY = ["--family", "softmax", "--examples", "1", "--dtypes", "fp32", "--classes", "benign", "--no-baselines",
        "--quiet"]

KERNELS = textwrap.dedent('''
    import os, sys
    import torch

    def good(x):
        return torch.softmax(x.float(), dim=-1).to(x.dtype)

    def wrong(x):
        return good(x) * 1.5

    def exits(x):
        os._exit(0)

    def calls_sys_exit(x):
        sys.exit(0)

    for f in (good, wrong, exits, calls_sys_exit):
        f.flashcheck = {"dtypes": ["fp32"]}
''')


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    p = tmp_path / "k.py"
    p.write_text(KERNELS)
    return p


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flashcheck report/replay` as their supervised child: in this process, so a monkeypatch
    reaches them (the journal goes to a scratch folder)."""
    journal = tmp_path / "journal"
    journal.mkdir()
    monkeypatch.setattr(isolation, "_DIR", str(journal))
    monkeypatch.setattr(isolation, "_EXCLUDE", None)
    monkeypatch.setitem(isolation._J, "fd", None)
    monkeypatch.delenv(isolation.TIMEOUT_ENV, raising=False)
    from flashcheck.fixtures import store as fx

    for k in list(fx._SETTINGS):  # `replay` in-process switches fixture saving off: restored after
        monkeypatch.setitem(fx._SETTINGS, k, fx._SETTINGS[k])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- the contract itself ---------------------------------------------------------------------------

def test_worst_wins_and_pytest_maps() -> None:
    assert exitcodes.worst() == 0
    assert exitcodes.worst(0, 5) == 5 and exitcodes.worst(5, 2) == 2 and exitcodes.worst(2, 1) == 1
    assert exitcodes.worst(1, 3) == 3 and exitcodes.worst(0, 77) == 77, "an unknown status is the tool's"
    assert [exitcodes.from_pytest(c) for c in range(6)] == [0, 1, 3, 3, 2, 5]


def test_the_table_is_documented_everywhere(capsys: pytest.CaptureFixture) -> None:
    codes = {exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE, exitcodes.INTERNAL, exitcodes.NOTHING_CHECKED,
             exitcodes.INTERRUPTED}
    readme = (ROOT / "README.md").read_text().split("## Exit status", 1)[1].split("\n## ", 1)[0]
    assert {int(c) for c in re.findall(r"^\| (\d+) \|", readme, re.M)} == codes
    assert {int(c) for c in re.findall(r"^ +(\d+)  ", exitcodes.TABLE, re.M)} == codes
    assert flashcheck(["--help"]) == 0
    for argv in (["check", "--help"], ["replay", "--help"], ["report", "--help"]):
        assert flashcheck(argv) == 0
    out = capsys.readouterr().out
    assert out.count(exitcodes.TABLE.splitlines()[-1].strip()) == 4, out


def test_an_escaped_exception_is_3_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exitcodes.tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(exitcodes.TRACEBACK_ENV, raising=False)

    def broken(argv):
        return {}["missing"]

    assert exitcodes.guarded("flashcheck x", broken, []) == 3
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("flashcheck x: internal error (a bug in flashcheck, not a verdict on the kernel): "
                           "KeyError: 'missing', at tests/test_exits.py:") and "in broken" in line, line
    (saved,) = tmp_path.glob("flashcheck-crash-*.txt")
    assert str(saved) in line and "Traceback" in saved.read_text()
    monkeypatch.setenv(exitcodes.TRACEBACK_ENV, "1")
    assert exitcodes.guarded("flashcheck x", broken, []) == 3
    assert "Traceback" in capsys.readouterr().err, "the traceback on request"


def test_usage_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture) -> None:
    for argv in (["report", "--bogus"], ["report", "--timeout", "soon"], ["replay", "x.json", "--timeout", "0"],
                 ["kernels", "--bogus"], ["nosuch"]):
        assert flashcheck(argv) == 2, argv
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("flashcheck"), line


# ---- reports: validated up front, swapped in whole ------------------------------------------------

def test_out_at_a_file_exits_2_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.html"
    target.write_text("mine")
    monkeypatch.setattr("flashcheck.reports.stability.run.collect", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(supervisor, "supervise", lambda *a, **k: pytest.fail("started a child"))
    monkeypatch.setattr(supervisor.Supervisor, "run", lambda *a, **k: pytest.fail("started a child"))
    assert flashcheck(["report", "softmax_row", "--out", str(target)]) == 2
    assert "is a file, not a folder" in _one_line(capsys.readouterr().err)
    notes = tmp_path / "docs"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    assert flashcheck(["report", "softmax_row", "--out", str(notes)]) == 2
    assert "notes.txt" in _one_line(capsys.readouterr().err)
    assert target.read_text() == "mine" and (notes / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_python_m_reports_at_a_file_is_fast(tmp_path: Path) -> None:
    """The README's entry point: refused before any kernel is loaded or measured."""
    (tmp_path / "out").write_text("")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "flashcheck.reports", "--out", "out"], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--out" in _one_line(p.stderr) and time.perf_counter() - t0 < 60


def test_crash_while_plotting_leaves_the_earlier_report(tmp_path: Path, kernels: Path, in_process: None,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rep"
    assert flashcheck(["report", f"{kernels}:good", *TINY, "--out", str(out)]) == 0
    before = _snapshot(out)
    assert any(n.endswith(".png") for n in before) and "stability.md" in before

    from flashcheck.reports.stability import plots

    def crash(*a, **k):
        raise RuntimeError("matplotlib fell over")

    monkeypatch.setattr(plots, "profiles", crash)  # after the heat map is already written
    assert flashcheck(["report", f"{kernels}:wrong", *TINY, "--out", str(out)]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "internal error" in line and "RuntimeError: matplotlib fell over" in line, line
    assert _snapshot(out) == before, "the earlier report was (partly) replaced"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rep")] == [], "a staging folder was left"


def test_no_plots_leaves_no_stale_pictures(tmp_path: Path, kernels: Path, in_process: None) -> None:
    out = tmp_path / "rep"
    assert flashcheck(["report", f"{kernels}:good", *TINY, "--out", str(out)]) == 0
    assert any(p.suffix == ".png" for p in out.iterdir())
    assert flashcheck(["report", f"{kernels}:wrong", *TINY, "--out", str(out), "--no-plots"]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["stability.html", "stability.json", "stability.md"]
    assert "**FAIL**" in (out / "stability.md").read_text()


def test_swap_puts_the_old_folder_back_when_the_new_cannot_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, new = tmp_path / "rep", tmp_path / "new"
    for d, text in ((out, "old"), (new, "new")):
        d.mkdir()
        (d / "stability.md").write_text(text)
    real = output.os.rename

    def refuse_new(src, dst):
        if Path(src) == new:
            raise OSError("no")
        return real(src, dst)

    monkeypatch.setattr(output.os, "rename", refuse_new)
    with pytest.raises(OSError):
        output.swap(new, out)
    assert (out / "stability.md").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["new", "rep"]


def test_a_kernel_calling_sys_exit_is_its_error_not_a_green_exit(tmp_path: Path, kernels: Path, in_process: None) -> None:
    out = tmp_path / "rep"
    assert flashcheck(["report", f"{kernels}:calls_sys_exit", *TINY, "--out", str(out), "--no-plots"]) == 1
    assert "SystemExit" in (out / "stability.md").read_text()


# ---- check and replay, end to end (subprocesses, the smallest selections) ------------------------

def _check(cwd: Path, kernel: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcheck.cli.main", "check", f"k.py:{kernel}", "--family", "softmax",
                           "--hypothesis-profile", "smoke", "-q", "-p", "no:randomly", "--no-save-fixtures", *extra],
                          cwd=cwd, env=clean_env({"CI": "true"}), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_check_exit_statuses(kernels: Path) -> None:
    """1 a wrong kernel (stopped by -x under xdist too); 5 all skipped or all deselected (never 0); 0 a
    correct one; 2 a bad option."""
    d = kernels.parent
    wrong = _check(d, "wrong", "-k", "two_equal")
    assert wrong.returncode == 1 and "1 failed" in wrong.stdout, wrong.stdout[-2000:] + wrong.stderr[-2000:]
    # xdist ends a run stopped by -x as interrupted (pytest's 2), which once read as the tool failing
    stopped = _check(d, "wrong", "-n", "2", "-x", "-k", "adversarial_class and fp32")
    assert stopped.returncode == 1 and "stopping after" in stopped.stdout, \
        stopped.stdout[-2000:] + stopped.stderr[-2000:]
    skipped = _check(d, "good", "-k", "declared_sizes or row_too_long")
    err = skipped.stderr.strip().splitlines()[-1]
    assert skipped.returncode == 5 and err.startswith("flashcheck check: nothing was checked: all 2 tests were "
                                                      "skipped"), skipped.stdout[-2000:] + skipped.stderr[-2000:]
    none = _check(d, "good", "-k", "no_such_test")
    assert none.returncode == 5 and "nothing was checked: no test selected" in none.stderr, none.stderr[-2000:]
    good = _check(d, "good", "-k", "two_equal")
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    bad = _check(d, "good", "--no-such-option")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]


def test_replay_exit_statuses(tmp_path: Path, kernels: Path, in_process: None, capsys: pytest.CaptureFixture) -> None:
    """1 a failing fixture (sys.exit in the kernel included); 5 no fixture for the kernel."""
    import torch

    from flashcheck.fixtures import store as fx
    from flashcheck.targets.external import load_kernel
    from flashcheck.strategies.case import Case

    case = Case(tensors={"x": torch.linspace(-1, 1, 3).reshape(1, 3)}, label="t")
    path = fx.save_fixture(load_kernel(f"{kernels}:good", "softmax"), "matches_oracle", case,
                           AssertionError("recorded"), tmp_path / "fixtures")
    assert flashcheck(["replay", str(path), "--kernel", f"{kernels}:good"]) == 0
    assert flashcheck(["replay", str(path), "--kernel", f"{kernels}:wrong"]) == 1
    assert flashcheck(["replay", str(path), "--kernel", f"{kernels}:calls_sys_exit"]) == 1
    assert "the kernel called sys.exit(0)" in capsys.readouterr().out
    assert flashcheck(["replay", str(path.parent), "--kernel", f"{kernels}:wrong"]) == 5
    assert "nothing was checked" in capsys.readouterr().err


@pytest.mark.slow
def test_python_m_reports_is_supervised(kernels: Path) -> None:
    """`python -m flashcheck.reports` once ran unsupervised: a kernel's os._exit(0) ended it green."""
    p = subprocess.run([sys.executable, "-m", "flashcheck.reports", "k.py:exits", *TINY, "--out", "rep", "--no-plots"],
                       cwd=kernels.parent, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "the kernel k.exits exited with code 0" in p.stderr, p.stderr[-2000:]
    # A hard exit outside any kernel call (its module's import): refused and named, like any
    # module that cannot be imported (status 2), never a pass.
    (kernels.parent / "at_import.py").write_text("import os\nos._exit(0)\n")
    p = subprocess.run([sys.executable, "-m", "flashcheck.reports", "at_import.py:good", *TINY, "--out", "rep"],
                       cwd=kernels.parent, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "importing it called os._exit(0)" in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.parametrize("how", ["os._exit(0)", "os._exit(3)", "sys.exit(0)"])
@pytest.mark.parametrize("command", ["check", "replay", "report"])
def test_a_kernel_module_that_exits_at_import_is_named_not_green(tmp_path: Path, how: str, command: str,
                                                                  capfd: pytest.CaptureFixture) -> None:
    """os._exit(0) at import ended `flashcheck check` with exit 0 and nothing printed: the import is
    the first kernel code the tool runs, before any supervised child exists."""
    mod = tmp_path / "exits_at_import.py"
    mod.write_text(f"import os, sys\n{how}\n\ndef softmax(x):\n    return x\n")
    target = f"{mod}:softmax"
    argv = {"check": ["check", target, "--family", "softmax"],
            "replay": ["replay", str(tmp_path), "--kernel", target, "--family", "softmax"],
            "report": ["report", target, *TINY, "--out", str(tmp_path / "rep")]}[command]
    assert flashcheck(argv) == exitcodes.USAGE
    seen = capfd.readouterr()  # replay and report name it from their supervised child
    err = (seen.out + seen.err).strip().splitlines()
    assert len(err) == 1 and f"importing it {'called ' + how if how.startswith('os') else 'raised SystemExit'}" in err[0], err
    import os
    assert os._exit.__module__ in ("posix", "nt", "os"), "the import's guard must hand os._exit back"
