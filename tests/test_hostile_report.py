"""The stability report under hostile use (issue 49): bad --out folders and option values, kernels
that raise, hang, print megabytes, return the wrong thing or write into --out while it runs, and
interrupted runs. Each case is one clear line and the contract's exit status (flashcheck/exitcodes.py),
never a traceback; a kernel's failure is always a written report with its FAIL verdict.

In-process (reports/stability/cli.py's `main`, the supervised child's code) where the case allows it; the
hang needs the supervisor and runs as a subprocess (slow)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashcheck import HOME, exitcodes
from flashcheck.reports.stability import cli as report
from flashcheck.plugin.selftest import clean_env
from tests.test_exits import KERNELS as EXIT_KERNELS, TINY, _one_line

# test_exits' TINY (one dtype, no baselines, one input) with two classes: a second or two.
SMALL = [*TINY, "--classes", "benign,ties"]

# Its kernels (good, wrong, ...) and these.
KERNELS = EXIT_KERNELS + textwrap.dedent('''
    import time
    from pathlib import Path

    def raises(x):
        raise RuntimeError("boom")

    def hangs(x):
        if "HOSTILE_MARK" in os.environ:  # the test's cue: the kernel is running
            Path(os.environ["HOSTILE_MARK"]).touch()
        time.sleep(3600)

    def chatty(x):
        print("z" * 100_000)
        os.write(2, b"e" * 100_000 + b"\\n")  # below Python, as C code or device printf would
        return good(x) * 1.5

    def not_a_tensor(x):
        return [1.0]

    def float64(x):
        return good(x).double()

    def writes_into_out(x):
        Path(os.environ["HOSTILE_OUT"], "notes.txt").write_text("mine")
        return good(x)

    def interrupted(x):
        raise KeyboardInterrupt

    for f in (good, raises, hangs, chatty, not_a_tensor, float64, writes_into_out, interrupted):
        f.flashcheck = {"dtypes": ["fp32"]}
''')


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    p = tmp_path / "hostile.py"
    p.write_text(KERNELS)
    return p


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad usage is refused before anything is measured."""
    monkeypatch.setattr("flashcheck.reports.stability.run.collect", lambda *a, **k: pytest.fail("measured"))


def _run(argv: list[str]) -> int:
    return exitcodes.guarded(report.PROG, report.main, argv)


def _verdict(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(("FAIL", "PASS"))]
    return line


# ---- kernels that fail in hostile ways: a written report, its FAIL verdict, exit 1 -------------------

