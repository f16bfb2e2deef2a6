"""Progress in CI logs, and a partial summary when a run is stopped (issue 48 item 5).

A CI log is a file: Python buffers what pytest writes to it, so a `flashcheck check` killed by the
job's timeout used to leave an empty log. In a kernel run whose stdout is not a terminal, the
pytest process that reports (the supervised child, or xdist's controller) prints, flushed, a line
`flashcheck: N/M tests done (F failures, S s)` at most every $FLASHCHECK_PROGRESS seconds (default
10; 0 turns it off) and when the last test ends, and each failure the moment it is reported, with
its test id.

`flashcheck check` itself (the supervisor's parent) turns SIGTERM into the Ctrl-C it already
handles: the child is asked to stop (SIGINT: pytest ends the session), killed after a grace period,
with every xdist worker it journalled; then the run's journal gives the partial summary (passed,
failed, crashed, skipped, not run) and the status: 1 if any test failed, else 130 (interrupted).
Fixtures already written stay whole: each is written atomically (flashcheck.atomic).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

ENV = "FLASHCHECK_PROGRESS"
#: Seconds the child gets to end its own session after it is asked to stop.
GRACE = 10.0


def _every() -> float:
    try:
        return float(os.environ.get(ENV, "10"))
    except ValueError:
        return 10.0


class Progress:
    def __init__(self, config: pytest.Config, every: float) -> None:
        from flashcheck.isolation import journal as isolation

        self.config, self.every = config, every
        self.before = len(isolation.excluded())  # run by an earlier child of this run (after a crash)
        self.total = self.done = self.failed = 0
        self.seen: set[str] = set()
        self.t0 = self.last = time.monotonic()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = self.total or len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.total = self.total or len(ids)

    def _line(self, text: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            print(text, flush=True)
            return
        tr.ensure_newline()
        if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):  # xdist's letters: not tracked
            tr.write("\n")
        tr.write_line(text)
        tr.flush()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.seen and (report.when == "call" or report.outcome != "passed"):
            self.seen.add(report.nodeid)
            self.done += 1
        now = time.monotonic()
        if report.failed:
            self.failed += 1
            self._line(f"flashcheck: FAILED {report.nodeid} ({self.before + self.done}/{self.before + self.total} "
                       f"tests, {now - self.t0:.0f} s)")
        elif report.when == "teardown" and (now - self.last >= self.every or self.done == self.total):
            self.last = now
            self._line(f"flashcheck: {self.before + self.done}/{self.before + self.total} tests done "
                       f"({self.failed} failures, {now - self.t0:.0f} s)")


def register(config: pytest.Config) -> None:
    """For a kernel run writing to a file or pipe, in the process that reports (not a worker)."""
    every = _every()
    if every <= 0 or hasattr(config, "workerinput") or sys.stdout.isatty():
        return
    if not config.pluginmanager.has_plugin("flashcheck-progress"):
        config.pluginmanager.register(Progress(config, every), "flashcheck-progress")


# ---- the parent: SIGTERM and SIGINT ---------------------------------------------------------------

class Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the parent waits, as Ctrl-C is."""


@contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM raises `Stopped` in this (main) thread while the block runs."""
    def on_term(signum: int, frame: Any) -> None:
        raise Stopped()

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is dead; a reused pid of another program is not ours
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return stat.split(") ", 1)[1][:1] != "Z" and b"python" in f.read()
    except OSError:
        return True


def stop(sup: Any, terminated: bool) -> int:
    """End the supervised run after SIGTERM or SIGINT (see the module docstring); its status."""
    import shutil

    from flashcheck import exitcodes

    from flashcheck.isolation import journal as isolation

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the summary short
    proc = getattr(sup, "proc", None)
    if proc is not None and proc.poll() is None:
        try:
            if terminated:  # Ctrl-C reached the child with this process; SIGTERM reached this one alone
                proc.send_signal(signal.SIGINT)
            proc.wait(GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    events = isolation.read_journal(sup.dir)
    finished = {e["pid"] for e in events if e["ev"] == "finished"}
    workers = {e["pid"] for e in events if e.get("pid")} - finished - {getattr(proc, "pid", None)}
    for pid in workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    s = isolation.tally(sup.dir)
    shutil.rmtree(sup.dir, ignore_errors=True)
    sup.result = s
    failed = bool(s["failed"] or s["crashed"])
    how = "SIGTERM" if terminated else "SIGINT (Ctrl-C)"
    status = exitcodes.FAILED if failed else exitcodes.INTERRUPTED
    print(f"\nflashcheck: stopped by {how} before the end (exit {status}):\n"
          f"{isolation.format_tally(s, sup.unit, sup.words)}", flush=True)
    return status
