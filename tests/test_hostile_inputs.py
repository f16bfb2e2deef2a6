"""The tool under hostile use (issue 49): fixtures whose numbers would exhaust the machine, bad
options, a user's packages named like flashcheck's folders, arguments past what the inputs hold.
Each is one clear line and the contract's exit status (flashcheck.exitcodes), never a traceback,
an INTERNALERROR, a hang or a green exit.

Nothing here allocates what a hostile fixture asks for: the caps are checked on the file first
(`read_fixture`), and a test asserts that before it replays anything.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flashcheck import SUITE, exitcodes
from flashcheck.fixtures import store as fx
from flashcheck.cli.main import main as flashcheck
from flashcheck.kernels import DEVICE
from flashcheck.plugin.selftest import clean_env
from tests.test_exits import in_process  # noqa: F401  (a fixture: replay in this process)

REGRESSIONS = SUITE / "regressions"
SOFTMAX = REGRESSIONS / "softmax_online__matches_oracle__15cc3acdfa61.json"
ATTENTION = REGRESSIONS / "attention__query_permutation__a7c4e2b9d51f.json"


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]
    return lines[0]


# ---- fixtures whose numbers blow up --------------------------------------------------------------

def _softmax_view(**x) -> dict:
    payload = json.loads(SOFTMAX.read_text())
    payload["tensors"]["x"].update(x)
    return payload


def _attention(kwargs: dict | None = None, **tensors: dict) -> dict:
    payload = json.loads(ATTENTION.read_text())
    payload["kwargs"].update(kwargs or {})
    for name, edit in tensors.items():
        payload["tensors"][name].update(edit)
    return payload


HOSTILE_FIXTURES = {  # name -> (payload, a word of the reason)
    # issue 49's own: one stored word seen as a billion by zero strides (23 GB, then killed)
    "zero strides, 10**9 elements": (_softmax_view(shape=[1, 10**9], stride=[0, 0], storage_offset=0,
                                                   storage_words=1, bits=["0"]), "elements"),
    "empty view at a huge offset": (_softmax_view(shape=[0, 4], stride=[4, 1], storage_offset=10**30,
                                                  storage_words=1, bits=["0"]), "reach past"),
    "attention scores, M*N by zero strides": (_attention(q={"shape": [1, 1, 10**6, 1], "stride": [0, 0, 0, 0]},
                                                         k={"shape": [1, 1, 10**4, 1], "stride": [0, 0, 0, 0]},
                                                         v={"shape": [1, 1, 10**4, 1], "stride": [0, 0, 0, 0]},
                                                         kv_lens={"shape": [1]}), "scores"),
    "attention output, a wide v head": (_attention(q={"shape": [1, 1, 10**6, 1], "stride": [0, 0, 0, 0]},
                                                   v={"shape": [2, 1, 2, 10**4], "stride": [0, 0, 0, 0]}),
                                        "output"),
    "a grid-sized keyword": (_attention({"num_splits": 2**31 - 1}), "num_splits"),
}


@pytest.mark.parametrize("name", list(HOSTILE_FIXTURES))
def test_a_fixture_past_the_caps_is_bad_input_before_any_allocation(
        name: str, tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    payload, word = HOSTILE_FIXTURES[name]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(fx.FixtureError, match="implausibly|reach past") as e:  # first: nothing allocated yet
        fx.read_fixture(path)
    assert word in str(e.value)
    rc = flashcheck(["replay", str(path)])
    out = capsys.readouterr().out
    assert rc == exitcodes.USAGE, out
    line = next(ln for ln in out.splitlines() if ln.startswith("ERROR"))
    assert line.startswith(f"ERROR bad fixture {path}:") and word in line, out


# ---- argument checks --------------------------------------------------------------------------------

@pytest.mark.parametrize("which,value", [("max_seqlen_q", 11), ("max_seqlen_k", 11), ("max_seqlen_q", 2**31 - 1)])
def test_varlen_max_seqlen_past_the_packed_tokens_is_one_line(which: str, value: int) -> None:
    """2^31 - 1 on 10 tokens hung (the grid is sized by it); FlashAttention's contract: at least the
    longest sequence, and no sequence is longer than the tokens given."""
    from flashcheck.kernels.attention import attention_varlen

    q = torch.randn(10, 1, 16, device=DEVICE)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    kw = {"max_seqlen_q": 6, "max_seqlen_k": 6, which: value}
    with pytest.raises(ValueError, match=f"{which}={value} exceeds the packed length 10") as e:
        attention_varlen(q, q, q, cu, cu, **kw)
    _one_line(str(e.value))


def test_a_softmax_kernel_rejecting_long_rows_is_told_its_max_n(tmp_path: Path) -> None:
    """As attention's grouped-heads rejection is told `gqa=false`: the declaration that skips it."""
    from flashcheck.properties import runner as properties
    from flashcheck.families import load_properties
    from flashcheck.targets.external import load_kernel
    from flashcheck.properties.limits import KernelUnsupported
    from flashcheck.strategies.case import Case

    load_properties()

    (tmp_path / "short.py").write_text(textwrap.dedent('''
        import torch

        def softmax(x):
            if x.shape[-1] > 4:
                raise ValueError(f"rows longer than 4 are not supported, got {x.shape[-1]}")
            return torch.softmax(x.double(), -1).to(x.dtype)
    '''))
    spec = load_kernel(f"{tmp_path / 'short.py'}:softmax", "softmax")
    with pytest.raises(KernelUnsupported, match=r"declare `max_n=4` \(--kernel-max-n 4\)"):
        properties.check(spec, "matches_oracle", Case(tensors={"x": torch.zeros(2, 5)}))


