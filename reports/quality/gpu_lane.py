"""The one-call GPU lane: the whole suite in the gpu profile, the memory-safety sweep under
compute-sanitizer, and the record `reports/gpu_run.md`.

    python3 -m flashcheck.reports.quality.gpu_lane --out DIR [--commit SHA] [--resume DIR0/results.jsonl ...]
                                          [--suite-budget S] [--sweep-budget S] [--no-suite] [--no-sweep]
                                          [--soak S [--soak-seed N]]
    python3 -m flashcheck.reports.quality.gpu_lane --merge SUITE_DIR SWEEP_DIR --out DIR   # one record of both

Each test's outcome is appended to DIR/results.jsonl as it happens (`flashcheck.plugin.results_log`), so
a run killed at its limit still tells what failed and what never ran, and the fixtures its failures
saved are copied to DIR/fixtures (the device's checkout does not come back); `--resume` runs only what
earlier parts left (unrun or failed) and adds them up, for a suite that does not fit one call. The sweep (`memcheck_sweep`) runs in shards
side by side, each restarted after a fault from the next case, so every faulting case is named.
`--soak S` then runs the shipped suite in the soak profile (random examples, a recorded seed) for
at most S seconds: what the derandomized CI draws never try; its findings are in the record.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from flashcheck import HOME, SUITE, atomic
from flashcheck.mutation.sanitizer import ERROR_LINE, KERNEL_LINE, SUMMARY_LINE
from flashcheck.plugin.phases import PHASES, summarize
from flashcheck.reports import RECORDS
from flashcheck.reports.quality.records import header, kernels_digest


def device_line() -> str:
    import torch
    if not torch.cuda.is_available():
        return "no GPU (Triton interpreter)"
    p = torch.cuda.get_device_properties(0)
    return (f"{torch.cuda.get_device_name(0)} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB), "
            f"{torch.cuda.device_count()} GPU(s), torch {torch.__version__}, triton {_triton_version()}")


def _triton_version() -> str:
    import triton
    return triton.__version__


# ---- the suite -------------------------------------------------------------------------------

def suite_files() -> list[str]:
    """Every test file of a root `pytest` run: the self-tests (`tests/`) and the shipped suite."""
    return sorted(str(p.relative_to(HOME)) for d in (HOME / "tests", SUITE) for p in d.glob("test_*.py"))


#: Seconds per test from the last GPU lane (committed): the next lane runs the longest first, so its
#: 16 workers end together instead of behind a few long tests started last.
DURATIONS = RECORDS / "gpu_durations.json"


def run_suite(out: Path, files: list[str], budget: float, workers: str, resume: list[Path] | None = None) -> dict:
    log = out / "results.jsonl"
    cmd = [sys.executable, "-m", "pytest", "-n", workers, "--hypothesis-profile", "gpu", "-p", "flashcheck.plugin.results_log",
           "-p", "flashcheck.plugin.phases", "--results-log", str(log), "-q", "-rfE", "--tb=line", *files]
    if DURATIONS.exists():
        cmd += ["--order-from", str(DURATIONS)]
    before = tally(*resume) if resume else None
    if before and before["collected"]:
        # Against the suite as it is now, not as the first part collected it: tests added or
        # renamed since (a test split in two) run; what earlier parts passed or skipped does not.
        now = collect(files)
        with open(log, "a", encoding="utf-8") as fh:
            # a part of chosen files is not the suite: the tally keeps the latest whole collection
            whole = sorted(files) == suite_files()
            fh.write(json.dumps({"event": "collected", "count": len(now), "ids": now, "full": whole}) + "\n")
        settled = set(before["done"]) - {n for n, _ in before["failures"]}
        ids = out / "run-ids.txt"
        ids.write_text("\n".join(n for n in now if n not in settled) + "\n")
        cmd += ["--run-ids", str(ids)]
    before_fixtures = _fixture_files()
    rc, wall = _pytest_within(cmd, out / "pytest.log", budget)
    found = _keep_new_fixtures(before_fixtures, out / "fixtures")
    # this run's seconds over the last lane's: copy DIR/durations.json to reports/records/gpu_durations.json
    from flashcheck.plugin.results_log import durations_of

    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    atomic.write_text(out / "durations.json", json.dumps({**known, **(durations_of(log) if log.exists() else {})}, indent=0, sort_keys=True) + "\n")
    rec = {"command": "pytest " + " ".join(cmd[3:]), "rc": rc, "wall_s": round(wall, 1), **tally(*(resume or []), log),
           "fixtures": found, "files": files}
    if resume:  # each part's record already adds up the parts before it
        last = _suite_of(resume[-1])
        rec["parts"] = (last.get("parts") or [last.get("command", "?")]) + [rec["command"]]
        rec["wall_s"] = round(wall + max(_suite_of(p).get("wall_s", 0.0) for p in resume), 1)
    return rec


def _fixture_files() -> dict[str, float]:
    """The suite's regression fixtures (name -> mtime): where this checkout's runs save shrunk failures."""
    from flashcheck.fixtures.store import DEFAULT_FIXTURE_DIR

    return {p.name: p.stat().st_mtime for p in DEFAULT_FIXTURE_DIR.glob("*.json")}


def _keep_new_fixtures(before: dict[str, float], dest: Path) -> list[str]:
    """Copy the fixtures the run wrote (new or rewritten) into the lane's own directory, which is what
    comes back from a device: the names, sorted. A fixture left only in the device's checkout is lost."""
    from flashcheck.fixtures.store import DEFAULT_FIXTURE_DIR

    new = sorted(n for n, t in _fixture_files().items() if before.get(n) != t)
    if new:
        dest.mkdir(parents=True, exist_ok=True)
    for name in new:  # fixtures are JSON: data, copied as text
        atomic.write_text(dest / name, (DEFAULT_FIXTURE_DIR / name).read_text(encoding="utf-8"))
    return new


