"""A kernel that cleanly refuses a feature it never declared (issue 48 item 4, flashcheck.properties.refusals).

Before: an attention kernel raising ValueError("shapes do not match") on grouped heads failed every
test that drew them, each failure repeating "declare gqa=False". Now those examples are left, a
test with nothing else to check is skipped, and the run ends with one line per refused feature.
Declared support, a refusal of a plain input, or a raise inside a library stay failures.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashcheck.plugin.selftest import clean_env

ATTENTION = textwrap.dedent('''
    import math
    import torch

    def _reference(q, k, v, causal, scale):
        B, H, M, D = q.shape
        N, g = k.shape[2], H // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1).double(), v.repeat_interleave(g, dim=1).double()
        s = (q.double() @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(D))
        if causal:
            s = s.masked_fill(torch.arange(N)[None, :] > torch.arange(M)[:, None], float("-inf"))
        return torch.softmax(s, -1).nan_to_num(0.0).__matmul__(v).to(q.dtype)

    def grouped_refused(q, k, v, *, causal=False, scale=None):
        if q.shape[1] != k.shape[1]:
            raise ValueError("shapes do not match")
        return _reference(q, k, v, causal, scale)

    def plain_refused(q, k, v, *, causal=False, scale=None):
        raise ValueError("shapes do not match")

    def library_refused(q, k, v, *, causal=False, scale=None):
        if q.shape[1] != k.shape[1]:
            torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :, :1], v)  # raises inside torch
        return _reference(q, k, v, causal, scale)
''')

SOFTMAX = textwrap.dedent('''
    import torch

    def short_rows(x):
        if x.shape[-1] > 300:
            raise ValueError("rows longer than 300 are not supported")
        return torch.softmax(x.double(), -1).to(x.dtype)
''')

GQA_TESTS = "special_cases and (gqa_group_3 or single_key)"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("refusals")
    (d / "att.py").write_text(ATTENTION)
    (d / "sm.py").write_text(SOFTMAX)
    return d


def _check(folder: Path, target: str, family: str, *args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "flashcheck.cli.main", "check", target, "--family", family, "--kernel-dtypes",
                        "fp32", "--no-save-fixtures", "-p", "no:randomly", "-rs", "--hypothesis-profile", "smoke",
                        *args], cwd=folder, env=clean_env({"CI": "true"}), capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["in_process", "xdist"])
def test_undeclared_gqa_refused_is_a_skip_with_one_summary_line(folder: Path, workers: tuple[str, ...]) -> None:
    rc, out = _check(folder, "att.py:grouped_refused", "attention", "-k", GQA_TESTS, *workers)
    assert rc == 0 and "1 passed, 1 skipped" in out and "FAILED" not in out, out[-4000:]
    # (the case is also M != N: the skip names both; the summary counts it under the one refused alone)
    assert "refused gqa+square_only: the kernel raised ValueError: shapes do not match on grouped heads (Hq=6, Hkv=2)" \
        in out
    lines = [ln for ln in out.splitlines() if ln.startswith("flashcheck: refused")]
    assert lines == ['flashcheck: refused gqa (1 test): "ValueError: shapes do not match" -- declare gqa=False '
                     '(--kernel-cap gqa=False) to skip it, gqa=True to fail it'], out[-4000:]
    assert "declare `gqa=False`" not in out  # the old per-failure hint


@pytest.mark.slow
def test_declared_gqa_refused_fails(folder: Path) -> None:
    rc, out = _check(folder, "att.py:grouped_refused", "attention", "-k", GQA_TESTS, "--kernel-cap", "gqa=true")
    assert rc == 1 and "1 failed, 1 passed" in out, out[-4000:]
    assert "flashcheck: refused" not in out


@pytest.mark.slow
def test_refusing_a_plain_input_or_inside_a_library_fails(folder: Path) -> None:
    rc, out = _check(folder, "att.py:plain_refused", "attention", "-k", "adversarial_class and benign")
    assert rc == 1 and "1 failed" in out and "flashcheck: refused" not in out, out[-4000:]
    rc, out = _check(folder, "att.py:library_refused", "attention", "-k", "special_cases and gqa_group_3")
    assert rc == 1 and "1 failed" in out and "flashcheck: refused" not in out, out[-4000:]


@pytest.mark.slow
def test_softmax_refusing_long_rows_names_max_n(folder: Path) -> None:
    """Hypothesis tests: the long examples are rejected, the short ones still checked (benign passes,
    its long rows refused and counted); long_uniform draws nothing shorter and is skipped."""
    rc, out = _check(folder, "sm.py:short_rows", "softmax", "-k", "adversarial_class and (long_uniform or benign)")
    assert rc == 0 and "1 passed, 1 skipped" in out, out[-4000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("flashcheck: refused")]
    assert len(lines) == 1 and lines[0].startswith('flashcheck: refused max_n (2 tests): "ValueError: rows longer '
                                                   'than 300 are not supported" -- declare max_n='), out[-4000:]
    assert "(--kernel-max-n " in lines[0]
