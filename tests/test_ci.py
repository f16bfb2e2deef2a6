"""The CI machinery itself: tiers, one GPU per xdist worker (mapping logic, with a fake GPU count),
markers, the per-test timeout, sharding across CI jobs and the workflows users copy."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

from flashcheck import HOME as ROOT

from flashcheck.plugin import devices

from flashcheck.plugin import profiles
from flashcheck.plugin.selftest import run_pytest

# ---- tiers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,examples,derandomized", [
    ("smoke", 2, True), ("ci", 12, True), ("dev", 25, False), ("gpu", 120, True), ("soak", 120, False)])
def test_profiles_are_the_documented_tiers(name: str, examples: int, derandomized: bool) -> None:
    s = settings.get_profile(name)
    assert (s.max_examples, s.derandomize, s.deadline) == (examples, derandomized, None), s
    if derandomized:
        assert s.database is None  # repeatable CI: nothing replayed from a local database


def test_default_profile() -> None:
    assert profiles.default_profile(gpu=True, environ={}) == "gpu"
    assert profiles.default_profile(gpu=True, environ={"CI": "true"}) == "gpu"
    assert profiles.default_profile(gpu=False, environ={"CI": "true"}) == "ci"
    assert profiles.default_profile(gpu=False, environ={"CI": "0"}) == "dev"
    assert profiles.default_profile(gpu=False, environ={}) == "dev"


def test_every_tier_has_a_timeout() -> None:
    assert set(profiles.TIMEOUTS) == set(profiles.PROFILES)
    assert profiles.default_timeout("my-own-profile") == profiles.TIMEOUTS["dev"]


# ---- one GPU per xdist worker --------------------------------------------------------------------


@pytest.mark.parametrize("worker", ["master", "", "gw", "gwx", "g1", None])
def test_not_a_worker(worker: str | None) -> None:
    env = {} if worker is None else {"PYTEST_XDIST_WORKER": worker}
    assert devices.assign_worker_gpu(env, count=lambda: 4) is None
    assert devices.VISIBLE not in env


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
def test_worker_n_gets_gpu_n_mod_g(gpus: int) -> None:
    for n in range(2 * gpus + 1):
        env = {"PYTEST_XDIST_WORKER": f"gw{n}"}
        got = devices.assign_worker_gpu(env, count=lambda: gpus)
        order = env[devices.VISIBLE].split(",")
        assert got == order[0] == str(n % gpus), (n, gpus, env)
        # Its GPU first (cuda:0 in the worker), every other GPU still visible once.
        assert sorted(order, key=int) == [str(i) for i in range(gpus)]
        assert env[devices.ASSIGNED] == got


def test_explicit_visible_devices_are_respected() -> None:
    # A runner that hands the job GPUs 3 and 5 (or UUIDs): workers share out exactly those.
    for n, first in [(0, "3"), (1, "5"), (2, "3"), (3, "5")]:
        env = {"PYTEST_XDIST_WORKER": f"gw{n}", devices.VISIBLE: "3, 5"}
        assert devices.assign_worker_gpu(env, count=lambda: pytest.fail("must not count GPUs")) == first
    env = {"PYTEST_XDIST_WORKER": "gw1", devices.VISIBLE: "GPU-aaaa,GPU-bbbb,GPU-cccc"}
    assert devices.assign_worker_gpu(env, count=lambda: 0) == "GPU-bbbb"
    assert env[devices.VISIBLE] == "GPU-bbbb,GPU-cccc,GPU-aaaa"


@pytest.mark.parametrize("env_visible,count", [("", 8), (None, 0), (None, None)])
def test_no_gpu_leaves_the_environment_alone(env_visible: str | None, count: int | None) -> None:
    env = {"PYTEST_XDIST_WORKER": "gw3"}
    if env_visible is not None:
        env[devices.VISIBLE] = env_visible
    before = dict(env)
    assert devices.assign_worker_gpu(env, count=lambda: count) is None
    assert env == before


def test_gpu_count_does_not_start_cuda() -> None:
    # Counting must not initialise CUDA, or the variable set afterwards would be ignored. In a
    # fresh process: this one may have started CUDA already (any earlier GPU test in the worker).
    code = ("import torch; from flashcheck.plugin import devices; n = devices.gpu_count(); "
            "print('count', n, 'initialized', torch.cuda.is_initialized())")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "initialized False" in run.stdout, run.stdout


# ---- markers -------------------------------------------------------------------------------------


def _collected(run) -> list[str]:
    return [line for line in run.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_family_and_slow_markers_select() -> None:
    files = ["flashcheck/suite/test_softmax.py", "flashcheck/suite/test_attention.py", "tests/test_fixtures.py",
             "flashcheck/suite/test_softmax_gpu.py"]
    run = run_pytest("--collect-only", "-m", "softmax and not slow", *files, timeout=300)
    ids = _collected(run)
    assert run.returncode == 0 and ids, run.stdout[-2000:] + run.stderr[-2000:]
    assert all(i.startswith(("flashcheck/suite/test_softmax.py::", "flashcheck/suite/test_softmax_gpu.py::"))
               for i in ids), ids
    assert "PytestUnknownMarkWarning" not in run.stdout + run.stderr
    run = run_pytest("--collect-only", "-m", "gpu_only", *files, timeout=300)
    gpu = _collected(run)
    assert gpu and all(i.startswith("flashcheck/suite/test_softmax_gpu.py::") for i in gpu), gpu
    run = run_pytest("--collect-only", "-m", "slow", *files, timeout=300)
    assert any(i.startswith("tests/test_fixtures.py::") for i in _collected(run)), run.stdout[-2000:]


# ---- per-test timeout ----------------------------------------------------------------------------

HANG = '''
import time


def hang(x):
    """A kernel that never returns (a deadlocked launch, a spin on a flag nobody sets)."""
    while True:
        time.sleep(60)
'''


@pytest.mark.slow
def test_hanging_kernel_fails_with_a_timeout(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANG)
    t0 = time.monotonic()
    run = run_pytest("flashcheck/suite/test_softmax.py", "-k", "test_adversarial_class and benign and fp32",
                     "--kernel", f"{tmp_path}/hang.py:hang", "--family", "softmax", "--no-save-fixtures",
                     "--hypothesis-profile", "ci", "--timeout", "5", timeout=300)
    wall = time.monotonic() - t0
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "+ Timeout +" in out and "hang.py" in out, out[-3000:]  # the stack dump names the culprit
    assert wall < 120, f"the timeout took {wall:.0f} s to end a 5 s test"


@pytest.mark.slow
def test_default_timeout_follows_the_tier() -> None:
    run = run_pytest("--collect-only", "--hypothesis-profile", "smoke", "flashcheck/suite/test_regressions.py", "-v",
                     timeout=300)
    assert f"timeout: {profiles.TIMEOUTS['smoke']}s" in run.stdout, run.stdout[-2000:]
    assert "timeout method: thread" in run.stdout, run.stdout[-2000:]
    run = run_pytest("--collect-only", "--hypothesis-profile", "smoke", "--timeout", "7",
                     "flashcheck/suite/test_regressions.py", "-v", timeout=300)
    assert "timeout: 7.0s" in run.stdout, run.stdout[-2000:]


# ---- sharding across CI jobs ---------------------------------------------------------------------

DURATIONS = ROOT / ".test_durations"


@pytest.mark.slow
@pytest.mark.skipif(not DURATIONS.is_file(), reason="no recorded .test_durations (an installed suite)")
def test_shards_partition_the_suite() -> None:
    subset = ["tests/test_oracles.py", "flashcheck/suite/test_attention.py"]
    everything = set(_collected(run_pytest("--collect-only", *subset, timeout=300)))
    groups = []
    for g in (1, 2):
        run = run_pytest("--collect-only", "--splits", "2", "--group", str(g), "--splitting-algorithm",
                         "least_duration", "--durations-path", str(DURATIONS), *subset, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        groups.append(set(_collected(run)))
    assert everything and all(groups), groups
    assert not groups[0] & groups[1], sorted(groups[0] & groups[1])[:5]
    assert groups[0] | groups[1] == everything
    # Balanced by the recorded durations, not by count.
    recorded = json.loads(DURATIONS.read_text())
    times = [sum(recorded.get(i, 0.0) for i in g) for g in groups]
    assert min(times) > 0.5 * max(times), times


def test_recorded_durations_name_real_tests() -> None:
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    assert recorded, "record with: CI=true pytest -p no:xdist --store-durations (see README)"
    files = {k.split("::")[0] for k in recorded}
    assert all((ROOT / f).is_file() for f in files), sorted(f for f in files if not (ROOT / f).is_file())


# ---- workflows -----------------------------------------------------------------------------------

WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((WORKFLOWS / name).read_text())


def _run_lines(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_cpu_workflow_runs_the_ci_script() -> None:
    wf = _workflow("cpu.yml")
    assert "bash .ci/run" in "\n".join(_run_lines(j) for j in wf["jobs"].values())


def test_gpu_workflow_shards_over_its_matrix() -> None:
    wf = _workflow("gpu.yml")
    job = wf["jobs"]["gpu"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    groups = job["strategy"]["matrix"]["group"]
    run = _run_lines(job)
    splits = int(re.search(r"--splits[ =](\d+)", run).group(1))
    assert sorted(groups) == list(range(1, splits + 1)), (groups, splits)
    for needed in ("-n auto", "--junitxml", "--group ${{ matrix.group }}", "--hypothesis-profile gpu"):
        assert needed in run, needed
    uploaded = "\n".join(str(s.get("with", {}).get("path", "")) for s in job["steps"]
                         if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    from flashcheck.reports.stability.cli import DEFAULT_OUT

    for artefact in ("junit", "flashcheck/suite/regressions", DEFAULT_OUT):
        assert artefact in uploaded, artefact


def test_exclusive_memory_admits_one_process_at_a_time(tmp_path) -> None:
    """The large-allocation gate is machine-wide: a second process waits until the first leaves."""
    import subprocess
    import sys
    import time

    from flashcheck.plugin.devices import exclusive_memory

    code = ("import time; from flashcheck.plugin.devices import exclusive_memory\n"
            "with exclusive_memory('child'):\n    print(time.time(), flush=True)\n")
    with exclusive_memory("parent"):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)
        assert child.poll() is None, "the child entered while the parent held the gate"
        left = time.time()
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and float(out.split()[0]) >= left


def test_lane_resume_counts_the_suite_as_it_is_now(tmp_path: Path) -> None:
    """A test split after the first part (c -> c1, c2) is counted as the suite is now: c drops out,
    c2 is not run; before, c stayed 'not run' forever and c2 was never selected."""
    import json

    from flashcheck.reports.quality.gpu_lane import tally

    def log(name: str, events: list[dict]) -> Path:
        p = tmp_path / name
        p.write_text("".join(json.dumps(e) + "\n" for e in events))
        return p

    def test(nodeid: str, outcome: str) -> dict:
        return {"event": "test", "nodeid": nodeid, "outcome": outcome, "duration": 1.0, "message": ""}

    first = log("a.jsonl", [{"event": "start", "args": ["tests"]},
                            {"event": "collected", "ids": ["t::a", "t::b", "t::c"]},
                            test("t::a", "passed"), test("t::b", "failed")])
    second = log("b.jsonl", [{"event": "collected", "ids": ["t::a", "t::b", "t::c1", "t::c2"], "full": True},
                             {"event": "start", "args": ["tests", "--run-ids", "ids.txt"]},
                             {"event": "collected", "ids": ["t::b", "t::c1", "t::c2"], "full": False},
                             test("t::b", "passed"), test("t::c1", "passed")])
    t = tally(first, second)
    assert (t["collected"], t["passed"], t["failed"], t["not_run"]) == (4, 3, 0, ["t::c2"])
    assert tally(first)["not_run"] == ["t::c"]


def _fake_pytest(monkeypatch, gpu_lane, action, rc: int) -> None:
    """The lane's pytest subprocess replaced by `action(cmd)`, then an exit status of rc."""
    import subprocess as sp

    class Fake:
        pid = -1

        def __init__(self, cmd, **kw):
            action(cmd)

        def wait(self, timeout=None):
            return rc

    monkeypatch.setattr(sp, "Popen", Fake)
    monkeypatch.setattr(gpu_lane.os, "killpg", lambda pid, sig: None)