def _pytest_within(cmd: list[str], output: Path, budget: float) -> tuple[int | str, float]:
    """Run a pytest command for at most `budget` seconds: its exit status (or "killed at the
    budget") and wall seconds; its output goes to `output`."""
    t0 = time.time()
    with open(output, "w") as fh:
        # Its own process group: at the budget the xdist workers and the pytest runs they started
        # go too (left running, they held GPU memory through the sanitizer sweep that follows).
        proc = subprocess.Popen(cmd, cwd=HOME, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            rc = "killed at the budget"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc, time.time() - t0


def run_soak(out: Path, budget: float, seed: int, workers: str) -> dict:
    """The shipped suite in the soak profile (random examples, `--hypothesis-seed seed`) for at
    most `budget` seconds: what CI's derandomized draws never try. Fixtures of what it finds go to
    DIR/soak_fixtures (copy real findings into the suite's regressions)."""
    log, fixtures = out / "soak.jsonl", out / "soak_fixtures"
    cmd = [sys.executable, "-m", "pytest", "-n", workers, "--hypothesis-profile", "soak", "--hypothesis-seed",
           str(seed), "-p", "flashcheck.plugin.results_log", "--results-log", str(log), f"--fixture-dir={fixtures}",
           "-q", "-rfE", "--tb=line", str(SUITE.relative_to(HOME))]
    rc, wall = _pytest_within(cmd, out / "soak.log", budget)
    t = tally(log)
    return {"command": "pytest " + " ".join(cmd[3:]), "seed": seed, "rc": rc, "wall_s": round(wall, 1),
            "budget_s": budget, **{k: t[k] for k in ("collected", "passed", "failed", "skipped", "error", "failures")},
            "not_run": len(t["not_run"]), "fixtures": sorted(p.name for p in fixtures.glob("*.json"))}


def collect(files: list[str]) -> list[str]:
    """The node ids `pytest --collect-only` finds in files (no xdist: one process collects)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:randomly",
                           "--hypothesis-profile", "gpu", *files], cwd=HOME, capture_output=True, text=True)
    ids = [ln for ln in proc.stdout.splitlines() if "::" in ln and not ln.startswith(" ")]
    if proc.returncode != 0 or not ids:
        raise SystemExit(f"gpu_lane: collecting the suite failed (exit {proc.returncode}): "
                         f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:] or ['no output']}")
    return ids


def _resumed_files(resume: list[Path] | None) -> list[str] | None:
    """The files the resumed parts ran (a lane of `--files flashcheck/suite` resumes as that, not
    as the whole suite). A record from before `files` was kept: its pytest command's file arguments."""
    if not resume:
        return None
    s = _suite_of(resume[-1])
    if s.get("files"):
        return list(s["files"])
    words = s.get("command", "").split()
    files = [w for w in words if w.startswith(("tests", "flashcheck/suite")) and "." not in w.rsplit("/", 1)[-1]
             or w.endswith(".py")]
    return files or None


def _suite_of(log: Path) -> dict:
    meta = log.parent / "gpu_run.json"
    return json.loads(meta.read_text()).get("suite") or {} if meta.exists() else {}


def tally(*logs: Path) -> dict:
    """Outcomes per test over the logs of one run's parts: within a log a failing phase sticks,
    a later log (a resumed part) decides for the tests it ran again."""
    tests: dict[str, dict] = {}
    collected: set[str] = set()
    full: set[str] | None = None  # the latest whole-suite collection: it decides what the suite is
    for log in logs:
        if not log.exists():
            continue
        this: dict[str, dict] = {}
        resumed = False
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a kill
            if rec.get("event") == "start":
                resumed = "--run-ids" in rec.get("args", [])
            elif rec.get("event") == "collected":
                collected.update(rec.get("ids", []))
                if rec.get("full", not resumed):  # logs before the marker: full unless a resumed part
                    full = set(rec.get("ids", []))
            elif rec.get("event") == "test":
                prev = this.get(rec["nodeid"])
                if prev is None or rec["outcome"] in ("failed", "error"):
                    this[rec["nodeid"]] = rec
        tests.update(this)
    if full is not None:  # tests renamed or removed since an earlier part drop out
        collected = full
        tests = {n: r for n, r in tests.items() if n in full}
    counts = {k: sum(1 for r in tests.values() if r["outcome"] == k) for k in ("passed", "failed", "skipped", "error")}
    return {"collected": len(collected), **counts, "not_run": sorted(collected - set(tests)), "done": sorted(tests),
            "phases": summarize(tests.values()),
            "failures": sorted((r["nodeid"], r["message"]) for r in tests.values() if r["outcome"] in ("failed", "error")),
            "slowest": sorted(((r["duration"], r["nodeid"]) for r in tests.values()), reverse=True)[:20]}


# ---- the sanitizer sweep ------------------------------------------------------------------------

def run_sweep(out: Path, budget: float, shards: int) -> dict:
    """memcheck_sweep under compute-sanitizer in `shards` processes (case i goes to shard i % shards)."""
    from flashcheck.reports.quality import memcheck_sweep
    total = len(memcheck_sweep.cases(big=True))
    deadline = time.time() + budget
    logs = [Path(f"/tmp/flashcheck-sanitizer-{os.getpid()}-{s}.log") for s in range(shards)]
    procs = [subprocess.Popen([sys.executable, "-m", "flashcheck.reports.quality.gpu_lane", "--sweep-shard", f"{s}/{shards}",
                               "--deadline", str(deadline)], cwd=HOME, stdout=open(logs[s], "w"),
                              stderr=subprocess.STDOUT) for s in range(shards)]
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time() + 30))
        except subprocess.TimeoutExpired:
            p.kill()
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    (out / "sanitizer.log").write_text(text)
    for p in logs:
        p.unlink()
    ok = len(set(re.findall(r"^OK (\d+)$", text, re.M)))
    fails = sorted(set(re.findall(r"^FAIL (\d+ .*)$", text, re.M)))
    errors = ERROR_LINE.findall(text)
    kernels = sorted(set(KERNEL_LINE.findall(text)))
    summaries = SUMMARY_LINE.findall(text)
    return {"cases": total, "ok": ok, "failed_cases": fails, "sanitizer_errors": sum(int(s) for s in summaries),
            "error_lines": errors[:20], "kernels": kernels[:20], "runs": len(summaries)}


