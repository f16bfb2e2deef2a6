"""The suite in a subprocess, measured: `run_pytest` runs `pytest ARGS -p flashcheck.plugin.killrun` (the ci
profile, one process, no cache) and this module is also the plugin that measures inside it (active only
when FLASHCHECK_KILL_JSON names the file to write): it wraps the kernel under test to count calls and
every registered property to note the first failing check. The kill matrix (reports/quality/kill_matrix.py)
and mutation testing (flashcheck/mutation/) both run the suite this way.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from flashcheck import HOME as ROOT

KILL_ENV = "FLASHCHECK_KILL_JSON"
NO_SHRINK_ENV = "FLASHCHECK_KILL_NO_SHRINK"

# ---- the pytest plugin (inside the subprocess) ---------------------------------------------------

_S: dict[str, Any] = {}


def _active() -> bool:
    return bool(os.environ.get(KILL_ENV))


@pytest.hookimpl(trylast=True)
def pytest_configure(config) -> None:  # noqa: ANN001
    if not _active():
        return
    _S.update(t0=time.perf_counter(), calls=0, cases=0, last_case=None, first=None, last_fail=None,
              tests_passed=0, tests_failed=[], kernel=None)

    # After the suite's conftest has put the external kernel in the registry: count its calls.
    from flashcheck.kernels.registry import REGISTRY

    if REGISTRY:
        spec = REGISTRY[0]
        inner = spec.fn

        @functools.wraps(inner)
        def counted(*a, **kw):
            _S["calls"] += 1
            return inner(*a, **kw)

        REGISTRY[0] = dataclasses.replace(spec, fn=counted)
        _S["kernel"] = spec.name



def pytest_collection_finish(session) -> None:  # noqa: ANN001
    if not _active():
        return
    from flashcheck import families

    for key, fn in list(families.PROPERTIES.items()):
        families.PROPERTIES[key] = _watch(key[1], fn)
    if os.environ.get(NO_SHRINK_ENV):
        # Only "is it caught": generation is unchanged (derandomized), shrinking is skipped.
        from hypothesis import Phase, settings

        for item in session.items:
            obj = getattr(item, "obj", None)
            s = getattr(obj, "_hypothesis_internal_use_settings", None)
            if s is not None and getattr(obj, "is_hypothesis_test", False) and Phase.shrink in s.phases:
                obj._hypothesis_internal_use_settings = settings(s, phases=[Phase.explicit, Phase.generate])


def _watch(name: str, fn):
    @functools.wraps(fn)
    def watched(spec, case):
        if case is not _S["last_case"]:
            _S["last_case"] = case
            _S["cases"] += 1
        try:
            return fn(spec, case)
        except Exception as exc:
            record = {"property": name, "case": repr(case), "message": f"{type(exc).__name__}: {exc}",
                      "exception": type(exc).__name__, "check": isinstance(exc, AssertionError)}
            if _S["first"] is None:
                _S["first"] = dict(record, seconds=round(time.perf_counter() - _S["t0"], 2),
                                   examples=_S["cases"], kernel_calls=_S["calls"],
                                   tests_passed_before=_S["tests_passed"])
            _S["last_fail"] = record  # after shrinking: the minimal case Hypothesis replays last
            raise
    return watched


def pytest_runtest_logstart(nodeid, location) -> None:  # noqa: ANN001
    if not _active():
        return
    # Overwritten at each test's start: when the run is killed at its time limit, this names the
    # test that was running (a hang), which the end-of-session JSON never gets to say.
    Path(os.environ[KILL_ENV] + ".running").write_text(json.dumps({"nodeid": nodeid, "t": time.time()}))


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001
    if not _active():
        return
    if report.when == "call" and report.passed:
        _S["tests_passed"] += 1
    elif report.failed:
        text = str(report.longrepr)
        _S["tests_failed"].append({"nodeid": report.nodeid, "when": report.when,
                                   "duration": round(report.duration, 2),
                                   "summary": text.strip().splitlines()[-1][:400] if text.strip() else ""})


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001
    if not _active():
        return
    out = {k: _S.get(k) for k in ("kernel", "calls", "cases", "first", "last_fail", "tests_passed", "tests_failed")}
    out["exitstatus"] = int(exitstatus)
    out["wall_seconds"] = round(time.perf_counter() - _S.get("t0", time.perf_counter()), 2)
    Path(os.environ[KILL_ENV]).write_text(json.dumps(out, indent=1))


# ---- the runner ------------------------------------------------------------------------------------

#: A measured run's profile: the derandomized ci one.
CI_PROFILE = {"CI": "true"}


def clean_env() -> dict[str, str]:
    """A subprocess's clean environment (`flashcheck.plugin.selftest.clean_env`, its one home) in
    the ci profile."""
    from flashcheck.plugin.selftest import clean_env

    return clean_env(CI_PROFILE)


def run_pytest(args: list[str], *, env_extra: dict[str, str] | None = None, shrink: bool = True,
               timeout: float = 900) -> dict[str, Any]:
    """`pytest ARGS -p flashcheck.plugin.killrun` in a subprocess (the ci profile, one process, no
    cache), measured by this plugin: returncode, timed_out, wall_seconds, the output's tail and the
    plugin's JSON (`data`; after a timeout, `data["hung_test"]` names the test that was running and
    for how long). shrink=False skips Hypothesis's shrink phase. Also used by
    flashcheck.mutation.runner."""
    tmp = Path(tempfile.mkdtemp(prefix="kill-run-"))
    result_json = tmp / "result.json"
    if not any(a == "--fixture-dir" or a.startswith("--fixture-dir=") for a in args):
        # Never the suite's own regressions folder: a mutant or a zoo kernel is broken on purpose.
        args = [*args, f"--fixture-dir={tmp / 'fixtures'}"]
    own = [*args, "-p", "no:cacheprovider", "-p", "flashcheck.plugin.killrun", "--no-header", "-W",
           "ignore::DeprecationWarning"]
    extra = {**CI_PROFILE, **(env_extra or {}), KILL_ENV: str(result_json), **({} if shrink else {NO_SHRINK_ENV: "1"})}
    t0 = time.perf_counter()
    timed_out = False
    # On a CPU, a forked child of a process that imported torch once (flashcheck.isolation.zygote); else, or if
    # that server cannot take the run, a plain subprocess. Either runs pytest.main(ARGS) in a new process.
    from flashcheck.isolation import zygote
    from flashcheck.plugin import selftest

    env = selftest.clean_env(extra)  # what the subprocess below gets from selftest.run_pytest

    z = zygote.server(clean_env(), ROOT) if zygote.takes(env_extra or {}) else None
    output = tmp / "output.txt"
    forked = z.run([*selftest.PYTEST_FLAGS, *own], env=env, cwd=ROOT, out=output, timeout=timeout) if z else None
    if forked is not None:
        rc, timed_out = forked
        text = output.read_text(errors="replace") if output.exists() else ""
        rc, tail = (-1, f"timed out after {timeout}s\n" + text[-2000:]) if timed_out else (rc, text[-3000:])
    else:
        try:
            proc = selftest.run_pytest(*own, cwd=ROOT, env=extra, timeout=timeout)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            timed_out = True
            rc, tail = -1, f"timed out after {timeout}s\n" + str(e.stdout or "")[-2000:]
    wall = time.perf_counter() - t0
    data = json.loads(result_json.read_text()) if result_json.exists() else {}
    running = result_json.with_name(result_json.name + ".running")
    if timed_out and running.exists():
        started = json.loads(running.read_text())
        data["hung_test"] = {"nodeid": started["nodeid"], "seconds": round(time.time() - started["t"], 1)}
    shutil.rmtree(tmp, ignore_errors=True)
    return {"returncode": rc, "timed_out": timed_out, "wall_seconds": round(wall, 1), "tail": tail, "data": data}
