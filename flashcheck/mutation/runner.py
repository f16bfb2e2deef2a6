"""Running mutants: the family's suite against one mutant in a subprocess (flashcheck.plugin.killrun's
`run_pytest`, shared with the kill matrix), its outcome, and the JSON store runs add up in."""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from flashcheck import HOME, SUITE, atomic
from flashcheck.mutation import baselines, sanitizer
from flashcheck.mutation.baselines import _save_baseline, _saved_baseline, baselines_file
from flashcheck.mutation.generate import ALL_TARGETS, Mutant, Target
from flashcheck.mutation.probe import MUTANT_ENV, NO_PROBE_ENV

# ---- running ---------------------------------------------------------------------------------------------

FIRST_SPEC_ONLY = False  # --first-spec-only
ONLY_SPECS: tuple[str, ...] = ()  # --spec
#: --only-tests: a pytest -k expression narrowing the suite (to confirm a kill by one test without
#: running the ones before it). A mutant that passes such a narrowed suite is not a survivor.
ONLY_TESTS = ""
#: --first-test-from: mutant key -> the test that killed the same mutant (same key: same mutated
#: module) in another store, e.g. the interpreter's; run alone first. Compiled, a whole suite costs
#: one binary per launch variant and mutant; the test that killed it elsewhere needs a few.
FIRST_TESTS: dict[str, str] = {}
#: --first-test-only: a mutant that passes its first test is recorded as undecided ("error"),
#: without running the whole suite.
FIRST_TEST_ONLY = False


def first_tests_from(store: dict[str, dict[str, Any]]) -> dict[str, str]:
    """key -> killing test node id (as this installation names it), for every mutant `store`
    records as killed."""
    from flashcheck.plugin.quick_first import selectable_nodeid

    return {k: _local_nodeid(selectable_nodeid(r["caught_by_test"])) for k, r in store.items()
            if r.get("status") == "killed" and r.get("caught_by_test")}


def _local_nodeid(nodeid: str) -> str:
    """A suite test's node id recorded in another layout (a checkout's `flashcheck/suite/...`,
    an installed package's `suite/...`) rebased onto this one's suite folder."""
    file, sep, rest = nodeid.partition("::")
    if (HOME / file).is_file() or "suite/" not in file:
        return nodeid
    local = SUITE / file.split("suite/", 1)[1]
    return f"{local.relative_to(HOME).as_posix()}{sep}{rest}" if local.is_file() else nodeid


def _specs_run(m: Mutant) -> tuple[str, ...]:
    if ONLY_SPECS:
        return tuple(s for s in m.specs if s in ONLY_SPECS) or m.specs
    return m.specs[:1] if FIRST_SPEC_ONLY else m.specs


def _target(m: Mutant) -> Target:
    return next(t for t in ALL_TARGETS if t.module == m.module and t.family == m.family)


def unit_tests(m: Mutant) -> tuple[str, ...]:
    """The self-test files of the mutated helpers (`Target.unit_tests`) present here (self-tests
    do not ship in the wheel)."""
    return tuple(u for u in _target(m).unit_tests if (HOME / u).is_file())


def _is_unit_test(nodeid: str) -> bool:
    return any(nodeid.split("::")[0] in t.unit_tests for t in ALL_TARGETS)


def unit_args(m: Mutant) -> list[str]:
    """The helpers' self-tests, whole: they take no kernel, so no --family (which runs only tests
    that check a kernel) and no -k."""
    return [*unit_tests(m), "-x", "--no-save-fixtures", "-p", "flashcheck.mutation.probe"]


def suite_args(m: Mutant, nodeid: str | None = None) -> list[str]:
    """The pytest arguments of a mutant's run: its family's suite, or the one test `nodeid`."""
    select = " or ".join(_specs_run(m))
    if ONLY_TESTS:
        select = f"({select}) and ({ONLY_TESTS})"
    where = [nodeid] if nodeid else [*_target(m).tests, "-k", select]
    return [*where, f"--family={m.family}", "-x", "--no-save-fixtures", "-p", "flashcheck.mutation.probe"]


#: Verdicts a confirmation run set after `classify` (an unconfirmed kill, a confirmed hang): stored as is.
CONFIRMED = ("error", "hung")


def classify(rc: int, timed_out: bool, failed: bool, probe_result: dict[str, Any] | None) -> str:
    if timed_out:
        return "timed_out"
    if failed and rc != 0:  # a test failed (the process may have died afterwards, e.g. a heap
        return "killed"     # corrupted by an out-of-bounds store: the failure was already recorded)
    if rc == 0:
        return "equivalent_candidate" if probe_result and probe_result.get("identical") else "survived"
    if rc < 0:  # the test process died of a signal (an out-of-bounds access) before any failure
        return "crashed"
    return "error"  # pytest's own codes (collection, usage, internal): the engine failed, not the mutant