def sweep_shard(shard: str, deadline: float) -> int:
    from flashcheck.reports.quality import memcheck_sweep
    s, n = (int(v) for v in shard.split("/"))
    total = len(memcheck_sweep.cases(big=True))
    todo = [i for i in range(total) if i % n == s]
    log = Path(f"/tmp/flashcheck-sweep-{os.getpid()}.out")
    while todo and time.time() < deadline:
        ids = ",".join(map(str, todo))
        # Streamed to a file, not captured: a process killed at the deadline keeps what it did.
        with open(log, "w") as fh:
            proc = subprocess.Popen(["compute-sanitizer", "--tool", "memcheck", "--print-limit", "10", sys.executable,
                                     "-m", "flashcheck.reports.quality.memcheck_sweep", "--ids", ids], cwd=HOME, stdout=fh,
                                    stderr=subprocess.STDOUT)
            try:
                proc.wait(timeout=max(10.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        text = log.read_text(errors="replace")
        sys.stdout.write(text)
        sys.stdout.flush()
        done = {int(i) for i in re.findall(r"^(?:OK|FAIL) (\d+)", text, re.M)}
        started = [int(i) for i in re.findall(r"^CASE (\d+)", text, re.M)]
        if started and started[-1] not in done and time.time() < deadline:  # ended inside a case: skip it
            print(f"FAIL {started[-1]} (the process ended inside this case)")
            done.add(started[-1])
        if not done:
            break
        todo = [i for i in todo if i not in done]
    return 0


# ---- the record ---------------------------------------------------------------------------------

#: A record is read, not searched: the longest lists are cut here and kept whole in gpu_run.json.
FAILURES, SLOWEST, PHASE_FILES, SANITIZER_LINES = 40, 10, 15, 10

#: One call runs the whole lane; a device call too short for it runs parts (`--files`, `--resume`, `--merge`).
REGENERATE = "python3 -m flashcheck.reports.quality.gpu_lane --out build/lane --commit $(git rev-parse --short HEAD)"
WHAT = ("every test of the suite (tests/ and flashcheck/suite) in the gpu profile, and the memory-safety "
        "sweep (every case of reports/quality/memcheck_sweep.py under compute-sanitizer memcheck)")


def write_record(out: Path, rec: dict) -> Path:
    """DIR/gpu_run.md (the record, reports/quality/records.py's shape: copy it to reports/gpu_run.md) and
    DIR/gpu_run.json (everything, uncut)."""
    s, w = rec.get("suite"), rec.get("sweep")
    lines = header("GPU lane", what=WHAT, device=rec["device"], date=rec["date"], commit=rec["commit"],
                   digest=f"`{rec['kernels']}`", command=REGENERATE)
    lines += [f"This run: `{rec['lane_command']}`" + (" (the last call; parts are listed below)" if s and s.get("parts") else ""), ""]
    if s:
        lines += ["## Suite (gpu profile)", "",
                  f"- collected {s['collected']}: **{s['passed']} passed, {s['failed']} failed, {s['error']} errors, "
                  f"{s['skipped']} skipped, {len(s['not_run'])} not run**",
                  f"- wall time: {s['wall_s']} s (pytest exit: {s['rc']})",
                  (f"- pytest: `{s['command']}`" if not s.get("parts") else
                   f"- in {len(s['parts'])} parts, each resuming (`--resume`) what the earlier left; a test run "
                   "again is decided by its last run:\n" + "\n".join(f"  - `{c}`" for c in s["parts"][:5])), ""]
        if s["failures"]:
            lines += [f"Failures ({len(s['failures'])}):", ""] + [f"- `{n}`: {m}" for n, m in s["failures"][:FAILURES]] + [""]
        if s.get("fixtures"):
            lines += [f"Fixtures this run saved (copied to `{out.name}/fixtures/`): "
                      + ", ".join(f"`{f}`" for f in s["fixtures"][:40]), ""]
        if s["not_run"]:
            lines += [f"Not run ({len(s['not_run'])}): " + ", ".join(f"`{n}`" for n in s["not_run"][:20]), ""]
        if s.get("phases"):
            lines += phase_table(s["phases"])
        lines += [f"Slowest {SLOWEST} tests (s):", "", "| s | test |", "|---|---|"]
        lines += [f"| {d:.1f} | `{n}` |" for d, n in s["slowest"][:SLOWEST]] + [""]
    if w:
        clean = w["sanitizer_errors"] == 0 and not w["failed_cases"] and w["ok"] == w["cases"]
        lines += ["## Memory-safety sweep (`compute-sanitizer --tool memcheck`)", "",
                  f"- {w['ok']} of {w['cases']} cases clean; sanitizer errors: {w['sanitizer_errors']} "
                  f"in {w['runs']} sanitizer runs; wall {w['wall_s']} s",
                  f"- result: **{'clean' if clean else 'NOT clean'}**", ""]
        if w["failed_cases"]:
            lines += [f"Failed cases ({len(w['failed_cases'])}):", ""] + \
                     [f"- {c}" for c in w["failed_cases"][:SANITIZER_LINES]] + [""]
        if w["error_lines"]:
            lines += ["Sanitizer reports:", ""] + [f"- `{e}`" for e in w["error_lines"][:SANITIZER_LINES]] + \
                     [f"- kernel `{k}`" for k in w["kernels"][:SANITIZER_LINES]] + [""]
    k = rec.get("soak")
    if k:
        lines += [f"## Soak (`--hypothesis-profile soak`, seed {k['seed']}, at most {k['budget_s']:.0f} s)", "",
                  f"- command: `{k['command']}`",
                  f"- {k['passed'] + k['failed'] + k['error'] + k['skipped']} of {k['collected']} tests ran in "
                  f"{k['wall_s']} s (pytest exit: {k['rc']}): **{k['passed']} passed, {k['failed']} failed, "
                  f"{k['error']} errors**, {k['skipped']} skipped, {k['not_run']} not reached",
                  f"- found: " + ("nothing" if not k["failures"] else f"{len(k['failures'])} failing tests, fixtures "
                                  + ", ".join(f"`{f}`" for f in k["fixtures"][:20])), ""]
        lines += [f"- `{n}`: {m}" for n, m in k["failures"][:FAILURES // 2]] + ([""] if k["failures"] else [])
    path = out / "gpu_run.md"
    atomic.write_text(path, "\n".join(lines))
    atomic.write_text(out / "gpu_run.json", json.dumps(rec, indent=1))
    return path


def phase_table(per_file: dict[str, dict[str, float]]) -> list[str]:
    """Worker-seconds per test file and phase (`flashcheck.plugin.phases`): the largest files, the rest as one row."""
    rows = sorted(per_file.items(), key=lambda kv: -sum(kv[1].get(p, 0.0) for p in PHASES))
    keys = (*PHASES, "compiled", "built", "tests")
    add = lambda rs: {k: sum(r.get(k, 0.0) for _, r in rs) for k in keys}  # noqa: E731
    total, rest = add(rows), rows[PHASE_FILES:]
    rows = rows[:PHASE_FILES] + ([(f"{len(rest)} other files", add(rest))] if rest else [])
    fmt = lambda r: " | ".join(f"{r.get(p, 0.0):.0f}" for p in PHASES)  # noqa: E731
    return (["Where the time went (worker-seconds of the tests' call phase, each second counted once: `compile` "
             "Triton building binaries, `kernel` launching them, `sync` waiting for the GPU, `oracle`, `compare` "
             "against it, `fixtures` (fixture I/O, input snapshots), `draw` Hypothesis outside the examples "
             "(drawing, shrinking), `rest` the remainder; `flashcheck/plugin/phases.py`):", "",
             "| file | tests | " + " | ".join(PHASES) + " | binaries | built |", "|---|---|" + "---|" * (len(PHASES) + 2)]
            + [f"| `{f}` | {r.get('tests', 0):.0f} | {fmt(r)} | {r.get('compiled', 0):.0f} | {r.get('built', 0):.0f} |"
               for f, r in rows]
            + [f"| all | {total['tests']:.0f} | {fmt(total)} | {total['compiled']:.0f} | {total['built']:.0f} |", ""])


def merge(dirs: list[Path]) -> dict:
    recs = [json.loads((d / "gpu_run.json").read_text()) for d in dirs]
    base = dict(recs[-1])
    suites = [r["suite"] for r in recs if r.get("suite")]
    if len(suites) > 1:  # parts of one suite run chain through --resume, which adds them up
        raise SystemExit("gpu_lane --merge: several suite records; run later parts with --resume instead")
    if suites:
        base["suite"] = suites[0]
    for part in ("sweep", "soak"):
        found = [r[part] for r in recs if r.get(part)]
        if found:
            base[part] = found[-1]
    base["commit"] = ", ".join(dict.fromkeys(r["commit"] for r in recs))
    base["date"] = ", ".join(dict.fromkeys(r["date"] for r in recs))
    if len({r["kernels"] for r in recs}) != 1:
        raise SystemExit("gpu_lane --merge: the parts were run at different kernels/ (digests differ)")
    return base


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m flashcheck.reports.quality.gpu_lane", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=False)
    ap.add_argument("--commit", default=os.environ.get("FLASHCHECK_COMMIT", "unknown"))
    ap.add_argument("--files", nargs="+", default=None, help="run these test files (a part chosen by hand)")
    ap.add_argument("--resume", type=Path, nargs="+", default=None,
                    help="results.jsonl of earlier parts (each with its gpu_run.json beside it): run only the "
                         "tests they left unrun or failed; the record covers all parts")
    ap.add_argument("--suite-budget", type=float, default=540.0)
    ap.add_argument("--sweep-budget", type=float, default=240.0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--no-suite", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--soak", type=float, default=0.0, metavar="S",
                    help="then the shipped suite in the soak profile for at most S seconds")
    ap.add_argument("--soak-seed", type=int, default=None, help="its --hypothesis-seed (default: from the clock)")
    ap.add_argument("--merge", type=Path, nargs="+")
    ap.add_argument("--sweep-shard", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.sweep_shard:
        return sweep_shard(a.sweep_shard, a.deadline)
    if a.out is None:
        ap.error("--out DIR is required")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.merge:
        rec = merge(a.merge)
    else:
        rec = {"device": device_line(), "commit": a.commit, "kernels": kernels_digest(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "lane_command": "python3 -m flashcheck.reports.quality.gpu_lane " + " ".join(argv or sys.argv[1:])}
        if not a.no_suite:
            rec["suite"] = run_suite(a.out, a.files or _resumed_files(a.resume) or suite_files(), a.suite_budget,
                                     a.workers, a.resume)
            print(f"suite: {rec['suite']['passed']} passed, {rec['suite']['failed']} failed, "
                  f"{rec['suite']['skipped']} skipped, {len(rec['suite']['not_run'])} not run, "
                  f"{rec['suite']['wall_s']} s", flush=True)
        if not a.no_sweep:
            t0 = time.time()
            rec["sweep"] = run_sweep(a.out, a.sweep_budget, a.shards)
            rec["sweep"]["wall_s"] = round(time.time() - t0, 1)
            print(f"sweep: {rec['sweep']['ok']}/{rec['sweep']['cases']} clean, "
                  f"{rec['sweep']['sanitizer_errors']} sanitizer errors", flush=True)
        if a.soak > 0:
            seed = a.soak_seed if a.soak_seed is not None else int(time.time()) % 2**32
            rec["soak"] = run_soak(a.out, a.soak, seed, a.workers)
            print(f"soak: seed {seed}, {rec['soak']['failed']} failed in {rec['soak']['wall_s']} s", flush=True)
    path = write_record(a.out, rec)
    print(path.read_text())
    s, w, k = rec.get("suite"), rec.get("sweep"), rec.get("soak")
    bad = ((s and (s["failed"] or s["error"] or s["not_run"])) or (w and (w["sanitizer_errors"] or w["failed_cases"]))
           or (k and (k["failed"] or k["error"])))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
