"""How much a run actually checked (issue 18: a run that checked nothing is not green).

Registered by `flashcheck.plugin` for runs of a kernel (`--kernel`/`--family`). Each test records
the examples it checked (`properties.tally.EXAMPLES`: distinct cases given to a property) and the kernel
calls it made (`faults.CALLS`: every call goes through `faults.guarded_call`) as a user property, so
the numbers reach an xdist controller with the report. The summary says how much was checked; a
run whose tests never called the kernel ends with NOTHING_CHECKED instead of 0.

A Hypothesis test whose every draw the declarations reject ends `Unsatisfiable`; for a kernel
under test that is a skip naming the declarations that narrowed it, not a failure of the kernel.
"""
from __future__ import annotations

from typing import Any

import pytest

from flashcheck.exitcodes import NOTHING_CHECKED
from flashcheck.properties.fit import nothing_to_draw

_KEY = "flashcheck_checked"


def _spec_of(item: pytest.Item) -> Any:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("spec") or getattr(params.get("fixture"), "spec", None)


class CheckedTally:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tests = self.tests_checked = self.examples = self.calls = self.skipped = 0
        self.refusals: list[dict[str, Any]] = []  # flashcheck.properties.refusals' records, every worker's
        self.notes: list[str] = []  # flashcheck.properties.tally.NOTES, every worker's, each once

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        from flashcheck.isolation import faults
        from flashcheck.properties import tally as properties
        from flashcheck.properties import refusals

        examples, calls, notes = properties.EXAMPLES[0], faults.CALLS[0], len(properties.NOTES)
        refusals.begin(item.nodeid)
        refused: dict[str, Any] = {}
        try:
            out = yield
            refused = refusals.take(item.nodeid)
            if refused and refused["checked"] <= 0:  # every example it drew was refused
                raise pytest.skip.Exception(refusals.skip_reason(refused["records"]))
            return out
        except Exception as e:
            from hypothesis.errors import Unsatisfiable

            refused = refused or refusals.take(item.nodeid)
            spec = _spec_of(item)
            if isinstance(e, Unsatisfiable) and refused:
                raise pytest.skip.Exception(refusals.skip_reason(refused["records"])) from None
            if isinstance(e, Unsatisfiable) and spec is not None:
                raise pytest.skip.Exception(nothing_to_draw(spec)) from None
            raise
        finally:
            refused = refused or refusals.take(item.nodeid)
            item.user_properties.append((_KEY, {
                "examples": properties.EXAMPLES[0] - examples - refused.get("refused", 0),
                "calls": faults.CALLS[0] - calls - refused.get("calls", 0), "refusals": refused.get("records", []),
                "notes": properties.NOTES[notes:]}))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        self.tests += 1
        self.skipped += report.skipped
        for key, value in report.user_properties:
            if key == _KEY and report.when == "call":
                self.examples += value["examples"]
                self.calls += value["calls"]
                self.tests_checked += bool(value["calls"])
                self.refusals += value.get("refusals", [])
                self.notes += [n for n in value.get("notes", []) if n not in self.notes]

    def _verdict_here(self) -> bool:
        """Only the process that reports (not an xdist worker), and only for the whole run: a child
        that the supervisor restarted after a crash saw part of it."""
        from flashcheck.isolation import journal as isolation

        return not hasattr(self.config, "workerinput") and not isolation.excluded()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._verdict_here() and self.tests and not self.calls and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = NOTHING_CHECKED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self._verdict_here() or not self.tests:
            return
        from flashcheck.properties.refusals import summary_lines

        for line in summary_lines(self.refusals) + self.notes:
            terminalreporter.write_line(line, yellow=True)
        if not self.calls:
            # (a bad fixture's test fails before any call: "every one skipped" would hide it)
            why = "every one skipped; -rs lists why" if self.skipped == self.tests else \
                f"{self.tests - self.skipped} failed before any call"
            terminalreporter.write_sep("=", f"flashcheck: NOTHING WAS CHECKED: the kernel was never called in "
                                            f"{self.tests} tests ({why})", red=True)
            return
        terminalreporter.write_line(
            f"flashcheck: checked {self.examples} examples ({self.calls} kernel calls) in {self.tests_checked} of "
            f"{self.tests} tests; {self.tests - self.tests_checked} called the kernel never")


def register(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("flashcheck-checked"):
        config.pluginmanager.register(CheckedTally(config), "flashcheck-checked")
