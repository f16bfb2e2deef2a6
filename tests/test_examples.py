"""The examples in `examples/` are checked the way their README section says: `flashcheck check`
from the command line. The CuTe DSL softmax is a GPU kernel that is not Triton: it needs CUDA and
`nvidia-cutlass-dsl`; without them `check` must say so in one line (exit 2), never a traceback."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from flashcheck import HOME
from flashcheck.exitcodes import FAILED, OK, USAGE

CUTE = HOME / "examples" / "cute_online_softmax.py"
HAS_CUTE = importlib.util.find_spec("cutlass") is not None
pytestmark = pytest.mark.skipif(not CUTE.is_file(), reason="needs flashcheck's source checkout (examples/)")


def _check(target: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLASHCHECK_SUITE_FIXTURES="0")
    return subprocess.run([sys.executable, "-m", "flashcheck.cli.main", "check", f"{CUTE}:{target}", "--family", "softmax",
                           "--no-save-fixtures", *args], cwd=HOME, env=env, capture_output=True, text=True, check=False,
                          timeout=timeout)


@pytest.mark.skipif(HAS_CUTE, reason="nvidia-cutlass-dsl is installed: the missing-DSL message cannot be seen")
def test_cute_example_without_the_dsl_is_one_line():
    r = _check("softmax", timeout=120)
    assert r.returncode == USAGE, r.stdout + r.stderr
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "cutlass" in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.gpu_only
@pytest.mark.slow
@pytest.mark.skipif(not (HAS_CUTE and torch.cuda.is_available()), reason="needs CUDA and nvidia-cutlass-dsl")
def test_cute_example_passes_and_its_seed_version_is_caught():
    good = _check("softmax", "-n", "auto", timeout=600)
    assert good.returncode == OK, good.stdout[-3000:]
    # the seed's version never reads a row shorter than its 512 threads: the one-element row shrinks to it
    bad = _check("seed_softmax", "-k", "adversarial_class and elementwise", "-n", "3", timeout=600)
    assert bad.returncode == FAILED, bad.stdout[-3000:]
    assert "exceed the error bound" in bad.stdout, bad.stdout[-3000:]