# ---- options -----------------------------------------------------------------------------------------

def _kernel_file(folder: Path) -> Path:
    path = folder / "k.py"
    path.write_text("import torch\n\n\ndef softmax(x, block=None):\n"
                    "    return torch.softmax(x.double(), -1).to(x.dtype)\n")
    return path


@pytest.mark.parametrize("value", ["abc", "[1]", '{"block": 64}'])
def test_malformed_configs_from_the_command_line_are_one_line(value: str, tmp_path: Path) -> None:
    from flashcheck.targets.external import KernelLoadError, load_kernel

    target = f"{_kernel_file(tmp_path)}:softmax"
    for key in ("configs", "tunings"):
        with pytest.raises(KernelLoadError, match=f"capability '{key}'.*list") as e:
            load_kernel(target, "softmax", overrides={key: value})
        _one_line(str(e.value))
    assert load_kernel(target, "softmax", overrides={"configs": '[{"block": 64}]'}).configs == ({"block": 64},)


BAD_OPTIONS = {  # option -> a word of its one line
    "--hypothesis-profile=nosuch": "no such profile",
    "--kernel-cap=configs=abc": "not JSON",
    "--kernel-cap=tunings=[1]": "not a list of keyword dicts",
}


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=clean_env({"CI": "true", **env}),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("option", list(BAD_OPTIONS))
def test_a_bad_option_is_a_usage_error_not_internalerror(option: str, tmp_path: Path) -> None:
    """`flashcheck check`: exit 2; `pytest --kernel`: pytest's usage error (4), one line each."""
    _kernel_file(tmp_path)
    check = _run(["flashcheck.cli.main", "check", "k.py:softmax", "--family", "softmax", "-p", "no:xdist", option,
                  "-k", "two_equal"], tmp_path)
    assert check.returncode == exitcodes.USAGE, check.stdout[-3000:] + check.stderr[-3000:]
    assert BAD_OPTIONS[option] in _one_line(check.stdout + check.stderr)
    plain = _run(["pytest", "-p", "no:xdist", "--kernel", "k.py:softmax", "--family", "softmax", option, "--co"],
                 tmp_path)
    assert plain.returncode == 4, plain.stdout[-3000:] + plain.stderr[-3000:]
    assert BAD_OPTIONS[option] in _one_line(plain.stdout + plain.stderr)


@pytest.mark.slow
def test_interpreter_switched_off_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: TRITON_INTERPRET=0 is its normal mode")
    _kernel_file(tmp_path)
    p = _run(["flashcheck.cli.main", "check", "k.py:softmax", "--family", "softmax", "-k", "two_equal"], tmp_path,
             TRITON_INTERPRET="0")
    assert p.returncode == exitcodes.USAGE, p.stdout[-3000:] + p.stderr[-3000:]
    assert "no GPU" in _one_line(p.stdout + p.stderr)


