"""Public Triton attention kernels with a backward (tests/public_kernels/, findings in
reports/records/public_kernels.md), each through its thin adapter.

The declarations and pins are checked always (fast, no kernel run). The suite run itself costs
minutes under the interpreter (one backward is three kernels' emulation), so it is slow; it needs
the fetched files (`python tests/public_kernels/fetch.py`) and skips without them. Each adapter's
expected exit status is the record's verdict: a change in it is a change in the finding.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashcheck import HOME
from flashcheck.targets import external

HERE = HOME / "tests" / "public_kernels"
SOURCES = json.loads((HERE / "sources.json").read_text())
# adapter -> (exit status of `flashcheck check ... -k backward --hypothesis-profile smoke`, what the record says)
ADAPTERS = {
    "dao_flash_attn_triton": (1, "never runs on a CPU: `assert q.is_cuda`; on this Triton `tl.dot(trans_b=True)` is gone"),
    "flag_attention": (1, "K/V strides swapped in _fwd_kernel (strided_views fails)"),
    "flasht5": (1, "K/V strides swapped in _fwd_kernel, from FlagAttention (strided_views fails)"),
}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_declares_only_known_capabilities(name: str) -> None:
    fn = importlib.import_module(f"tests.public_kernels.{name}").attention
    assert set(fn.flashcheck) <= set(external.CAPABILITIES), set(fn.flashcheck) - set(external.CAPABILITIES)


def test_every_pin_names_repo_commit_path_license_and_hash() -> None:
    for f in SOURCES["files"]:
        assert set(f) == {"repo", "commit", "path", "local", "license", "sha256"}, f
        assert len(f["commit"]) == 40 and len(f["sha256"]) == 64, f


def _fetched() -> bool:
    return all((HERE / "_vendor" / f["local"]).is_file() for f in SOURCES["files"])


@pytest.mark.slow
@pytest.mark.skipif(not _fetched(), reason="public kernels not fetched: python tests/public_kernels/fetch.py")
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_backward_verdict_is_the_records(name: str, tmp_path: Path) -> None:
    want, why = ADAPTERS[name]
    run = subprocess.run([str(Path(sys.executable).parent / "flashcheck"), "check", f"tests/public_kernels/{name}.py:attention",
                          "--family", "attention", "-k", "backward", "--hypothesis-profile", "smoke",
                          "--no-save-fixtures", "-p", "no:cacheprovider"],
                         cwd=HOME, capture_output=True, text=True, timeout=1800)
    assert run.returncode == want, f"{name}: {why}\n" + run.stdout[-3000:] + run.stderr[-2000:]
