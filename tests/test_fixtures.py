"""The fixture machinery itself: a deliberately broken kernel run under Hypothesis must leave
exactly one minimal exact-bit fixture that fails on replay; saving can be switched off."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from flashcheck.kernels import DEVICE
from flashcheck.harness import SAVE_ENV, Case, fixture_key, fixture_payload, load_fixture

from flashcheck import HOME as ROOT
from flashcheck.selftest import run_pytest

BROKEN = textwrap.dedent('''
    import torch

    def broken_tail(x):
        """Drops the last column, like a kernel that forgets the tail past the last tile."""
        y = torch.softmax(x.float(), dim=-1)
        y[:, -1] = 0
        return y.to(x.dtype)
''')


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # A clean environment: the outer run's flags (--no-save-fixtures, a worker id, PYTEST_ADDOPTS)
    # must not reach the run under test.
    return run_pytest("--hypothesis-profile", "ci", *args, cwd=cwd)


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("broken")
    (tmp / "broken.py").write_text(BROKEN)
    fixtures = tmp / "fixtures"
    run = _pytest("tests/test_softmax.py", "-k", "test_adversarial_class and benign and fp32",
                  "--kernel", f"{tmp}/broken.py:broken_tail", "--family", "softmax", "--fixture-dir", str(fixtures))
    return tmp, fixtures, run


@pytest.mark.slow
def test_broken_kernel_leaves_one_minimal_fixture(broken_run) -> None:
    tmp, fixtures, run = broken_run
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    files = sorted(fixtures.glob("*.json"))
    assert len(files) == 1, f"expected one fixture, got {[f.name for f in files]}\n{run.stdout[-3000:]}"
    payload = json.loads(files[0].read_text())
    assert payload["kernel"] == "broken.broken_tail"
    assert payload["property"] == "matches_oracle"
    x = payload["tensors"]["x"]
    # Minimal: one row of one element, contiguous, no offset, nothing around it.
    assert x["shape"] == [1, 1] and x["storage_offset"] == 0 and x["storage_words"] == 1, x
    assert not list(fixtures.glob(".tmp-*")), "a temporary file was left behind"


@pytest.mark.slow
def test_fixture_fails_on_replay(broken_run) -> None:
    tmp, fixtures, _ = broken_run
    run = _pytest("tests/test_regressions.py", "--kernel", f"{tmp}/broken.py:broken_tail", "--family", "softmax",
                  "--fixture-dir", str(fixtures))
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.slow
def test_self_tests_pass_under_no_save_fixtures() -> None:
    """The outer run's --no-save-fixtures (as a flag, in PYTEST_ADDOPTS and as the environment
    variable) must not reach the runs these self-tests start: they save fixtures on purpose."""
    run = run_pytest("tests/test_fixtures.py", "-k", "minimal_fixture or fails_on_replay", "--no-save-fixtures",
                     env={"PYTEST_ADDOPTS": "--no-save-fixtures", SAVE_ENV: "0"}, timeout=900)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.slow
def test_saving_can_be_switched_off(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BROKEN)
    fixtures = tmp_path / "fixtures"
    run = _pytest("tests/test_softmax.py", "-k", "test_adversarial_class and benign and fp32",
                  "--kernel", f"{tmp_path}/broken.py:broken_tail", "--family", "softmax",
                  "--fixture-dir", str(fixtures), "--no-save-fixtures")
    assert run.returncode == 1, run.stdout[-3000:]
    assert not list(fixtures.glob("*.json")) if fixtures.exists() else True


def test_round_trip_is_bit_exact() -> None:
    buf = torch.tensor([1.0, float("nan"), -0.0, 3.5e-42, float("-inf"), 2.0, 7.0, 8.0]).to(torch.bfloat16)
    x = buf.as_strided((2, 2), (1, 3), 1)
    case = Case(tensors={"x": x}, kwargs={"out_dtype": torch.float32}, label="round-trip")
    payload = fixture_payload(type("S", (), {"name": "k", "family": "softmax", "external": False})(), "matches_oracle", case,
                              AssertionError("boom"))
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"flashcheck-roundtrip-{os.getpid()}.json"
    path.write_text(json.dumps(payload))
    try:
        _, back = load_fixture(path, DEVICE)
    finally:
        path.unlink()
    y = back.tensors["x"]
    assert y.stride() == x.stride() and y.storage_offset() == x.storage_offset() and y.dtype == x.dtype
    assert torch.equal(y.cpu().view(torch.int16), x.view(torch.int16))
    assert back.kwargs == {"out_dtype": torch.float32}
    assert fixture_key(payload) == fixture_key(json.loads(json.dumps(payload)))
