"""flashcheck.isolation.zygote: a forked pytest run reports what a subprocess would (status, output, the run's
own environment and directory), a timeout kills the child and everything it started, and runs the
server cannot take fall back to subprocesses."""
from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from flashcheck.isolation import zygote
from flashcheck.plugin.selftest import clean_env

pytestmark = pytest.mark.skipif(not zygote.usable(), reason="fork servers serve CPU runs on POSIX only")

TESTS = textwrap.dedent('''
    import os, subprocess, sys, time
    from pathlib import Path

    def test_env_and_cwd():
        assert os.environ["ZYGOTE_X"] == "1" and Path("marker.txt").is_file()
        print("SEEN-IN-CHILD")

    def test_fails():
        assert False, "FAILED-ON-PURPOSE"

    def test_hangs_with_a_grandchild():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path("grandchild.pid").write_text(str(p.pid))
        time.sleep(600)
''')


@pytest.fixture(scope="module")
def server() -> zygote.Zygote:
    z = zygote.Zygote(clean_env(), Path.cwd())
    assert z.proc is not None, "the server did not start"
    yield z
    z.close()


def _dir(tmp_path: Path) -> Path:
    (tmp_path / "test_z.py").write_text(TESTS)
    (tmp_path / "marker.txt").write_text("")
    return tmp_path


def test_a_forked_run_reports_status_output_env_and_cwd(server: zygote.Zygote, tmp_path: Path) -> None:
    d = _dir(tmp_path)
    env = clean_env({"ZYGOTE_X": "1"})
    rc, timed_out = server.run(["-q", "-s", "-p", "no:cacheprovider", "test_z.py::test_env_and_cwd"], env=env, cwd=d,
                               out=d / "out.txt", timeout=120)
    text = (d / "out.txt").read_text()
    assert (rc, timed_out) == (0, False) and "SEEN-IN-CHILD" in text and "1 passed" in text, text
    rc, _ = server.run(["-q", "-p", "no:cacheprovider", "test_z.py::test_fails"], env=env, cwd=d, out=d / "out.txt",
                       timeout=120)
    text = (d / "out.txt").read_text()
    assert rc == 1 and "FAILED-ON-PURPOSE" in text and "1 failed" in text, text
    assert "ZYGOTE_X" not in os.environ, "the run's environment stays in its child"


def test_a_timeout_kills_the_child_and_what_it_started(server: zygote.Zygote, tmp_path: Path) -> None:
    d = _dir(tmp_path)
    rc, timed_out = server.run(["-q", "-p", "no:cacheprovider", "test_z.py::test_hangs_with_a_grandchild"],
                               env=clean_env(), cwd=d, out=d / "out.txt", timeout=8)
    assert timed_out and rc is None
    pid = int((d / "grandchild.pid").read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment to reap it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung run's grandchild {pid} outlived the timeout")
    # and the server still serves
    rc, _ = server.run(["-q", "-p", "no:cacheprovider", "test_z.py::test_fails"], env=clean_env(), cwd=d,
                       out=d / "out.txt", timeout=120)
    assert rc == 1


def test_runs_the_server_cannot_take_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert zygote.takes({"FLASHCHECK_MUTANT": "x"})
    assert not zygote.takes({"OMP_NUM_THREADS": "4"}) and not zygote.takes({"PYTHONHASHSEED": "0"})
    monkeypatch.setenv("FLASHCHECK_NO_ZYGOTE", "1")
    assert zygote.server(clean_env(), Path.cwd()) is None
    dead = zygote.Zygote.__new__(zygote.Zygote)
    dead.proc, dead._buf = None, b""
    assert dead.run(["-q"], env={}, cwd=Path.cwd(), out=Path(os.devnull), timeout=1) is None
