"""The parent's side of isolation (the package docstring has the design): a supervised child per
run (`supervise`, `Supervisor`), a crash explained and its in-flight case written as a fixture."""
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
from pathlib import Path
from typing import Any, Callable

from flashcheck import exitcodes

from flashcheck.isolation.journal import (
    ENV, EXCLUDE_ENV, FAULT_EXIT, GRACE, KernelCrashed, MAX_RESTARTS, _append, format_tally, in_flight, read_journal, tally,
)
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

        from flashcheck.fixtures import store as fixtures

        from flashcheck.fixtures import repro
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
        # run from the journal (`flashcheck check`: flashcheck.plugin.progress.stop); else it ends here.
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


def supervise(cmd: list[str], **kw: Any) -> int:
    """Run `cmd` as a supervised child (see the module docstring); its exit status, or 1 when a
    task crashed or never ran."""
    return Supervisor(cmd, **kw).run()
