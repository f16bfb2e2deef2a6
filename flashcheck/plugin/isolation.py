"""The pytest side of `flashcheck.isolation.journal` (registered by `flashcheck.plugin` for flashcheck's runs).

In a process that runs tests (a supervised child, an xdist worker, a plain pytest): each test is a
journalled task, with its pytest-timeout deadline. A GpuFault ends the process once its failure
(fixture saved) is journalled, when a parent (the supervisor, or xdist) carries on with a fresh
process; a plain pytest with neither skips every later test instead ("not run: CUDA context lost
after the fault in TEST"). In an xdist controller: a crashed worker's "worker crashed" becomes the
named failure, and tests collected but never reported are listed and fail the run.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from flashcheck.isolation import journal as isolation, supervisor
from flashcheck.isolation.faults import GpuFault


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no" \
        and bool(getattr(config.option, "numprocesses", 0))


class PytestJournal:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.controller = _is_controller(config)
        self.lost: str | None = None  # the test whose GpuFault killed this process's context
        self.not_run = 0  # tests skipped since
        self.outcomes: dict[str, str] = {}
        self.skip_reasons: dict[str, str] = {}  # journalled: a run that checked nothing says why
        self.planned: list[str] = []
        self.reported: set[str] = set()
        self.missing: list[str] = []
        self.own_dir: Path | None = None  # a journal this controller made (no supervisor): removed after
        if self.controller:
            if not isolation.enabled():
                self.own_dir = Path(tempfile.mkdtemp(prefix="flashcheck-journal-"))
            isolation.hand_down(self.own_dir)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        isolation.finished()
        if self.own_dir is not None:
            import shutil

            shutil.rmtree(self.own_dir, ignore_errors=True)

    # ---- processes that run tests ----------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        done = isolation.excluded()
        if done:  # reported by an earlier child of this run (or crashed there): not run again
            items[:] = [i for i in items if i.nodeid not in done]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.planned = [i.nodeid for i in session.items]
        if not hasattr(self.config, "workerinput"):
            isolation.record("plan", tasks=self.planned, maxfail=self.config.option.maxfail)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        isolation.start(item.nodeid)
        try:
            return (yield)
        finally:
            isolation.end(item.nodeid, self.outcomes.get(item.nodeid, "passed"), self.skip_reasons.get(item.nodeid))

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> None:
        if settings.timeout:
            isolation.record("timeout", task=item.nodeid, timeout=settings.timeout)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.lost:
            self.not_run += 1
            pytest.skip(f"not run: CUDA context lost after the fault in {self.lost}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        report = yield
        if call.excinfo is not None and call.excinfo.errisinstance(GpuFault) and not self.lost:
            exc = call.excinfo.value
            message = "\n".join([f"{item.nodeid}: {exc}", *getattr(exc, "__notes__", [])])
            isolation.fault_exit(message)  # with a parent: ends here, before this report is sent
            self.lost = item.nodeid
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reported.add(report.nodeid)
        rank = {"passed": 0, "skipped": 1, "failed": 2, isolation.BAD_FIXTURE: 2}
        if rank.get(report.outcome, 2) >= rank.get(self.outcomes.get(report.nodeid, "passed"), 0):
            self.outcomes[report.nodeid] = report.outcome if report.outcome in rank else "failed"
        if report.skipped and isinstance(report.longrepr, tuple):  # (path, line, "Skipped: why")
            self.skip_reasons[report.nodeid] = str(report.longrepr[2]).removeprefix("Skipped: ")
        bad = [why for key, why in report.user_properties if key == isolation.BAD_FIXTURE]
        if report.failed and bad:  # bad input, not the kernel's failure (tests/test_hostile_fixtures.py)
            self.outcomes[report.nodeid] = isolation.BAD_FIXTURE
            self.skip_reasons[report.nodeid] = bad[0]

    # ---- the xdist controller ------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.planned:
            self.planned = list(ids)
            isolation.record("plan", tasks=self.planned, maxfail=self.config.option.maxfail)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        popen = getattr(getattr(getattr(report, "node", None), "gateway", None), "_io", None)
        popen = getattr(popen, "popen", None)
        status = None
        if popen is not None:
            try:
                status = popen.wait(timeout=10)
            except Exception:  # still alive or not ours: the cause stays unknown
                status = None
        d = isolation.journal_dir()
        cur = None
        if d is not None and popen is not None:
            cur = isolation.in_flight(isolation.read_journal(d, popen.pid))
        if cur is not None and cur["task"] == crashitem:
            killed = any(e["ev"] == "killed" and e["pid"] == popen.pid for e in isolation.read_journal(d, 0))
            message = supervisor.explain(cur, status, time.time(), killed)
        else:
            message = f"{crashitem}: the worker {supervisor._reason(status, 0.0, None, False)} (no journal of it)"
        report.longrepr = message
        isolation.record("crash", task=crashitem, message=message)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.controller:
            return
        self.missing = [t for t in self.planned if t not in self.reported]
        if self.missing and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lost:
            terminalreporter.write_sep("=", f"flashcheck: CUDA context lost after the fault in {self.lost}: "
                                            f"{self.not_run} later tests not run (skipped)", red=True)
        if self.missing:
            terminalreporter.write_sep("=", f"flashcheck: {len(self.missing)} of {len(self.planned)} tests never ran",
                                       red=True)
            for t in self.missing[:20]:
                terminalreporter.write_line(f"not run: {t}")


def register(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("flashcheck-isolation"):
        config.pluginmanager.register(PytestJournal(config), "flashcheck-isolation")
