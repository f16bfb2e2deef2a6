"""Isolation: a kernel that exits, crashes, hangs or kills the CUDA context is ONE named failure, and
the run goes on to a true summary. One design for `flashcheck check`, `replay` and `report`.

Every run is a supervised child process (`supervise`); the parent never runs a kernel, so it never
touches CUDA (no fork after CUDA init: children are spawned, each with a fresh context). The child
appends to a journal (one JSON-lines file per process in `$FLASHCHECK_JOURNAL`, written with
O_APPEND so a record survives `os._exit` or SIGKILL the instant it is written):

    plan (the tasks: pytest node ids, fixture paths, report inputs), start TASK (with its timeout),
    input (the case a property is about to check, kept for a fixture), call / ret (each kernel
    call), fault (a GpuFault's message), end TASK OUTCOME, crash (a crash explained by a parent),
    finished (the child reached its own end: an exit status 0 without it is a hard exit, not a pass).

A child that ends with a task started but not ended crashed in it: the parent names kernel, task,
input and cause ("the kernel exited with code 0", "killed by SIGSEGV", "did not return in 5 s"),
writes the in-flight case as a fixture, and starts a new child that skips every task already done
(`$FLASHCHECK_EXCLUDE`; a report re-runs everything and counts the crashed inputs as errors). A
watchdog kills a task past its deadline (pytest-timeout, method thread, fires first in pytest
children and dumps every stack; the watchdog is the backstop when it cannot). A GpuFault ends the
child on purpose, after its fixture is saved: its context is dead, a fresh child carries on.

Under xdist (`-n`) the workers are the journalling children and xdist restarts them; the
controller (`PytestJournal`) turns its "worker crashed" into the same named failure, and counts
tests never run (workers out of restarts) against what was collected. A plain `pytest` with no
parent and no `-n` cannot survive a hard exit; after a GpuFault it skips the rest of the session.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from flashcheck import exitcodes

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
    from flashcheck.faults import GpuFault

    verdict = SimpleNamespace(outcome="passed")
    start(name, timeout)
    try:
        yield verdict
    except GpuFault:
        if not enabled():
            end(name, "failed")
        raise  # left open: `fault_exit` journals the fault in it and ends the process
    except BaseException:
        end(name, "failed")
        raise
    end(name, verdict.outcome)


def note_call(kernel: str, args: tuple, kwargs: dict) -> None:
    if _J["task"] is not None and enabled():
        from flashcheck.faults import describe_args

        record("call", task=_J["task"], kernel=kernel, args=describe_args(args, kwargs))


def note_return() -> None:
    if _J["task"] is not None and enabled():
        record("ret", task=_J["task"])


def note_input(spec: Any, prop: str, case: Any) -> None:
    """Keep the case a property is about to check: a crash in it becomes a fixture of it."""
    if _J["task"] is None or not enabled():
        return
    import torch

    from flashcheck import fixtures

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
HUNG = "did not return in"


def hung(message: str) -> bool:
    """Whether a crash's message (`explain`) is a hang past its timeout."""
    return f" {HUNG} " in message


def _reason(status: int | None, elapsed: float, timeout: float | None, killed: bool) -> str:
    if killed or (timeout and elapsed >= timeout and status in (1, -signal.SIGKILL)):
        return f"{HUNG} {timeout:g} s"
    if status is None:
        return "ended without a result (exit status unknown)"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with code {status}"


def explain(cur: dict[str, Any], status: int | None, end_time: float, killed: bool = False) -> str:
    """One message for a task its process died in: kernel, input, cause, fixture."""
    if "fault" in cur:
        return cur["fault"]["message"]
    inp, call = cur.get("input"), cur.get("call")
    reason = _reason(status, end_time - cur["t0"], cur.get("timeout"), killed)
    if call and "ret" not in cur:
        who = f"the kernel {call['kernel']} {reason} on ({call['args']})"
    elif call:
        who = f"the process {reason} after {call['kernel']} returned (last call on ({call['args']}))"
    else:
        who = f"the process {reason} before any kernel call"
    msg = f"{cur['task']}: {who}"
    if inp:
        msg += f"\n  {inp['property']} on {inp['case']}"
        fixture = f"replaying the fixture {cur['fixture']['path']}" if "fixture" in cur else _fixture(inp, msg)
        if fixture:
            msg += "\n" + fixture
    return msg


