"""--quick-first N (flashcheck.plugin.quick_first): every Hypothesis test first with N examples, then all
of them with the profile's count; off at 0 and when the profile draws no more than N."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = """
import json, os
import pytest
from hypothesis import given, settings, strategies as st

def _log(name):
    with open(os.environ["QF_LOG"], "a") as fh:
        fh.write(json.dumps(name) + "\\n")

@given(st.integers())
def test_plain(x):
    _log("plain")

@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
@given(st.integers())
def test_param(k, x):
    _log(f"param{k}")
    assert not (k == 2 and x == 12345678), "never"

def test_not_hypothesis():
    _log("nohyp")

@settings(max_examples=2)
@given(st.integers())
def test_few(x):
    _log("few")
"""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / "test_q.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(
        "from hypothesis import settings\n"
        "settings.register_profile('many', max_examples=30, derandomize=True, database=None)\n"
        "settings.register_profile('gpu', max_examples=30, derandomize=True, database=None)\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'slow: slow')\n")
    log = tmp_path / "log.jsonl"
    log.unlink(missing_ok=True)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "flashcheck.plugin.quick_first", "-p", "no:cacheprovider",
                        "-p", "no:randomly", *(() if "--hypothesis-profile" in args else ("--hypothesis-profile", "many")),
                        "-v", *args, "test_q.py"],
                       cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "QF_LOG": str(log)})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p, calls


def _runs(calls: list[str]) -> list[tuple[str, int]]:
    """Consecutive calls of one test, collapsed: [(name, examples), ...] in run order."""
    out: list[tuple[str, int]] = []
    for c in calls:
        if out and out[-1][0] == c:
            out[-1] = (c, out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out


def test_quick_pass_runs_every_hypothesis_test_first_with_n_examples(tmp_path: Path) -> None:
    p, calls = _run(tmp_path, "--quick-first", "3")
    assert p.returncode == 0, p.stdout + p.stderr
    runs = _runs(calls)
    assert runs[:3] == [("plain", 3), ("param1", 3), ("param2", 3)], runs
    assert [name for name, _ in runs[3:]] == ["plain", "param1", "param2", "nohyp", "few"], runs  # few: no quick copy
    assert all(n > 3 for _, n in runs[3:6]), runs  # the full pass keeps the profile's count
    ids = [line.split(" ")[0] for line in p.stdout.splitlines() if "::test_" in line and "PASSED" in line]
    assert ids[:3] == ["test_q.py::test_plain_quick", "test_q.py::test_param_quick[1]", "test_q.py::test_param_quick[2]"], ids
    assert "test_q.py::test_param[1]" in ids and len(ids) == 8, ids


def test_quick_copies_keep_markers_and_selection(tmp_path: Path) -> None:
    p, calls = _run(tmp_path, "--quick-first", "3", "-m", "slow", "-k", "param and 2")
    assert p.returncode == 0, p.stdout + p.stderr
    ids = [line.split(" ")[0] for line in p.stdout.splitlines() if "PASSED" in line]
    assert ids == ["test_q.py::test_param_quick[2]", "test_q.py::test_param[2]"], p.stdout
    assert calls == ["param2"] * (3 + 30), calls


def test_off_at_zero_and_when_the_profile_draws_no_more(tmp_path: Path) -> None:
    _, off = _run(tmp_path)
    _, few = _run(tmp_path, "--quick-first", "30")
    assert [n for n, _ in _runs(off)] == ["plain", "param1", "param2", "nohyp", "few"] == [n for n, _ in _runs(few)]
    bad, _ = _run(tmp_path, "--quick-first", "-1")
    assert bad.returncode == 4 and "--quick-first -1: must be 0 (off) or a number of examples" in bad.stdout + bad.stderr


def test_the_gpu_tier_runs_a_quick_pass_of_12_unless_told_otherwise(tmp_path: Path) -> None:
    from flashcheck.plugin.profiles import default_quick_first

    assert default_quick_first("gpu") == 12 and default_quick_first("ci") == default_quick_first("soak") == 0
    _, gpu = _run(tmp_path, "--hypothesis-profile", "gpu")
    runs = _runs(gpu)
    assert runs[:3] == [("plain", 12), ("param1", 12), ("param2", 12)], runs
    _, off = _run(tmp_path, "--hypothesis-profile", "gpu", "--quick-first", "0")
    assert [n for n, _ in _runs(off)] == ["plain", "param1", "param2", "nohyp", "few"]