def _probe_first(spec_file: Path, probe_out: Path, timeout: float) -> dict[str, Any] | None:
    from flashcheck.plugin.killrun import clean_env

    env = clean_env()
    env.update({MUTANT_ENV: str(spec_file), **gpu_env()})
    try:
        subprocess.run([sys.executable, "-c", "import flashcheck.mutation.probe as P; P.probe_main()"], cwd=HOME, env=env,
                       capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(probe_out.read_text()) if probe_out.exists() else None


def _install_spec(tmp: Path, module: str, family: str, source: str, specs: tuple[str, ...]) -> tuple[Path, Path]:
    """`source` as kernels/<module>.py in `tmp` and the spec file that makes the probe plugin
    (MUTANT_ENV) import it in place of the module: (spec file, where a probe writes its result)."""
    path = tmp / f"{module}.py"
    path.write_text(source)
    spec_file, probe_out = tmp / "mutant.json", tmp / "probe.json"
    spec_file.write_text(json.dumps({"module": module, "family": family, "path": str(path), "specs": list(specs),
                                     "probe_out": str(probe_out)}))
    return spec_file, probe_out


_BASELINE: dict[tuple[str, str], Any] = {}  # (module, test node id) -> Future[(why | None, wall s)]
_BASELINE_LOCK = threading.Lock()
def baseline_run(module: str, family: str, nodeid: str, *, timeout: float) -> tuple[str | None, float]:
    """Run the test that decided a mutant against the unmodified module, installed the way mutants
    are: (None, wall seconds) when it passes, else (why, wall). A kill counts only where it passes:
    where the test fails unmutated too (an interpreter that cannot run on this machine's NumPy once
    "killed" every mutant), it is the environment, not the mutant. Once per (module, test) for the
    whole run."""
    from concurrent.futures import Future

    from flashcheck.plugin.killrun import run_pytest
    from flashcheck.mutation.generate import module_file
    from flashcheck.plugin.quick_first import selectable_nodeid

    with _BASELINE_LOCK:
        fut = _BASELINE.get((module, nodeid))
        owner = fut is None
        if owner:
            fut = _BASELINE[(module, nodeid)] = Future()
    if not owner:
        return fut.result()
    saved = _saved_baseline(module, nodeid)
    if saved is not None:
        fut.set_result(saved)
        return saved
    tmp = Path(tempfile.mkdtemp(prefix="mutant-baseline-"))
    wall, decisive = float("inf"), False
    try:
        spec_file, _ = _install_spec(tmp, module, family, module_file(module).read_text(), ())
        family_arg = [] if _is_unit_test(nodeid) else [f"--family={family}"]
        r = run_pytest([selectable_nodeid(nodeid), *family_arg, "--no-save-fixtures"],
                       env_extra={MUTANT_ENV: str(spec_file), **gpu_env()},
                       shrink=False, timeout=timeout)
        wall = r["wall_seconds"]
        failed = r["data"].get("tests_failed") or []
        why = None if r["returncode"] == 0 and not r["timed_out"] else (
            failed[0]["summary"] if failed else f"exit {r['returncode']}" + (" (timed out)" if r["timed_out"] else ""))
        # a pass or a failing test decides; a harness failure or a timeout (maybe load) runs again next time
        decisive = not r["timed_out"] and (r["returncode"] == 0 or bool(failed))
    except Exception as exc:  # noqa: BLE001  (a waiting thread must not hang on an unset future)
        why = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if decisive:
        _save_baseline(module, nodeid, why, wall)
    fut.set_result((why, wall))
    return why, wall


#: A timed-out mutant counts as caught ("hung") only where the test it was stuck in ran at least
#: this many times longer than the whole unmutated run of that test (pytest's start included), and
#: the unmutated run passed. Under that margin machine load cannot explain it: the mutant made the
#: kernel loop far past its bounds (under the interpreter) or never return, which a per-test timeout
#: (flashcheck.plugin.tiers) turns into a failed test in the user's CI.
HANG_FACTOR = 5.0


def hang_verdict(m: Mutant, hung: dict[str, Any], *, timeout: float) -> tuple[str, str]:
    """(status, message) for a mutant whose suite ran out of time inside test `hung["nodeid"]`."""
    why, wall = baseline_run(m.module, m.family, hung["nodeid"], timeout=timeout)
    if why is not None:
        return "timed_out", f"stuck in {hung['nodeid']}, which fails or times out unmutated too ({why[:200]})"
    if hung["seconds"] < HANG_FACTOR * wall:
        return "timed_out", (f"stuck in {hung['nodeid']} for {hung['seconds']:.0f}s; unmutated it passes in "
                             f"{wall:.0f}s: under {HANG_FACTOR:g}x, maybe load")
    return "hung", (f"hung: {hung['nodeid']} still running after {hung['seconds']:.0f}s; unmutated it passes in "
                    f"{wall:.0f}s (a per-test timeout fails it)")


def run_mutant(m: Mutant, *, timeout: float, probe_first: bool = False) -> dict[str, Any]:
    """Run the suite against one mutant. probe_first: run the bit-equivalence probe before the suite
    and skip the suite when the mutant is bit-identical on every probe (status
    equivalent_candidate, `suite_skipped`): on a loaded CPU a survivor costs the whole suite."""
    from flashcheck.plugin.killrun import run_pytest

    tmp = Path(tempfile.mkdtemp(prefix="mutant-"))
    spec_file, probe_out = _install_spec(tmp, m.module, m.family, m.source, m.specs)
    if sanitizer.CASES:
        try:
            s = sanitizer.verdict(m.module, {MUTANT_ENV: str(spec_file), **gpu_env()}, timeout=timeout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _record(m, s["status"], rc=s["returncode"], wall=s["wall_seconds"], only_tests=s["only_tests"],
                       caught_by_test=s["caught_by_test"], caught_by_property=s["caught_by_property"],
                       exception=s["exception"], message=s["message"], tail=s["tail"])
    early = _probe_first(spec_file, probe_out, timeout) if probe_first else None
    first_test: str | None = None
    if early and early.get("identical"):
        r = {"returncode": 0, "timed_out": False, "wall_seconds": 0.0, "tail": "suite skipped: bit-identical on the probes",
             "data": {}}
    else:
        if probe_out.exists():
            probe_out.unlink()

        def run_once(args: list[str], spent: float = 0.0, **env: str) -> dict[str, Any]:
            """One pytest run against the mutant; its wall time includes the runs before it (`spent`)."""
            out = run_pytest(args, env_extra={MUTANT_ENV: str(spec_file), **gpu_env(), **env}, shrink=False,
                             timeout=timeout)
            out["wall_seconds"] = round(out["wall_seconds"] + spent, 1)
            return out

        first_test = FIRST_TESTS.get(m.key)
        r = run_once(suite_args(m, first_test)) if first_test else None
        caught = r is not None and bool(r["data"].get("tests_failed")) and r["returncode"] != 0
        if r is None or not (caught or FIRST_TEST_ONLY):  # no first test, or it missed (or is not collected here)
            first_test = None
            r = run_once(suite_args(m), r["wall_seconds"] if r else 0.0)
            # not caught by the suite (5: --only-tests selected none of it): the helpers' self-tests
            if r["returncode"] in (0, 5) and not r["timed_out"] and unit_tests(m):
                r = run_once(unit_args(m), r["wall_seconds"], **{NO_PROBE_ENV: "1"})
    data, rc = r["data"], r["returncode"]
    first = data.get("first") or {}
    failed = data.get("tests_failed") or []
    pr = json.loads(probe_out.read_text()) if probe_out.exists() else None
    status = classify(rc, r["timed_out"], bool(failed), pr)
    narrowed = bool(ONLY_TESTS) or first_test is not None
    if narrowed and status in ("survived", "equivalent_candidate"):
        status = "error"  # only some tests ran: passing them decides nothing
    message = (first.get("message") or (failed[0]["summary"] if failed else ""))[:600]
    hung = data.get("hung_test") if status == "timed_out" else None
    if hung:
        status, message = hang_verdict(m, hung, timeout=timeout)
    if status == "killed":
        why, _ = baseline_run(m.module, m.family, failed[0]["nodeid"], timeout=timeout)
        if why is not None:
            status = "error"
            message = f"not a kill: {failed[0]['nodeid']} fails on the unmutated kernels too ({why[:300]})"
    shutil.rmtree(tmp, ignore_errors=True)
    return _record(m, status, rc=rc, wall=r["wall_seconds"], only_tests=ONLY_TESTS or first_test or None,
                   seconds_to_kill=first.get("seconds"),  # inside pytest, to the first failing check
                   caught_by_test=failed[0]["nodeid"] if failed else (hung["nodeid"] if status == "hung" else None),
                   caught_by_property=first.get("property"),
                   exception="Timeout" if status == "hung" else first.get("exception"), message=message,
                   tests_passed=data.get("tests_passed"), probe=pr,
                   suite_skipped=bool(early and early.get("identical")), tail=r["tail"])


def _record(m: Mutant, status: str, *, rc: int, wall: float, only_tests: str | None, tail: str,
            seconds_to_kill: float | None = None, caught_by_test: str | None = None,
            caught_by_property: str | None = None, exception: str | None = None, message: str = "",
            tests_passed: Any = None, probe: dict[str, Any] | None = None, suite_skipped: bool = False) -> dict[str, Any]:
    """One mutant's entry in the store."""
    return {
        "id": m.id, "key": m.key, "module": m.module, "family": m.family, "function": m.function,
        "operator": m.operator, "line": m.line, "description": m.description, "specs": list(m.specs),
        "specs_run": list(_specs_run(m)), "only_tests": only_tests,
        "status": status, "returncode": rc, "wall_seconds": wall, "seconds_to_kill": seconds_to_kill,
        "caught_by_test": caught_by_test, "caught_by_property": caught_by_property, "exception": exception,
        "message": message, "tests_passed": tests_passed, "probe": probe, "suite_skipped": suite_skipped,
        "output_tail": None if status == "killed" else tail[-1500:],
    }


_SLOT = threading.local()
_SLOTS = itertools.count()


def gpu_env() -> dict[str, str]:
    """With several GPUs, each of the pool's threads (a job slot) runs its mutants on its own GPU
    (slot mod G), put first in CUDA_VISIBLE_DEVICES as xdist workers are (flashcheck.plugin.devices):
    compiled mutants spend their time compiling on the CPU, and G GPUs take G times the jobs."""
    from flashcheck.plugin.devices import VISIBLE, gpu_count, rotated, visible_devices

    devices = visible_devices(os.environ, gpu_count) or []
    if len(devices) < 2:
        return {}
    if not hasattr(_SLOT, "index"):
        _SLOT.index = next(_SLOTS)
    return {VISIBLE: ",".join(rotated(devices, _SLOT.index))}


def load_store(path: Path) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else {}


def runs_file(store: Path) -> Path:
    return store.with_name(store.stem + "_runs.json")


def load_runs(store: Path) -> list[dict[str, Any]]:
    """The run log kept beside `store` (`log_run`); empty when there is none."""
    path = runs_file(store)
    return json.loads(path.read_text()) if path.exists() else []


def log_run(store: Path, command: str, selected: int, ran: int, wall: float) -> None:
    """What ran, for the report: every invocation's command line, counts and wall time."""
    runs = load_runs(store)
    runs.append({"command": command, "selected": selected, "ran": ran, "wall_seconds": round(wall),
                 "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes")})
    atomic.write_text(runs_file(store), json.dumps(runs, indent=1))


_STORE_LOCK = threading.Lock()
#: Outcomes that decide nothing about the suite (the harness failed, or a loaded CPU ran out the
#: clock): `--resume` runs them again.
UNDECIDED = ("error", "timed_out")


def merge_stores(store: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]],
                 copies: list[dict[str, dict[str, Any]]]) -> int:
    """Fold stores that runs elsewhere (a device call's parallel groups) grew from copies of `base`
    into `store`, in place; returns how many entries changed. Only what a run changed counts (an
    entry equal to base's is the copy's stale past, which must not undo another group's result),
    and an undecided verdict never replaces a decided one."""
    n = 0
    for copy in copies:
        for key, rec in copy.items():
            if base.get(key) == rec or store.get(key) == rec:
                continue
            if decided(store, key) and rec.get("status") in UNDECIDED:
                continue
            store[key] = rec
            n += 1
    return n


def decided(results: dict[str, dict[str, Any]], key: str) -> bool:
    return key in results and results[key].get("status") not in UNDECIDED


def run(mutants: list[Mutant], *, jobs: int, timeout: float, store: Path, resume: bool, probe_first: bool = False,
        log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    baselines.BASELINE_FILE = baselines_file(store)
    results = load_store(store)
    todo = [m for m in mutants if not (resume and decided(results, m.key))]
    log(f"{len(mutants)} mutants selected, {len(mutants) - len(todo)} already in {store}, running {len(todo)}")

    def one(m: Mutant) -> None:
        r = run_mutant(m, timeout=timeout, probe_first=probe_first)
        results[m.key] = r
        store.parent.mkdir(parents=True, exist_ok=True)
        with _STORE_LOCK:  # merge with the file: another run may have written it meanwhile
            on_disk = load_store(store)
            on_disk[m.key] = r
            atomic.write_text(store, json.dumps(on_disk, indent=1))
        by = f" by {r['caught_by_test']} [{r['caught_by_property']}]" if r["status"] == "killed" else ""
        log(f"  {r['status']:<20} {r['wall_seconds']:>6.1f}s  {m.id}  {m.description}{by}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return results