def test_lane_part_of_chosen_files_keeps_the_whole_suite(tmp_path: Path, monkeypatch) -> None:
    """A resumed part run on chosen files (--files) collects only those: its collection must not
    stand for the suite, or the record counts a few files as everything (it did: 169 of 1041)."""
    import json

    from flashcheck.reports.quality import gpu_lane

    whole = ["tests/test_a.py::x", "tests/test_b.py::y", "tests/test_b.py::z"]
    first = tmp_path / "a" / "results.jsonl"
    first.parent.mkdir()
    first.write_text("".join(json.dumps(e) + "\n" for e in [
        {"event": "start", "args": ["tests"]}, {"event": "collected", "ids": whole},
        {"event": "test", "nodeid": whole[0], "outcome": "passed", "duration": 1.0, "message": ""}]))
    monkeypatch.setattr(gpu_lane, "suite_files", lambda: ["tests/test_a.py", "tests/test_b.py"])
    monkeypatch.setattr(gpu_lane, "collect", lambda files: [i for i in whole if i.split("::")[0] in files])

    def runs_y(cmd):  # the part's pytest: it runs y and is gone
        with open(Path(cmd[cmd.index("--results-log") + 1]), "a") as fh:
            fh.write(json.dumps({"event": "test", "nodeid": whole[1], "outcome": "passed", "duration": 1.0,
                                 "message": ""}) + "\n")

    _fake_pytest(monkeypatch, gpu_lane, runs_y, 0)
    out = tmp_path / "b"
    out.mkdir()
    rec = gpu_lane.run_suite(out, ["tests/test_b.py"], 10.0, "1", [first])
    assert (rec["collected"], rec["passed"], rec["not_run"]) == (3, 2, ["tests/test_b.py::z"])