def test_always_raising_kernel_is_a_fail_verdict_with_plots(tmp_path: Path, kernels: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Plotting died on a kernel with nothing measured (`fig.legend(ncol=0)`): exit 3, no report."""
    out = tmp_path / "rep"
    assert _run([f"{kernels}:raises", *SMALL, "--out", str(out)]) == exitcodes.FAILED
    seen = capsys.readouterr()
    assert "Traceback" not in seen.err and "internal error" not in seen.err, seen.err
    assert _verdict(seen.out).startswith("FAIL    hostile.raises: raised on 2 class(es)"), seen.out
    assert "**FAIL** [hostile.raises]" in (out / "stability.md").read_text()
    assert (out / "stability_softmax_heatmap.png").is_file()


@pytest.mark.parametrize("kernel, words", [("not_a_tensor", "returned a list, not a tensor (expected torch.float32"),
                                           ("float64", "returned torch.float64 (")])
def test_a_kernel_returning_the_wrong_thing_fails_in_words(tmp_path: Path, kernels: Path, kernel: str, words: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    assert _run([f"{kernels}:{kernel}", *SMALL, "--out", str(tmp_path / "rep"), "--no-plots"]) == exitcodes.FAILED
    line = _verdict(capsys.readouterr().out)
    assert line.startswith(f"FAIL    hostile.{kernel}: raised on 2 class(es)") and words in line, line


@pytest.mark.slow
def test_always_hanging_kernel_stops_after_two_hangs(tmp_path: Path, kernels: Path) -> None:
    """Every input timed out in turn (72 x 300 s by default) before the plots crashed; now two hangs
    and the kernel's remaining inputs are not run, and the report says so."""
    out = tmp_path / "rep"
    p = subprocess.run([sys.executable, "-m", "flashcheck.cli.main", "report", f"{kernels}:hangs", *SMALL, "--examples", "2",
                        "--timeout", "1", "--out", str(out)],
                       cwd=tmp_path, env=clean_env({"CI": "true"}), capture_output=True, text=True, timeout=300)
    assert p.returncode == exitcodes.FAILED, p.stdout[-2000:] + p.stderr[-2000:]
    line = _verdict(p.stdout)
    assert line.startswith("FAIL    hostile.hangs: hung on 2 input(s); the rest not run (2 inputs)"), line
    assert p.stderr.count("CRASHED") == 2 and "2 crashed, 0 skipped, 2 not run" in p.stderr, p.stderr[-2000:]
    assert "hung on 2 input(s); the rest not run" in (out / "stability.md").read_text()


def test_kernel_output_is_capped(tmp_path: Path, kernels: Path, capfd: pytest.CaptureFixture) -> None:
    """100 kB printed per call made a 22.7 MB log: the head and tail are kept, the cut is said."""
    assert _run([f"{kernels}:chatty", *SMALL, "--out", str(tmp_path / "rep"), "--no-plots"]) == exitcodes.FAILED
    seen = capfd.readouterr()
    assert len(seen.out) + len(seen.err) < 20_000, (len(seen.out), len(seen.err))
    assert re.search(r"\[\.\.\. 39\d kB of kernel output cut: 400 kB printed in all", seen.err), seen.err[-3000:]
    assert _verdict(seen.out).startswith("FAIL    hostile.chatty")


# ---- --out ---------------------------------------------------------------------------------------------

def test_a_file_written_into_out_while_it_runs_is_kept(tmp_path: Path, kernels: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder was checked only before measuring; the swap then deleted what appeared in it."""
    out = tmp_path / "rep"
    out.mkdir()
    (out / "stability.md").write_text("the earlier report")
    monkeypatch.setenv("HOSTILE_OUT", str(out))
    assert _run([f"{kernels}:writes_into_out", *SMALL, "--out", str(out), "--no-plots"]) == exitcodes.OK
    assert (out / "notes.txt").read_text() == "mine"
    assert "**PASS**" in (out / "stability.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["hostile.py", "rep"], "no staging folder left"


@pytest.mark.parametrize("where", ["reports/records/stability_gpu", "reports/.hostile-report-test"])
def test_out_inside_flashcheck_itself_is_refused(where: str, no_measuring: None, capsys: pytest.CaptureFixture) -> None:
    """A CPU report written over the committed GPU record, or among the tool's sources."""
    target = HOME / where
    before = sorted(target.iterdir()) if target.is_dir() else None
    try:
        assert _run(["softmax_row", "--out", str(target)]) == exitcodes.USAGE
    finally:
        if before is None:
            shutil.rmtree(target, ignore_errors=True)
    assert "is inside flashcheck's own package" in _one_line(capsys.readouterr().err)
    assert (sorted(target.iterdir()) if target.is_dir() else None) == before


@pytest.mark.parametrize("how", ["name too long", "symlink loop", "proc"])
def test_out_that_cannot_be_made_is_refused_before_measuring(tmp_path: Path, how: str, no_measuring: None,
                                                             capsys: pytest.CaptureFixture) -> None:
    """Each was found only after measuring (exit 3): os.access says yes to root on /proc, the
    staging folder's longer name did not fit, a symlink loop escaped Path.resolve."""
    if how == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("Linux /proc")
    if how == "symlink loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
    target = {"name too long": tmp_path / ("r" * 250), "symlink loop": tmp_path / "a" / "rep",
              "proc": Path("/proc/flashcheck-report")}[how]
    assert _run(["softmax_row", "--out", str(target)]) == exitcodes.USAGE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("flashcheck report: --out ") and {
        "name too long": "is too long", "symlink loop": "cannot be resolved", "proc": "cannot create a folder in /proc"
    }[how] in line, line


# ---- option values -------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--classes", ","], "argument --classes: ','"),  # once: every class
    (["--dtypes", ""], "argument --dtypes: ''"),  # once: every dtype
    (["--examples", "1000000000"], "--examples 1000000000: expected a whole number from 1 to"),  # once: drew forever
    (["--budget", "nan"], "--budget nan: expected a positive number"),
    (["--compare", "softmax_row", "softmax_row"], "the same kernel twice"),
])
def test_bad_option_values_are_one_line_exit_2(argv: list[str], words: str, no_measuring: None,
                                               capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert _run(["softmax_row", *argv, "--out", str(tmp_path / "rep")]) == exitcodes.USAGE
    assert words in _one_line(capsys.readouterr().err)


def test_a_bad_environment_default_is_named_as_such(monkeypatch: pytest.MonkeyPatch, no_measuring: None,
                                                    capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    monkeypatch.setenv("FLASHCHECK_REPORT_EXAMPLES", "0")
    assert _run(["softmax_row", "--out", str(tmp_path / "rep")]) == exitcodes.USAGE
    assert "FLASHCHECK_REPORT_EXAMPLES=0: expected" in _one_line(capsys.readouterr().err)


# ---- interrupted runs ----------------------------------------------------------------------------------

def test_an_interrupted_report_leaves_the_earlier_one(tmp_path: Path, kernels: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rep"
    out.mkdir()
    (out / "stability.md").write_text("the earlier report")
    assert _run([f"{kernels}:interrupted", *SMALL, "--out", str(out)]) == exitcodes.INTERRUPTED
    assert _one_line(capsys.readouterr().err) == "flashcheck report: interrupted"
    assert [p.name for p in out.iterdir()] == ["stability.md"] and (out / "stability.md").read_text() == \
        "the earlier report"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["hostile.py", "rep"]


@pytest.mark.slow
def test_ctrl_c_on_a_supervised_report_is_one_line(tmp_path: Path, kernels: Path) -> None:
    """Ctrl-C in a terminal reaches the supervisor and its child: both said "interrupted", and the
    supervisor's journal folder was left in the temporary folder."""
    import signal
    import time

    out, scratch, mark = tmp_path / "rep", tmp_path / "tmp", tmp_path / "running"
    out.mkdir()
    scratch.mkdir()
    (out / "stability.md").write_text("the earlier report")
    p = subprocess.Popen([sys.executable, "-m", "flashcheck.cli.main", "report", f"{kernels}:hangs", *TINY, "--timeout", "200",
                          "--out", str(out)], cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=clean_env({"CI": "true", "HOSTILE_MARK": str(mark), "TMPDIR": str(scratch)}))
    deadline = time.monotonic() + 240
    while not mark.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == exitcodes.INTERRUPTED, stdout + stderr
    assert _one_line(stderr) == "flashcheck report: interrupted"
    assert (out / "stability.md").read_text() == "the earlier report" and not list(scratch.iterdir())


# ---- what the README and git promise -------------------------------------------------------------------

def test_the_readme_names_the_files_a_report_writes(tmp_path: Path, kernels: Path) -> None:
    """The Quick start promised a stability.png that is never written."""
    line = next(ln for ln in (HOME / "README.md").read_text().splitlines() if "python -m flashcheck.reports" in ln)
    promised = line.split("# writes ./flashcheck-report/", 1)[1].replace(" and ", ",").replace(",stability", " stability")
    out = tmp_path / "rep"
    assert _run([f"{kernels}:good", *SMALL, "--out", str(out)]) == exitcodes.OK
    written = sorted(p.name for p in out.iterdir())
    for pattern in promised.split():
        m = re.fullmatch(r"(\w+)\.\{([\w,]+)\}", pattern)
        names = [f"{m[1]}.{ext}" for ext in m[2].split(",")] if m else [pattern]
        for name in names:
            assert any(Path(w).match(name) for w in written), (name, written)


def test_the_default_output_folder_is_ignored_by_git() -> None:
    if not (HOME / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs flashcheck's git checkout")
    for path in (f"{report.DEFAULT_OUT}/stability.md", f".{report.DEFAULT_OUT}.new-abcd1234/stability.md"):
        p = subprocess.run(["git", "check-ignore", "-q", path], cwd=HOME)
        assert p.returncode == 0, f"{path} is not ignored by git"
