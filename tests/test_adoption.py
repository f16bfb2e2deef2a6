"""Adoption friction (issue 18): what a kernel author meets first.

Declarations are read from the signature (a bare `attention(q, k, v, *, causal, scale, kv_lens)`
is checked with none), contradictions and unknown or inapplicable flags are one line, never
ignored (registered kernels included), a narrowing that leaves a test nothing to draw skips it
naming the declaration (never `Unsatisfiable`), and a run that checked nothing is not green.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flashcheck.targets.external import KernelLoadError, load_kernel
from flashcheck.plugin.selftest import clean_env

BARE = textwrap.dedent('''
    import math
    import torch

    def attention(q, k, v, *, causal=False, scale=None, kv_lens=None):
        """Correct (a float64 reference rounded once, GQA by repeat_interleave); no declarations."""
        B, H, M, D = q.shape
        N, g = k.shape[2], H // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        exists = torch.ones(B, 1, 1, N, dtype=torch.bool, device=q.device)
        if kv_lens is not None:
            exists = torch.arange(N, device=q.device)[None, None, None, :] < kv_lens.view(B, 1, 1, 1)
        kk = k.double().masked_fill(~exists.transpose(-1, -2), 0.0)
        vv = v.double().masked_fill(~exists.transpose(-1, -2), 0.0)
        s = (q.double() @ kk.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(D))
        seen = exists.expand(B, 1, M, N)
        if causal:
            seen = seen & (torch.arange(N, device=q.device)[None, :] <= torch.arange(M, device=q.device)[:, None])
        s = s.masked_fill(~seen, float("-inf"))
        mx = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)).masked_fill(~seen, 0.0)
        l = p.sum(-1, keepdim=True)
        return torch.where(l == 0, torch.zeros_like(p @ vv), (p @ vv) / l).to(q.dtype)

    def no_keywords(q, k, v):
        return attention(q, k, v)

    def anything(q, k, v, **kw):
        return attention(q, k, v)

    def claims_window(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal)
    claims_window.flashcheck = {"window": True}

    def two_aligns(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal)
    two_aligns.flashcheck = {"causal_align": ["top_left", "bottom_right"]}

    def bottom_right(q, k, v, *, causal=False):
        return attention(q, k, v, causal=causal)
    bottom_right.flashcheck = {"causal_align": "bottom_right", "window": False}

    def softmax(x):
        return torch.softmax(x.double(), -1).to(x.dtype)

    def softmax_config(x):
        return softmax(x)
    softmax_config.flashcheck = {"configs": [{"block": 64}]}
''')


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adopt") / "bare.py"
    path.write_text(BARE)
    return path


def _load(kernels: Path, fn: str, family: str = "attention", **overrides):
    return load_kernel(f"{kernels}:{fn}", family, overrides=overrides or None)


# ---- 1. declarations read from the signature ----------------------------------------------------

def test_signature_without_a_keyword_lacks_its_feature(kernels: Path) -> None:
    spec = _load(kernels, "attention")
    assert spec.features() == {"gqa", "dv", "causal", "kv_lens"}, spec.features()
    assert spec.custom_scale and spec.causal_align == ("top_left",)
    assert spec.extra["signature"]["absent"] == ["attn_mask", "causal_align", "lse", "softcap", "splits", "window"]


def test_calls_that_ask_for_nothing_reach_it_without_the_keyword(kernels: Path) -> None:
    spec = _load(kernels, "no_keywords")
    assert not spec.causal and not spec.custom_scale and not spec.kv_lens
    q = torch.randn(1, 1, 3, 4)
    spec.fn(q, q, q, causal=False, scale=None, causal_align="top_left", window=(-1, -1), softcap=0.0)
    with pytest.raises(TypeError, match="causal"):  # a call it cannot take is never quietly changed
        spec.fn(q, q, q, causal=True)


def test_kwargs_accepts_anything(kernels: Path) -> None:
    spec = _load(kernels, "anything")
    assert spec.features() == {"gqa", "dv", "window", "softcap", "lse", "attn_mask", "splits", "causal", "kv_lens"}
    assert spec.extra["signature"]["accepts_any"]


def test_declaration_contradicting_the_signature_is_one_line(kernels: Path) -> None:
    with pytest.raises(KernelLoadError, match=r"window=True declares `window=`, but claims_window\(q, k, v, \*, "
                                              r"causal=False\) takes no `window` keyword"):
        _load(kernels, "claims_window")
    with pytest.raises(KernelLoadError, match="declares 2 alignments.*no `causal_align` keyword"):
        _load(kernels, "two_aligns")
    with pytest.raises(KernelLoadError, match=r"command line: softcap='1' declares `softcap=`"):
        _load(kernels, "attention", softcap="1")
    with pytest.raises(KernelLoadError, match=r"configs entry \{'block': 64\} passes block, which softmax_config"):
        _load(kernels, "softmax_config", "softmax")


def test_explicit_declaration_wins(kernels: Path) -> None:
    spec = _load(kernels, "bottom_right")  # one alignment, implemented without a keyword
    assert spec.causal_align == ("bottom_right",)
    q = torch.randn(1, 1, 3, 4)
    spec.fn(q, q, q, causal=True, causal_align="bottom_right")  # its one alignment: the keyword is dropped
    assert _load(kernels, "attention", kv_lens="false").kv_lens is False


def test_bare_attention_is_checked_with_no_declarations(kernels: Path) -> None:
    """Issue 18's "done when": before, every check failed with TypeError: unexpected keyword 'attn_mask'."""
    p = _cli("check", f"{kernels}:attention", "--family", "attention", "-k", "benign or kv_lens_edges or gqa",
             "--no-save-fixtures", cwd=kernels.parent)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "read from its signature attention(q, k, v, *, causal=False, scale=None, kv_lens=None): absent " \
           "(no keyword): attn_mask, causal_align, lse, softcap, splits, window" in p.stdout
    assert "flashcheck: checked " in p.stdout