@pytest.mark.slow
def test_a_sample_is_not_a_verdict_and_leaves_no_hypothesis_folder(tmp_path: Path) -> None:
    """FLASHCHECK_SAMPLE_TESTS exited 0 as if every test had passed; every run left .hypothesis/
    in the user's working folder."""
    _kernel_file(tmp_path)
    cache = tmp_path / "cache"
    p = _run(["pytest", "-p", "no:xdist", "--kernel", "k.py:softmax", "--family", "softmax", "--hypothesis-profile",
              "smoke", "-k", "fp32 and (benign or two_equal or n_is_one)"], tmp_path, FLASHCHECK_SAMPLE_TESTS="2",
             XDG_CACHE_HOME=str(cache))
    assert p.returncode == exitcodes.NOTHING_CHECKED, p.stdout[-3000:] + p.stderr[-3000:]
    assert "a sample of 2 of the 4 selected tests ran: not a verdict" in p.stdout, p.stdout[-3000:]
    assert not (tmp_path / ".hypothesis").exists() and (cache / "flashcheck" / "hypothesis").is_dir()


# ---- a user's project layout ---------------------------------------------------------------------------

SOFTMAX_PACKAGE = {
    "__init__.py": "",
    "my_softmax.py": "import torch\n\n\ndef softmax(x):\n    return torch.softmax(x.double(), -1).to(x.dtype)\n",
    "wrap.py": "from kernels.my_softmax import softmax as _inner\n\n\ndef softmax(x):\n    return _inner(x)\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("layout,target", [("flat", "kernels.my_softmax:softmax"), ("src", "kernels.wrap:softmax")])
def test_a_user_package_named_kernels_is_checked(layout: str, target: str, tmp_path: Path) -> None:
    """flashcheck's own folders (kernels/, tests/, ...) once shadowed a user's: the checkout root went
    first on the child's path (pytest's prepend import of the suite, and the CLI's PYTHONPATH)."""
    root = tmp_path / "src" if layout == "src" else tmp_path
    for name, text in SOFTMAX_PACKAGE.items():
        (root / "kernels").mkdir(parents=True, exist_ok=True)
        (root / "kernels" / name).write_text(text)
    env = clean_env()
    try:  # as a user has it: flashcheck installed, the checkout nowhere on the path
        importlib.metadata.distribution("flashcheck")
        env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep)[1:] if p)
    except importlib.metadata.PackageNotFoundError:
        pass  # run from a checkout: it must be on the path
    if layout == "src":
        env["PYTHONPATH"] = os.pathsep.join(p for p in ("src", env.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, "-m", "flashcheck.cli.main", "check", target, "--family", "softmax", "-p",
                        "no:xdist", "-q", "-k", "test_special_values and fp32-two_equal"], cwd=tmp_path,
                       env={**env, "CI": "true"}, capture_output=True, text=True, timeout=300)
    assert p.returncode == exitcodes.OK and "1 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


@pytest.mark.slow
def test_a_suite_plugin_option_with_its_value_apart_is_not_a_test_path(tmp_path: Path) -> None:
    """`pytest --kernel K --quick-first 3`: the 3 was taken for a test path, the suite never became the
    run, and --quick-first was an unrecognized argument."""
    _kernel_file(tmp_path)
    p = _run(["pytest", "-p", "no:xdist", "--kernel", "k.py:softmax", "--family", "softmax", "--quick-first", "3",
              "--co", "-q"], tmp_path)
    assert p.returncode == 0 and "tests collected" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


def test_a_huge_declared_max_n_is_not_allocated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kernel-max-n 1099511627776`: the check that a longer row is refused allocated that row."""
    from flashcheck.targets.external import load_kernel
    from flashcheck.suite import test_softmax

    spec = load_kernel(f"{_kernel_file(tmp_path)}:softmax", "softmax",
                       overrides={"max_n": 2**40, "validates_input": True})

    def refuse(*size, **kw):
        raise AssertionError(f"allocated {size}")

    monkeypatch.setattr(torch, "zeros", refuse)
    with pytest.raises(pytest.skip.Exception, match="not allocated"):
        test_softmax.test_row_too_long_raises(spec)
