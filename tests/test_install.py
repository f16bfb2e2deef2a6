"""flashcheck as a kernel author gets it: the wheel, installed (not editable) in a fresh virtual
environment, used from another repository that has its own `tests/` package and `kernels/`.

The environment reuses this one's third-party packages through a .pth line (torch and triton are
not downloaded again) but holds flashcheck only as the installed wheel: its site-packages must
contain exactly one top-level name, `flashcheck`. The editable install this suite usually runs
from is checked too (its finder maps `flashcheck` alone).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from flashcheck import HOME
from flashcheck.kernels import INTERPRET

GENERIC = {"kernels", "oracles", "strategies", "reports", "tests"}  # never top-level names of the wheel
SHIPPED = ("kernels", "oracles", "strategies", "reports", "reports/stability", "reports/bench", "reports/quality",
           "suite", "suite/zoo")  # flashcheck.<these>
pytestmark = pytest.mark.skipif(not (HOME / "pyproject.toml").is_file(),
                                reason="needs flashcheck's source checkout (it builds the wheel)")

SOFTMAX = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n, sxm, sxn, sym, syn, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * sxm + cols * sxn, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(x - m), 0.0)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * sym + cols * syn, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x):
    y = torch.empty_like(x)
    _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                                   BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


softmax.flashcheck = {"max_n": 4096}


# An adversarial class of the author's own, registered without editing flashcheck.
from flashcheck.strategies import register_class
from flashcheck.strategies.softmax import peaked_rows


def author_peaks(*, fmt, max_n, strided=True):
    return peaked_rows(dtype=fmt, max_n=min(max_n, 300), strided=strided)


register_class("softmax", "author_peaks", author_peaks)


def broken(x):
    """Forgets the max subtraction: exp overflows on large logits."""
    y = torch.exp(x.float())
    return (y / y.sum(-1, keepdim=True)).to(x.dtype)
'''

ATTENTION = '''
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, M, N, scale,
                 sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                 H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd, mask=rm[:, None] < M, other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + b * skb + h * skh + rn[:, None] * skn + rd[None, :] * skd, mask=rn[:, None] < N, other=0.0)
        v = tl.load(v_ptr + b * svb + h * svh + rn[:, None] * svn + rd[None, :] * svd, mask=rn[:, None] < N, other=0.0)
        # ieee: fp32 inputs would otherwise be multiplied as TF32 on the GPU (and in the interpreter,
        # which follows it), about 1e-4 off: not a correct fp32 kernel
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(rn[None, :] < N, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + rm[:, None] * som + rd[None, :] * sod, o.to(o_ptr.dtype.element_ty),
             mask=rm[:, None] < M)


def attention(q, k, v, *, causal=False, scale=None, kv_lens=None):
    B, H, M, D = q.shape
    N = k.shape[2]
    o = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    grid = (triton.cdiv(M, 16), B * H)
    _attn_kernel[grid](q, k, v, o, M, N, scale, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                       H=H, D=D, BLOCK_M=16, BLOCK_N=16)
    return o


# What this kernel supports, declared: no causal mask, no kv_lens, power-of-two head dims >= 16,
# the row sum taken from the fp32 P (FlashAttention's convention).
attention.flashcheck = {"causal": False, "kv_lens": False, "head_dims": [16, 32, 64],
                        "row_sum": "fp32_p", "block_n": 16, "gqa": False, "dv": False, "window": False,
                        "softcap": False, "lse": False, "attn_mask": False, "splits": False, "varlen": False}
'''

OWN_TEST = '''
from tests.helpers import double
from kernels.softmax import softmax


def test_own_suite_still_works():
    assert double(2) == 4 and callable(softmax)
'''


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _explain(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-3000:]}"


@pytest.fixture(scope="module")
def author(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools in this environment")
    root = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FLASHCHECK_"))}
    env.pop("PYTHONPATH", None)
    # Build from a copy: xdist workers each run this fixture, and setuptools writes build/ and
    # *.egg-info into the source tree it builds (two builds in one tree race).
    src = root / "src"
    shutil.copytree(HOME, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".hypothesis", "flashcheck-re*", "out"))
    wheel = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "-w", str(root / "dist"), str(src)], root, env)
    assert wheel.returncode == 0, _explain(wheel)
    (whl,) = (root / "dist").glob("flashcheck-*.whl")
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], root, env)
    assert made.returncode == 0, _explain(made)
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root,
                     env).stdout.strip())
    before = {p.name for p in site.iterdir()}
    inst = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)], root, env)
    assert inst.returncode == 0, _explain(inst)
    added = {p.name for p in site.iterdir()} - before
    # Third-party packages from this environment, after the wheel's own files on sys.path.
    (site / "zz_flashcheck_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    repo = root / "author_repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "kernels").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (repo / "tests" / "test_own.py").write_text(OWN_TEST)
    (repo / "kernels" / "__init__.py").write_text("")
    (repo / "kernels" / "softmax.py").write_text(SOFTMAX)
    (repo / "kernels" / "attention.py").write_text(ATTENTION)
    env = {**env, "CI": "true", "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    return {"root": root, "venv": venv, "py": py, "site": site, "added": added, "repo": repo, "env": env}


def test_one_top_level_name(author: dict) -> None:
    names = {n for n in author["added"] if not n.endswith((".dist-info", ".pth")) and n != "__pycache__"}
    assert names == {"flashcheck"}, f"the wheel installed top-level names {sorted(names)}"
    pkg = author["site"] / "flashcheck"
    for sub in SHIPPED:
        assert (pkg / sub / "__init__.py").is_file(), f"flashcheck.{sub} missing from the wheel"
    assert list((pkg / "suite" / "regressions").glob("*.json")), "the suite's regression fixtures are not shipped"
    assert not (pkg / "tests").exists(), "the self-tests (tests/) were shipped in the wheel"
    where = _run([str(author["py"]), "-c", "import flashcheck.kernels as k; print(k.__file__)"], author["repo"],
                 author["env"])
    assert where.returncode == 0 and str(pkg) in where.stdout, _explain(where)


def test_editable_install_maps_one_name() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    finders = list(site.glob("__editable___flashcheck_*_finder.py"))
    if not finders:
        pytest.skip("this environment has no editable install of flashcheck")
    mapping = re.search(r"MAPPING\s*:\s*dict\[str, str\]\s*=\s*(\{.*?\})|MAPPING\s*=\s*(\{.*?\})",
                        finders[0].read_text(), re.S)
    assert mapping, f"{finders[0]}: no MAPPING"
    names = set(json.loads((mapping.group(1) or mapping.group(2)).replace("'", '"')))
    assert {n.split(".")[0] for n in names} == {"flashcheck"}, \
        f"the editable install maps top-level names {sorted(names)}"
    assert not (GENERIC & {p.name for p in site.iterdir()})


def test_authors_own_suite_still_passes(author: dict) -> None:
    p = _run([str(author["py"]), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], author["repo"],
             author["env"])
    assert p.returncode == 0 and "1 passed" in p.stdout, _explain(p)


@pytest.mark.parametrize("target,family,select", [
    ("kernels/softmax.py:softmax", "softmax",
     "adversarial_class and (benign or subnormal or neg_inf_padding or huge_magnitude or author_peaks) or special"),
    ("kernels/attention.py:attention", "attention",
     "adversarial_class and (benign or wide_logit or tied or strided or large_values)"),
])
def test_check_passes_a_correct_kernel(author: dict, target: str, family: str, select: str) -> None:
    # On a GPU the run is Triton compiling the author's variants (357 s for attention in one process
    # on an H100): four workers, as an author's GPU CI runs it (-n auto), spread the compilations.
    workers = [] if INTERPRET else ["-n", "4"]
    p = _run(["flashcheck", "check", target, "--family", family, "-q", "-p", "no:randomly", *workers, "-k", select],
             author["repo"], author["env"])
    assert p.returncode == 0, _explain(p)
    if family == "softmax":  # the author's registered class ran, in every dtype
        listed = _run(["flashcheck", "check", target, "--family", family, "--collect-only", "-q", "-k", "author_peaks"],
                      author["repo"], author["env"])
        for dtype in ("fp16", "bf16", "fp32"):
            assert f"-{dtype}-author_peaks]" in listed.stdout, _explain(listed)
    assert not (author["repo"] / "flashcheck-regressions").exists(), "a passing run wrote fixtures"


def test_check_fails_a_broken_kernel_and_replays(author: dict) -> None:
    repo, env = author["repo"], author["env"]
    p = _run(["flashcheck", "check", "kernels/softmax.py:broken", "--family", "softmax", "-q", "-x",
              "-k", "adversarial_class and huge_magnitude and fp32"], repo, env)
    assert p.returncode == 1, _explain(p)
    fixtures = sorted((repo / "flashcheck-regressions").glob("softmax_broken__*.json"))
    assert len(fixtures) == 1, f"{[f.name for f in fixtures]}\n{_explain(p)}"
    replay = re.search(r"^E?\s*replay: (flashcheck replay .+)$", p.stdout, re.M)
    assert replay, _explain(p)
    again = _run(replay.group(1).split(), repo, env)
    assert again.returncode == 1 and "FAIL" in again.stdout, _explain(again)
    # The same command replays it on the next run, without being told where it is.
    rerun = _run(["flashcheck", "check", "kernels/softmax.py:broken", "--family", "softmax", "-q",
                  "-k", "replay"], repo, env)
    assert rerun.returncode == 1 and "1 failed" in rerun.stdout, _explain(rerun)