def _fixture(inp: dict[str, Any], message: str) -> str:
    """Write the in-flight case as a fixture; the lines a failure ends with (or why not)."""
    if not inp.get("save"):
        return ""
    try:
        import torch

        from flashcheck import fixtures, repro
        from flashcheck.kernels.registry import KernelSpec
        from flashcheck.strategies.case import Case

        data = torch.load(inp["file"], weights_only=False)
        case = Case(tensors=data["tensors"], kwargs=data["kwargs"], label=data["label"])
        extra = {k: inp[k] for k in ("target", "identity") if inp.get(k)}
        spec = KernelSpec(name=inp["kernel"], family=inp["family"], fn=_never, external=bool(inp.get("target")),
                          extra=extra)
        fixtures.configure(directory=Path(inp["fixture_dir"]))
        path = fixtures.save_fixture(spec, inp["property"], case, KernelCrashed(message))
        return repro.replay_note(path, spec)
    except Exception as e:  # the crash is reported either way
        return f"(no fixture: {type(e).__name__}: {e})"


def _never(*a: Any, **k: Any) -> None:
    raise RuntimeError("a stand-in for a crashed kernel, only named in its fixture")


# ---- parent side ------------------------------------------------------------------------------

class Supervisor:
    """Runs a child command until every task is done or crashed; see the module docstring."""

    def __init__(self, cmd: list[str], *, unit: str = "tests", rerun_all: bool = False,
                 grace: float = GRACE, max_restarts: int = MAX_RESTARTS,
                 words: tuple[str, str] = ("passed", "failed"),
                 translate: Callable[[int], int] | None = None, caller_interrupts: bool = False) -> None:
        self.cmd, self.unit, self.rerun_all, self.words = cmd, unit, rerun_all, words
        # Ctrl-C (or the caller's SIGTERM turned into it) goes to a caller that summarises the partial
        # run from the journal (`flashcheck check`: flashcheck.progress.stop); else it ends here.
        self.caller_interrupts = caller_interrupts
        # A child's exit status in flashcheck's contract (`exitcodes`): pytest's own for `check`.
        self.translate = translate or _contract
        self.result: dict[str, Any] = {}  # the tally of the finished run
        self.grace, self.max_restarts = grace, max_restarts
        self.dir = Path(tempfile.mkdtemp(prefix="flashcheck-journal-"))
        self.crashes: dict[str, str] = {}
        self.killed: set[tuple[int, str]] = set()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[ENV] = str(self.dir)
        env[EXCLUDE_ENV] = str(self.dir / "exclude.json")
        return env

    def _exclusions(self, events: list[dict[str, Any]]) -> dict[str, str]:
        done = {} if self.rerun_all else {e["task"]: "" for e in events if e["ev"] == "end"}
        return {**done, **self.crashes}

    def _watch(self, proc: subprocess.Popen, stop: threading.Event) -> None:
        """Kill any journalling process (the child, or an xdist worker) past its task's deadline."""
        while not stop.wait(0.5):
            by_pid: dict[int, list] = {}
            for e in read_journal(self.dir):
                by_pid.setdefault(e["pid"], []).append(e)
            for pid, evs in by_pid.items():
                cur = in_flight(evs)
                if not cur or not cur.get("timeout"):
                    continue
                limit = cur["timeout"] + self.grace
                if time.time() - cur["t0"] > limit and (pid, cur["task"]) not in self.killed:
                    self.killed.add((pid, cur["task"]))
                    _append(self.dir, {"ev": "killed", "pid": pid, "task": cur["task"], "t": time.time()})
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def run(self) -> int:
        rcs: list[int] = []
        restarts = 0
        while True:
            events = read_journal(self.dir)
            (self.dir / "exclude.json").write_text(json.dumps(self._exclusions(events)))
            self.proc = proc = subprocess.Popen(self.cmd, env=self._env())  # (a stop signal ends it)
            stop = threading.Event()
            watcher = threading.Thread(target=self._watch, args=(proc, stop), daemon=True)
            watcher.start()
            try:
                status = proc.wait()
            except KeyboardInterrupt:
                stop.set()
                if self.caller_interrupts:
                    raise
                return self._interrupted(proc)
            except BaseException:  # the child must not go on printing after this returns
                _stop_child(proc)
                stop.set()
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
            stop.set()
            watcher.join()
            t_end = time.time()
            mine = [e for e in read_journal(self.dir, proc.pid)]
            cur = in_flight(mine)
            if cur is None:
                rc = self.translate(status)
                if rc in (exitcodes.OK, exitcodes.NOTHING_CHECKED) and not any(e["ev"] == "finished" for e in mine):
                    # A hard exit outside any kernel call (at the kernel's import, say) looks like a
                    # pass by its status alone: never green.
                    print(f"flashcheck: the run's process ended with status {status} before finishing, outside any "
                          "kernel call (a hard exit while loading the kernel?): not a pass", file=sys.stderr, flush=True)
                    rc = exitcodes.FAILED
                rcs.append(rc)
                break
            killed = (proc.pid, cur["task"]) in self.killed
            msg = explain(cur, status, t_end, killed)
            self.crashes[cur["task"]] = msg
            _append(self.dir, {"ev": "crash", "task": cur["task"], "message": msg, "t": t_end, "pid": 0})
            print(f"\nflashcheck: CRASHED {msg}\n", file=sys.stderr, flush=True)
            rcs.append(exitcodes.FAILED)
            restarts += 1
            if _reached_maxfail(self.dir):
                print("flashcheck: stopping after the crash (-x/--maxfail reached); the rest is not run",
                      file=sys.stderr, flush=True)
                break
            if restarts > self.max_restarts:
                print(f"flashcheck: {restarts} crashes: giving up; the rest is not run", file=sys.stderr)
                break
        return self.summary(rcs)

    def _interrupted(self, proc: subprocess.Popen) -> int:
        """Ctrl-C: the child (its process group got it too) ends and says so, or is told to, then
        ended (`_stop_child`); one line either way, and no journal left behind."""
        try:
            status = proc.wait(timeout=STOP_GRACE)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # it never saw the signal (sent to this process alone)
            status = _stop_child(proc)
        shutil.rmtree(self.dir, ignore_errors=True)
        if status != exitcodes.INTERRUPTED:  # (a flashcheck child said it already)
            print("\nflashcheck: interrupted", file=sys.stderr, flush=True)
        return exitcodes.INTERRUPTED

    def summary(self, rcs: list[int]) -> int:
        self.result = s = tally(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        if s["crashed"] or s["not_run"] or len(rcs) > 1:
            print(format_tally(s, self.unit, self.words), file=sys.stderr, flush=True)
        rc = exitcodes.worst(*rcs) if rcs else exitcodes.INTERNAL
        if s["crashed"] or s["not_run"]:  # a kernel crashed, or tests never ran: never green
            rc = exitcodes.worst(rc, exitcodes.FAILED)
        return rc


#: Seconds a child gets to end on its own after Ctrl-C (pytest's summary, xdist's workers) before it is killed.
STOP_GRACE = 3.0


def _stop_child(proc: subprocess.Popen) -> int:
    """End the child and wait for it: interrupted as Ctrl-C would (a terminal sends it to the child
    too; a `kill -INT` of this process alone does not), then killed."""
    try:
        proc.send_signal(signal.SIGINT)
        return proc.wait(STOP_GRACE)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # (a second Ctrl-C: no more grace)
        pass
    proc.kill()
    return proc.wait()


def _reached_maxfail(directory: Path) -> bool:
    """Whether the run's failures (crashes included) reached the -x/--maxfail its child was given:
    a fresh child after a crash would run every test left."""
    maxfail = max((e.get("maxfail") or 0 for e in read_journal(directory) if e["ev"] == "plan"), default=0)
    if not maxfail:
        return False
    s = tally(directory)
    return s["failed"] + len(s["crashed"]) >= maxfail


def _contract(status: int) -> int:
    """A flashcheck child's status (it follows the contract already) as the run's; a child ended by
    a signal or an unknown code outside every task (journalled crashes are explained) is the tool's."""
    if status == FAULT_EXIT:  # a GpuFault ended the child: a kernel's failure
        return exitcodes.FAILED
    known = (exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE, exitcodes.INTERNAL, exitcodes.NOTHING_CHECKED,
             exitcodes.INTERRUPTED)
    if status in known:
        return status
    print(f"flashcheck: the supervised run ended with status {status} outside any kernel call",
          file=sys.stderr, flush=True)
    return exitcodes.INTERNAL


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


def supervise(cmd: list[str], **kw: Any) -> int:
    """Run `cmd` as a supervised child (see the module docstring); its exit status, or 1 when a
    task crashed or never ran."""
    return Supervisor(cmd, **kw).run()