def test_lane_keeps_the_fixtures_its_suite_saved(tmp_path: Path, monkeypatch) -> None:
    """A failure's fixture lands in the device's checkout, which does not come back: the lane copies
    the fixtures its run wrote (new or rewritten, not the others) into its own directory and names them."""
    from flashcheck.fixtures import store as fixtures
    from flashcheck.reports.quality import gpu_lane

    reg = tmp_path / "regressions"
    reg.mkdir()
    (reg / "old.json").write_text('{"old": 1}')
    monkeypatch.setattr(fixtures, "DEFAULT_FIXTURE_DIR", reg)

    # the suite's pytest: one test fails and saves its fixture
    _fake_pytest(monkeypatch, gpu_lane,
                 lambda cmd: (reg / "softmax_split__configs_identical__9e99.json").write_text('{"new": 1}'), 1)
    out = tmp_path / "lane"
    out.mkdir()
    rec = gpu_lane.run_suite(out, ["tests/test_a.py"], 10.0, "1")
    assert rec["fixtures"] == ["softmax_split__configs_identical__9e99.json"], rec["fixtures"]
    assert (out / "fixtures" / rec["fixtures"][0]).read_text() == '{"new": 1}'
    assert not (out / "fixtures" / "old.json").exists()


def test_order_from_runs_the_longest_first(tmp_path: Path) -> None:
    """The lane's --order-from: known tests longest first, an unknown one at the median, and the
    same order in every process (a stable sort on the collection order)."""
    (tmp_path / "test_t.py").write_text("import pytest\n@pytest.mark.parametrize('i', range(5))\n"
                                        "def test_a(i):\n    pass\n")
    durations = {f"test_t.py::test_a[{i}]": s for i, s in [(0, 1.0), (1, 30.0), (3, 5.0), (4, 2.0)]}
    (tmp_path / "d.json").write_text(json.dumps(durations))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "flashcheck.plugin.results_log", "-p", "no:cacheprovider",
                        "--order-from", "d.json", "--collect-only", "-q", "test_t.py"],
                       cwd=tmp_path, capture_output=True, text=True)
    order = [line.split("[")[1].rstrip("]") for line in p.stdout.splitlines() if "::test_a[" in line]
    # 2 is unknown: the median of (1, 2, 5, 30) is 5, tied with 3 and ahead of it in collection order
    assert order == ["1", "2", "3", "4", "0"], p.stdout + p.stderr
    (tmp_path / "d.json").write_text("[1, 2]")
    bad = subprocess.run([sys.executable, "-m", "pytest", "-p", "flashcheck.plugin.results_log", "-p", "no:cacheprovider",
                          "--order-from", "d.json", "--collect-only", "-q", "test_t.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 4 and "not a JSON object of node id -> seconds" in bad.stderr + bad.stdout


def test_lane_soak_is_recorded_with_its_seed(tmp_path: Path) -> None:
    """--soak S: the shipped suite in the soak profile, cut at S seconds, recorded with its seed."""
    from flashcheck.reports.quality import gpu_lane

    rc = gpu_lane.main(["--out", str(tmp_path), "--no-suite", "--no-sweep", "--soak", "20", "--soak-seed", "7",
                        "--workers", "1", "--commit", "test"])
    text = (tmp_path / "gpu_run.md").read_text()
    rec = json.loads((tmp_path / "gpu_run.json").read_text())["soak"]
    assert "## Soak (`--hypothesis-profile soak`, seed 7, at most 20 s)" in text, text
    assert "--hypothesis-seed 7" in rec["command"] and rec["collected"] > 0, rec
    ran = rec["passed"] + rec["failed"] + rec["error"] + rec["skipped"]
    assert ran + rec["not_run"] == rec["collected"] and f"{rec['not_run']} not reached" in text, rec
    assert rc == (1 if rec["failed"] or rec["error"] else 0)


def _phase_records(tmp_path: Path, test_file: str) -> dict[str, dict]:
    """Run `test_file` (in tmp_path) under -p flashcheck.plugin.phases; node id -> its results-log record."""
    log = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "flashcheck.plugin.results_log", "-p", "flashcheck.plugin.phases",
                        "-p", "no:cacheprovider", "--results-log", str(log), "-q", test_file],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return {r["nodeid"]: r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == "test"}


def test_phases_count_every_second_once(tmp_path: Path) -> None:
    """-p flashcheck.plugin.phases: the oracle called inside a comparison counts as oracle, not twice;
    Hypothesis's own time (drawing) is apart from the example bodies'; the phases add up to the
    test's call time. The bodies' 0.6 s of sleep must land in `rest` and the sum must match the
    call: a sleep counted as drawing too would break the sum. Drawing's own time is CPU work and
    is not compared with the sleep: on a loaded 2-core CI machine three draws took 0.67 s."""
    (tmp_path / "test_p.py").write_text(
        "import time\nimport numpy as np\nfrom hypothesis import given, settings, strategies as st\n"
        "from flashcheck.oracles.compare import compare_softmax\nfrom flashcheck.oracles.formats import FP32\n"
        "from flashcheck.oracles.softmax import softmax_oracle\n"
        "@settings(max_examples=3, database=None, deadline=None)\n"
        "@given(st.lists(st.floats(-5, 5), min_size=3, max_size=3))\n"
        "def test_h(xs):\n"
        "    x = np.array([xs])\n"
        "    softmax_oracle(x, FP32)\n"
        "    compare_softmax(x, softmax_oracle(x, FP32).astype(np.float32).astype(np.float64), FP32, depth=2)\n"
        "    time.sleep(0.2)\n"
        "def test_plain():\n    time.sleep(0.3)\n")
    recs = _phase_records(tmp_path, "test_p.py")
    h, plain = recs["test_p.py::test_h"], recs["test_p.py::test_plain"]
    from flashcheck.plugin.phases import PHASES

    for r in (h, plain):
        assert set(PHASES) <= set(r["phases"]), r
        assert abs(sum(r["phases"][k] for k in PHASES) - r["duration"]) < 0.1, r
    ph = h["phases"]
    assert ph["oracle"] > 0 and ph["compare"] > 0 and ph["rest"] >= 0.6 and ph["draw"] > 0, ph
    assert plain["phases"]["rest"] >= 0.3 and plain["phases"]["draw"] == 0, plain


def test_phases_count_binaries_built_apart_from_cache_loads(tmp_path: Path) -> None:
    """Triton's compilation listener tells a binary built from one loaded from the on-disk cache:
    the phases record counts the built ones (xdist workers building one binary each show as more
    built than distinct binaries; flashcheck.isolation.compile_lock is meant to make them equal)."""
    (tmp_path / "test_b.py").write_text(
        "from triton import knobs\n"
        "def test_b():\n"
        "    for hit in (False, True, False):\n"
        "        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=hit)\n")
    rec = _phase_records(tmp_path, "test_b.py")["test_b.py::test_b"]
    assert rec["phases"]["built"] == 2, rec


def test_builds_out_logs_each_binary_with_its_key_parts(tmp_path: Path, monkeypatch) -> None:
    """FLASHCHECK_BUILDS_OUT: one JSON line per binary the listener reports, with what tells two
    runs' keys apart (how part M of `git show 2d0dacc:reports/gpu_run.md` found Triton's key-order rebuilds)."""
    from flashcheck.plugin import phases

    monkeypatch.setattr(phases, "_BUILDS_OUT", str(tmp_path / "builds"))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::test_x (call)")

    class Fn:
        __name__ = "_k"
        cache_key = "fnkey"

    class Src:
        fn = Fn()
        signature = {"x_ptr": "*fp16"}
        constants = {(1,): 64}
        attrs = {}

    phases._log_build(False, Src(), {"hash": "h1", "num_warps": 4})
    phases._log_build(True, Src(), {"hash": "h1", "num_warps": 4})
    lines = [json.loads(line) for f in (tmp_path / "builds").iterdir() for line in f.read_text().splitlines()]
    assert [(r["hit"], r["hash"], r["kernel"], r["fn_key"], r["test"]) for r in lines] == [
        (False, "h1", "_k", "fnkey", "t.py::test_x (call)"), (True, "h1", "_k", "fnkey", "t.py::test_x (call)")]
    assert lines[0]["signature"] == "{'x_ptr': '*fp16'}" and lines[0]["options"]["num_warps"] == "4"
    monkeypatch.setattr(phases, "_BUILDS_OUT", None)
    phases._log_build(False, Src(), {"hash": "h2"})
    assert len(list((tmp_path / "builds").iterdir())) == 1 and sum(1 for _ in open(next((tmp_path / "builds").iterdir()))) == 2