# ---- 2. flags are used or rejected, never ignored --------------------------------------------------

def test_registered_kernel_takes_the_command_line_flags() -> None:
    assert load_kernel("softmax_row", overrides={"max_n": 100}).max_n == 100
    assert load_kernel("attention", overrides={"window": "false"}).has("window") is False
    # --kernel-cap values arrive as text: "2" is the integer 2 ('2' was "not a positive integer")
    assert load_kernel("softmax_row", overrides={"max_numel": "2048"}).extra["max_numel"] == 2048
    with pytest.raises(KernelLoadError, match="not a positive integer"):
        load_kernel("softmax_row", overrides={"max_numel": "2.5"})


@pytest.mark.parametrize("target", ["softmax_row", "attention"])
def test_unknown_or_inapplicable_flag_is_an_error(target: str, kernels: Path) -> None:
    with pytest.raises(KernelLoadError, match=r"unknown capability 'softcapp'; known: arithmetic, attn_mask, .*window"):
        load_kernel(target, overrides={"softcapp": "1"})
    wrong = "head_dims" if target == "softmax_row" else "depth"
    with pytest.raises(KernelLoadError, match=f"capability '{wrong}' is for"):
        load_kernel(target, overrides={wrong: "64"})
    with pytest.raises(KernelLoadError, match="unknown capability 'softcapp'"):
        _load(kernels, "anything", softcapp="1")


def test_a_declaration_that_could_only_be_ignored_is_an_error(kernels: Path) -> None:
    with pytest.raises(KernelLoadError, match="varlen=true needs varlen_fn"):
        _load(kernels, "anything", varlen="true")
    with pytest.raises(KernelLoadError, match="empty_row_lse applies to an lse, but lse=false"):
        _load(kernels, "attention", empty_row_lse="+inf")  # its signature has no return_lse


# ---- 3 and 4. nothing to draw is a skip naming the option; nothing checked is not green -----------

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcheck.cli.main", *args, "-p", "no:randomly", "-rs"], cwd=cwd,
                          env=clean_env({"CI": "true"}), capture_output=True, text=True, timeout=600)


def test_min_n_past_every_draw_skips_naming_the_option_and_is_not_green(kernels: Path) -> None:
    p = _cli("check", f"{kernels}:softmax", "--family", "softmax", "--kernel-min-n", "5000", "--no-save-fixtures",
             cwd=kernels.parent)
    out = p.stdout + p.stderr
    assert "Unsatisfiable" not in out and " failed" not in out, out[-3000:]
    assert "nothing to check: --kernel-min-n 5000 is above the longest row this test draws" in out
    assert "NOTHING WAS CHECKED" in out
    assert p.returncode == 5, out[-2000:]


def test_declarations_that_exclude_every_draw_skip_naming_them(kernels: Path) -> None:
    """Attention with a head dim no draw reaches (512: past max_head_dim's 256 on any device; 128,
    the CPU's old example, is drawn on a GPU): `Unsatisfiable` or a skip, now a skip naming the
    declaration, and the run reports that it checked nothing."""
    p = _cli("check", f"{kernels}:attention", "--family", "attention", "--kernel-cap", "head_dims=512",
             "--kernel-cap", "square_only=true", "-k", "adversarial_class and (benign or tied)", "--no-save-fixtures",
             cwd=kernels.parent)
    out = p.stdout + p.stderr
    assert "Unsatisfiable" not in out, out[-3000:]
    assert "declarations (--kernel-cap head_dims=512, --kernel-cap square_only=true" in out
    assert "exclude every input this test draws" in out
    assert "NOTHING WAS CHECKED" in out and p.returncode == 5, out[-2000:]


