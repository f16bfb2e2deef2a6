"""A Python process that has imported torch once and forks a fresh child for each short pytest run.

The tooling runs the suite in many short subprocesses (`killrun.run_pytest`: the zoo's kill runs,
mutation runs), and on a CPU `import torch` alone is about 3.4 of the 5.5-6 CPU-seconds such a run
takes. Here one server process imports the heavy libraries (never flashcheck, pytest plugins or
test modules: those, and everything they read from the environment, load fresh in each child),
then forks per run: the child takes the run's working directory and environment, sends its output
to a file, starts its own session (so a timeout kills it and everything it started) and calls
`pytest.main(args)`, the same entry point `python -m pytest` ends in.

Only where forking is safe: POSIX, a server with one thread, and no GPU (the server never touches
CUDA, but a GPU run's children gain little from it and lose nothing without it). Anything unusual
(the server fails to start, dies, answers garbage) makes `run` return None, and the caller runs a
plain subprocess instead; nothing a run reports depends on which way it ran.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PRELOAD = ("torch", "numpy", "mpmath", "hypothesis", "pytest")


def serve() -> None:  # the server's main loop: one JSON request per line on stdin
    for name in PRELOAD:
        __import__(name)
    send = sys.stdout
    if threading.active_count() != 1:  # a fork would copy locks held by other threads
        send.write(json.dumps({"error": "threads after import"}) + "\n")
        send.flush()
        return
    send.write(json.dumps({"ready": True}) + "\n")
    send.flush()
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        send.write(json.dumps({"pid": pid}) + "\n")
        send.flush()
        _, status = os.waitpid(pid, 0)
        send.write(json.dumps({"status": status}) + "\n")
        send.flush()


def _child(req: dict) -> None:
    rc = 70
    try:
        os.setsid()
        fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["pytest", *req["args"]]
        import pytest

        rc = int(pytest.main(req["args"]))
    except BaseException:  # noqa: BLE001  (the child must never return into the server's loop)
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


class Zygote:
    """The client: start the server once (with `env`), then `run` pytest in forked children."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self._buf = b""
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-c", "from flashcheck.isolation.zygote import serve; serve()"], cwd=cwd, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        if self._read(120) != {"ready": True}:
            self.close()

    def _read(self, timeout: float | None) -> dict | None:
        """The server's next line (unbuffered: two lines sent together must not hide the second from
        select), or None at a timeout, an end of file or garbage."""
        p = self.proc
        if p is None or p.stdout is None:
            return None
        fd = p.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    def run(self, args: list[str], *, env: dict[str, str], cwd: Path, out: Path,
            timeout: float) -> tuple[int | None, bool] | None:
        """(returncode, timed_out) of `pytest ARGS` in a forked child writing its output to `out`, or
        None when the server cannot take the run (the caller starts a subprocess instead)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            self.proc.stdin.write((json.dumps({"args": args, "env": env, "cwd": str(cwd), "out": str(out)}) + "\n").encode())
        except OSError:
            self.close()
            return None
        started = self._read(60)
        if not started or "pid" not in started:
            self.close()
            return None
        done = self._read(timeout)
        timed_out = done is None
        if timed_out:
            try:
                os.killpg(started["pid"], signal.SIGKILL)  # the child leads its own session
            except ProcessLookupError:
                pass
            done = self._read(60)
        if not done or "status" not in done:
            self.close()
            return None
        status = done["status"]
        rc = os.waitstatus_to_exitcode(status)
        return (None if timed_out else rc), timed_out

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


_SERVERS: dict[tuple, Zygote] = {}
# Variables the preloaded libraries (or CPython) read when imported: a run that sets one of these
# beyond the server's own environment gets a fresh process.
IMPORT_TIME = ("PYTHON", "TORCH", "OMP_", "MKL_", "OPENBLAS_", "MPMATH", "HYPOTHESIS", "PYTEST", "LD_", "CUDA", "NUMPY")


def takes(extra: dict[str, str]) -> bool:
    """Whether a run whose environment adds `extra` to the server's can be forked from it."""
    return not any(k.startswith(IMPORT_TIME) for k in extra)


def usable() -> bool:
    """Fork servers only where forking a process that imported torch is safe and pays: POSIX, no GPU."""
    if not hasattr(os, "fork") or os.environ.get("FLASHCHECK_NO_ZYGOTE"):
        return False
    from flashcheck.kernels import INTERPRET

    return bool(INTERPRET)


def server(env: dict[str, str], cwd: Path) -> Zygote | None:
    """This process's server for `env` (started on first use, kept until exit), or None."""
    if not usable():
        return None
    key = (tuple(sorted(env.items())), str(cwd))
    z = _SERVERS.get(key)
    if z is None or z.proc is None:
        z = _SERVERS[key] = Zygote(env, cwd)
        if z.proc is None:
            return None
    return z


def _close_all() -> None:
    for z in _SERVERS.values():
        z.close()


atexit.register(_close_all)
