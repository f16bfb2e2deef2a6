"""Per-test results appended to a JSON-lines file as they happen (`-p flashcheck.plugin.results_log
--results-log PATH`), so a run killed at its time limit still says what passed, failed and never
ran. Written by the controlling process only (under xdist the workers' reports arrive there), one
line per test phase that decides an outcome, flushed at once."""
from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from flashcheck.plugin.phases import phases_of

_KEY = pytest.StashKey[Any]()
_COLLECTED = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("flashcheck").addoption(
        "--results-log", default=None, metavar="PATH",
        help="append one JSON line per test outcome to PATH as the run goes (for runs that may be killed)")
    parser.getgroup("flashcheck").addoption(
        "--run-ids", default=None, metavar="FILE",
        help="run only the tests whose node ids are listed in FILE, one a line (the rest of a killed run)")
    parser.getgroup("flashcheck").addoption(
        "--order-from", default=None, metavar="FILE",
        help="run the tests longest first, by the seconds FILE (JSON: node id -> seconds) gives them; "
             "an unknown test counts as the median (xdist then ends with short tests, not a long tail)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = config.getoption("--run-ids", None)
    if path:
        with open(path, encoding="utf-8") as fh:
            wanted = {line.rstrip("\n") for line in fh if line.strip()}
        keep = [i for i in items if i.nodeid in wanted]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
        items[:] = keep
    order = config.getoption("--order-from", None)
    if order:
        items[:] = longest_first(items, load_durations(order))


def load_durations(path: str) -> dict[str, float]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise pytest.UsageError(f"--order-from {path}: not a JSON object of node id -> seconds")
    return {str(k): float(v) for k, v in data.items()}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """Items sorted by known seconds, longest first (stable: the same order in every xdist worker,
    whose collections must agree); unknown ones count as the median of the known."""
    known = sorted(seconds.get(i.nodeid) for i in items if i.nodeid in seconds)
    median = known[len(known) // 2] if known else 0.0
    return sorted(items, key=lambda i: -seconds.get(i.nodeid, median))


def durations_of(*logs) -> dict[str, float]:
    """node id -> seconds of its decisive phase, from results logs (the latest log wins)."""
    out: dict[str, float] = {}
    for log in logs:
        with open(log, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                if rec.get("event") == "test":
                    out[rec["nodeid"]] = rec["duration"]
    return out


def _write(config: pytest.Config, record: dict[str, Any]) -> None:
    fh = config.stash.get(_KEY, None)
    if fh is not None:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--results-log", None)
    if not path or hasattr(config, "workerinput"):  # xdist worker: the controller writes
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    config.stash[_KEY] = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed at unconfigure)
    _write(config, {"event": "start", "time": time.time(), "args": list(config.invocation_params.args)})


def pytest_unconfigure(config: pytest.Config) -> None:
    fh = config.stash.get(_KEY, None)
    if fh is not None:
        _write(config, {"event": "end", "time": time.time()})
        fh.close()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    config = node.config
    if not config.stash.get(_KEY, None) or config.stash.get(_COLLECTED, False):
        return
    config.stash[_COLLECTED] = True
    _write(config, {"event": "collected", "count": len(ids), "ids": ids, "full": _full(config)})


def _full(config: pytest.Config) -> bool:
    """Whether a run's collection is the whole suite (no --run-ids subset): a resumed part's is not,
    so it cannot tell which tests were renamed or added since the first part."""
    return not config.getoption("--run-ids", None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or getattr(session.config.option, "numprocesses", None):
        return  # under xdist the controller hears the workers' collections instead
    _write(session.config, {"event": "collected", "count": len(session.items),
                            "ids": [i.nodeid for i in session.items], "full": _full(session.config)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    decisive = report.when == "call" or (report.when == "setup" and not report.passed) or (
        report.when == "teardown" and report.failed)
    if not decisive:
        return
    outcome = report.outcome if not (report.when != "call" and report.failed) else "error"
    msg, detail = "", ""
    if report.failed:
        # pytest's one-line crash summary ("AssertionError: ..."), not the traceback's last line
        # (often Hypothesis's reproduce_failure hint); the traceback's tail rides along
        crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
        text = (getattr(report, "longreprtext", "") or "").strip()
        msg = (getattr(crash, "message", "") or (text.splitlines() or [""])[-1]).strip()[:500]
        detail = text[-4000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        msg = str(report.longrepr[2])[:300]
    record = {"event": "test", "nodeid": report.nodeid, "outcome": outcome, "when": report.when,
              "duration": round(report.duration, 3), "worker": _worker(report), "message": msg, "time": time.time()}
    if detail:
        record["detail"] = detail
    phases = phases_of(report)
    if phases:  # `-p flashcheck.plugin.phases`: where the test's time went
        record["phases"] = phases
    _write(config, record)


def _worker(report: pytest.TestReport) -> str | None:
    gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's WorkerController
    return getattr(gateway, "id", None)


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config
