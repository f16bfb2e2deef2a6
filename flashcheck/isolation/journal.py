"""The child's side of isolation (the package docstring has the design): the journal each child
appends to as it goes, read back by the parent (`read_journal`, `in_flight`, `tally`)."""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator


ENV = "FLASHCHECK_JOURNAL"
EXCLUDE_ENV = "FLASHCHECK_EXCLUDE"
#: A child's exit status after a GpuFault (its message is in the journal).
FAULT_EXIT = 86
#: Restarts after crashes before the rest of the run is counted as not run.
MAX_RESTARTS = 20
#: Seconds past a pytest child's own timeout (pytest-timeout fires first) before the watchdog kills.
GRACE = 10.0
#: Per fixture (replay) or per kernel call (report): past it, the child is killed and the task named.
DEFAULT_TASK_TIMEOUT = 300.0
#: A task's outcome (and a pytest report's user property) for a fixture that cannot be replayed: bad input.
BAD_FIXTURE = "bad fixture"
#: How a report's kernel calls learn their timeout (`--timeout`), in the process that runs them.
TIMEOUT_ENV = "FLASHCHECK_TASK_TIMEOUT"

_J: dict[str, Any] = {"fd": None, "task": None}
# Taken out of the environment on import: a subprocess a test starts (the suite's self-tests run
# pytest) must not journal into this run. An xdist controller puts them back for its workers.
_DIR = os.environ.pop(ENV, None)
_EXCLUDE = os.environ.pop(EXCLUDE_ENV, None)


# ---- child side -------------------------------------------------------------------------------

def enabled() -> bool:
    return bool(_DIR)


def journal_dir() -> Path | None:
    return Path(_DIR) if _DIR else None


def hand_down(directory: Path | None = None) -> None:
    """An xdist controller: journal into `directory` (a new one when not supervised) and pass it,
    with the exclusions, to the workers it is about to start."""
    global _DIR
    if directory is not None and not _DIR:
        _DIR = str(directory)
    if _DIR:
        os.environ[ENV] = _DIR
    if _EXCLUDE:
        os.environ[EXCLUDE_ENV] = _EXCLUDE