def test_a_file_of_a_package_with_relative_imports_loads(tmp_path: Path) -> None:
    """`flashcheck check kernels/softmax.py:softmax_row` (and any package module using `from .x
    import`) failed: 'attempted relative import with no known parent package'."""
    pkg = tmp_path / "mykernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_impl.py").write_text("import torch\n\ndef softmax(x):\n    return torch.softmax(x.double(), -1).to(x.dtype)\n")
    (pkg / "api.py").write_text("from ._impl import softmax\n")
    spec = load_kernel(f"{pkg / 'api.py'}:softmax", "softmax")
    x = torch.randn(2, 5)
    assert torch.equal(spec.fn(x), torch.softmax(x.double(), -1).float())
    from flashcheck import HOME

    own = HOME / "kernels" / "softmax.py"
    if own.is_file():  # a checkout: its own folders are flashcheck's, not a second copy of them
        import importlib

        ks = importlib.import_module("flashcheck.kernels.softmax")  # the package re-exports a `softmax` function
        assert load_kernel(f"{own}:softmax_row", "softmax").fn.__module__ == ks.softmax_row.__module__


# ---- cross-entropy: features from the signature, the gradient through autograd, end to end -------
CE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    def cross_entropy(logits, target, *, ignore_index=-100, reduction="mean", weight=None):
        """Correct: torch in float64 (an ignored row's garbage kept from its backward), differentiable."""
        ignored = target == ignore_index
        x = torch.where(ignored[:, None], torch.zeros((), dtype=torch.float64), logits.double())
        w = None if weight is None else weight.double()
        return F.cross_entropy(x, target, weight=w, ignore_index=ignore_index, reduction=reduction).to(logits.dtype)

    def mean_by_count(logits, target, *, ignore_index=-100, reduction="mean", weight=None):
        """Broken: the mean divides by the rows counted, not by their weights' sum (0 rows: 0, not NaN)."""
        if reduction != "mean":
            return cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction, weight=weight)
        total = cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum", weight=weight).double()
        return (total / (target != ignore_index).sum().clamp(min=1)).to(logits.dtype)

    def no_grad(logits, target, *, ignore_index=-100, reduction="mean"):
        return cross_entropy(logits.detach(), target, ignore_index=ignore_index, reduction=reduction)
''')


@pytest.fixture(scope="module")
def ce_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adopt_ce") / "ce.py"
    path.write_text(CE)
    return path


def test_cross_entropy_features_are_read_from_the_signature(ce_file: Path) -> None:
    spec = load_kernel(f"{ce_file}:cross_entropy", "cross_entropy")
    assert spec.features() == {"weight", "ignore_index"} and spec.reductions == ("mean", "sum", "none")
    assert spec.extra["signature"]["absent"] == ["inplace_backward", "label_smoothing", "softcap", "z_loss"]
    bare = load_kernel(f"{ce_file}:no_grad", "cross_entropy")
    assert bare.features() == {"ignore_index"}
    x, t = torch.zeros(2, 3), torch.tensor([0, 2])
    spec.fn(x, t, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="sum")  # asks nothing
    with pytest.raises(TypeError, match="label_smoothing"):  # asks for smoothing it cannot do: never dropped
        spec.fn(x, t, label_smoothing=0.1)
    with pytest.raises(KernelLoadError, match=r"command line: z_loss='true' declares `z_loss=`, but cross_entropy\(logits"):
        load_kernel(f"{ce_file}:cross_entropy", "cross_entropy", overrides={"z_loss": "true"})
    with pytest.raises(KernelLoadError, match="capability 'weight' is for cross_entropy kernels, not softmax"):
        load_kernel(f"{ce_file}:cross_entropy", "softmax", overrides={"weight": "true"})


def test_cross_entropy_check_end_to_end(ce_file: Path) -> None:
    """`flashcheck check ce.py:fn --family cross_entropy`: the correct kernel passes with its features read
    from its signature, loss and gradient (autograd) checked; the broken one fails naming the mean."""
    p = _cli("check", f"{ce_file}:cross_entropy", "--family", "cross_entropy", "-k", "special or benign",
             "--no-save-fixtures", cwd=ce_file.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "read from its signature cross_entropy(logits, target, *, ignore_index=-100, reduction='mean', " \
           "weight=None): absent (no keyword): inplace_backward, label_smoothing, softcap, z_loss" in out
    assert "flashcheck: checked " in out and "gradient was not checked" not in out
    p = _cli("check", f"{ce_file}:mean_by_count", "--family", "cross_entropy", "-k", "special and all_ignored", "-x",
             "--no-save-fixtures", cwd=ce_file.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "mean_is_sum_over_weights" in out and "is 0.0, not NaN (0/0, torch)" in out, out[-3000:]


def test_a_cross_entropy_kernel_without_a_gradient_is_told_once(ce_file: Path) -> None:
    """No grad_fn, no with_grad: its loss is checked, its gradient not, and the run says so in one line."""
    p = _cli("check", f"{ce_file}:no_grad", "--family", "cross_entropy", "-k", "benign and fp32",
             "--no-save-fixtures", cwd=ce_file.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert out.count("flashcheck: ce.no_grad: its gradient was not checked: the loss it returns carries no grad_fn "
                     "and it declares no with_grad") == 1, out[-3000:]