def record(ev: str, **fields: Any) -> None:
    """Append one event to this process's journal (no-op when not supervised)."""
    d = _DIR
    if not d:
        return
    if _J["fd"] is None or _J.get("pid") != os.getpid():
        _J["fd"] = os.open(Path(d) / f"j-{os.getpid()}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _J["pid"] = os.getpid()
    line = json.dumps({"ev": ev, "t": time.time(), "pid": os.getpid(), **fields}, default=str)
    os.write(_J["fd"], (line + "\n").encode())


def finished() -> None:
    """This child got to its own end (its status is its own, not a hard exit's)."""
    record("finished")


def start(task: str, timeout: float | None = None) -> None:
    _J["task"] = task
    record("start", task=task, timeout=timeout)


def end(task: str, outcome: str, reason: str | None = None) -> None:
    record("end", task=task, outcome=outcome, **({"reason": reason} if reason else {}))
    _J["task"] = None


@contextmanager
def task(name: str, timeout: float | None = None) -> Iterator[SimpleNamespace]:
    """A non-pytest task (a fixture replayed, a report input): started, then ended unless the
    process dies in it. A body that catches its own failure sets `.outcome = "failed"` on what it
    is given: the run's tally must not count it as passed."""
    verdict = SimpleNamespace(outcome="passed")
    start(name, timeout)
    try:
        yield verdict
    except BaseException as e:
        # A GpuFault (isolation.faults: `ends_the_process`) is left open under a parent: `fault_exit`
        # journals the fault in it and ends the process.
        if not getattr(e, "ends_the_process", False) or not enabled():
            end(name, "failed")
        raise
    end(name, verdict.outcome)


def note_call(kernel: str, describe: Callable[[], str]) -> None:
    """A kernel call begins (`describe()`: its arguments, formatted only when journalled)."""
    if _J["task"] is not None and enabled():
        record("call", task=_J["task"], kernel=kernel, args=describe())


def note_return() -> None:
    if _J["task"] is not None and enabled():
        record("ret", task=_J["task"])


def note_input(spec: Any, prop: str, case: Any) -> None:
    """Keep the case a property is about to check: a crash in it becomes a fixture of it."""
    if _J["task"] is None or not enabled():
        return
    import torch

    from flashcheck.fixtures import store as fixtures

    d = Path(_DIR)
    path = d / f"case-{os.getpid()}.pt"
    tmp = d / f".case-{os.getpid()}.tmp"
    torch.save({"tensors": {k: t.detach().cpu() for k, t in case.tensors.items()},
                "kwargs": dict(case.kwargs), "label": case.label}, tmp)
    os.replace(tmp, path)
    record("input", task=_J["task"], kernel=spec.name, family=spec.family, property=prop,
           target=fixtures.kernel_target(spec) if spec.external else None, case=repr(case), file=str(path),
           identity=fixtures.kernel_identity(spec),  # the crash's fixture replays as the kernel's others do
           save=fixtures.saving_enabled(), fixture_dir=str(fixtures.fixture_dir()))


def note_fixture(path: Path | str) -> None:
    """The task replays this fixture: a crash in it names the fixture instead of writing another."""
    if _J["task"] is not None and enabled():
        record("fixture", task=_J["task"], path=str(path))


def fault_exit(message: str) -> None:
    """After a GpuFault: journal it and end this process (its CUDA context is dead) when a parent
    will carry on; without one, return (the caller reports it in process)."""
    if not enabled():
        return
    record("fault", task=_J["task"], message=message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FAULT_EXIT)


def excluded() -> dict[str, str]:
    """Tasks an earlier child already finished ("") or crashed in (the crash's message)."""
    p = _EXCLUDE
    if not p or not Path(p).is_file():
        return {}
    if _J.get("excluded_path") != p:
        _J["excluded"] = json.loads(Path(p).read_text())
        _J["excluded_path"] = p
    return _J["excluded"]


class KernelCrashed(Exception):
    """What a report counts for an input its kernel crashed on in an earlier child."""


# ---- reading journals and explaining a crash ------------------------------------------------------

def read_journal(directory: Path, pid: int | None = None) -> list[dict[str, Any]]:
    files = [directory / f"j-{pid}.jsonl"] if pid else sorted(directory.glob("j-*.jsonl"))
    out = []
    for f in files:
        if f.is_file():
            for line in f.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by the crash
                    pass
    return sorted(out, key=lambda e: e["t"])


def in_flight(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The task a process's events leave started and not ended, with what it was doing."""
    cur: dict[str, Any] | None = None
    for e in events:
        if e["ev"] == "start":
            cur = {"task": e["task"], "t0": e["t"], "timeout": e.get("timeout"), "pid": e["pid"]}
        elif cur is None or e.get("task") != cur["task"]:
            continue
        elif e["ev"] == "end":
            cur = None
        elif e["ev"] == "timeout":
            cur["timeout"] = e["timeout"]
        elif e["ev"] in ("call", "ret", "input", "fault", "fixture"):
            cur[e["ev"]] = e
            if e["ev"] == "call":
                cur.pop("ret", None)
    return cur


#: How `explain` words a hang, and how a report tells a hang from another crash.
def _append(directory: Path, event: dict[str, Any]) -> None:
    with open(directory / "j-0.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def tally(directory: Path) -> dict[str, Any]:
    """Counts over every child of a run: planned tasks, outcomes, crashes, never run."""
    planned: list[str] = []
    outcome: dict[str, str] = {}
    crashed: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for e in read_journal(directory):
        if e["ev"] == "plan":
            planned.extend(t for t in e["tasks"] if t not in outcome and t not in planned)
        elif e["ev"] == "end":
            outcome[e["task"]] = e["outcome"]
            if e.get("reason"):
                reasons[e["task"]] = e["reason"]
        elif e["ev"] == "crash":
            crashed[e["task"]] = e["message"]
    for t in crashed:
        outcome.pop(t, None)
    planned_set = set(planned) | set(outcome) | set(crashed)
    not_run = sorted(planned_set - set(outcome) - set(crashed))
    counts = {k: sum(1 for v in outcome.values() if v == k) for k in ("passed", "failed", "skipped")}
    return {"total": len(planned_set), **counts, "crashed": crashed, "not_run": not_run,
            "bad_fixtures": [reasons.get(t, t) for t, o in outcome.items() if o == BAD_FIXTURE],
            "skip_reasons": [reasons[t] for t, o in outcome.items() if o == "skipped" and t in reasons]}


def format_tally(s: dict[str, Any], unit: str, words: tuple[str, str] = ("passed", "failed")) -> str:
    lines = [f"flashcheck: {s['total']} {unit}: {s['passed']} {words[0]}, {s['failed']} {words[1]}, "
             f"{len(s['crashed'])} crashed, {s['skipped']} skipped, {len(s['not_run'])} not run"
             + (f", {len(s['bad_fixtures'])} bad fixtures" if s.get("bad_fixtures") else "")]
    for t, m in s["crashed"].items():
        lines.append(f"  crashed: {m.splitlines()[0] if m.startswith(t) else t + ': ' + m.splitlines()[0]}")
    for t in s["not_run"][:20]:
        lines.append(f"  not run: {t}")
    if len(s["not_run"]) > 20:
        lines.append(f"  ... and {len(s['not_run']) - 20} more not run")
    return "\n".join(lines)
