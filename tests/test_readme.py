"""Every command the README shows is run by CI as written (issue 18.7): the README cannot drift
from the code. Each command is listed in HOW with the one way CI runs it:

- "run here": this test runs it with bash, word for word, in the checkout or in a scratch kernel
  author's repository holding the files it names; the long suite commands are shortened by one
  environment variable, `FLASHCHECK_SAMPLE_TESTS` (a sample of the tests they select), never edited;
- a test node id: that test runs it as written (its docstring says so);
- ".ci/run": CI's own script is that command.

A command added to the README without a line here fails `test_every_readme_command_is_run`, and so
does a line here whose command left the README.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashcheck import HOME
from flashcheck.plugin import SAMPLE_ENV
from flashcheck.plugin.selftest import clean_env

README = HOME / "README.md"
CI_SCRIPT = HOME / ".ci" / "run"
pytestmark = pytest.mark.skipif(not README.is_file(), reason="needs flashcheck's source checkout (README.md)")

RUN, AUTHOR = "run here", "run here, in a kernel author's repository"
HOW = {
    "pip install -c constraints-cpu.txt -e . && python -m flashcheck.reports":
        "tests/test_report.py::test_readme_first_command_as_written",
    "pip install -c constraints-cpu.txt -e . && pytest -n auto": ".ci/run",
    'pytest -n auto --hypothesis-profile smoke -m "not slow"': RUN,
    'pytest -n auto -m "softmax and not slow"': RUN,
    "pytest -n auto --hypothesis-profile gpu -m gpu_only": RUN,
    "pip install /path/to/flashcheck": "tests/test_install.py::test_one_top_level_name",
    "flashcheck check kernels/my_softmax.py:softmax --family softmax -n auto": AUTHOR,
    "flashcheck check my_pkg.attention:flash_fwd --family attention -n auto": AUTHOR,
    "flashcheck check kernels/my_ce.py:cross_entropy --family cross_entropy -n auto": AUTHOR,
    "flashcheck check examples/cute_online_softmax.py:softmax --family softmax -n 16":
        "tests/test_examples.py::test_cute_example_passes_and_its_seed_version_is_caught",
    "flashcheck check examples/cute_online_softmax.py:seed_softmax --family softmax -n 16":
        "tests/test_examples.py::test_cute_example_passes_and_its_seed_version_is_caught",
}
SAMPLE = "3"  # tests kept of a suite command's selection

# The author's repository the README's `flashcheck check` lines assume: correct kernels, in float64.
AUTHOR_FILES = {
    "kernels/my_softmax.py": '''
        import torch


        def softmax(x):
            return torch.softmax(x.double(), dim=-1).to(x.dtype)
    ''',
    "kernels/my_ce.py": '''
        import torch
        import torch.nn.functional as F


        def cross_entropy(logits, target, *, ignore_index=-100, reduction="mean", weight=None, label_smoothing=0.0):
            ignored = target == ignore_index  # an ignored row's garbage kept out of torch's backward
            x = torch.where(ignored[:, None], torch.zeros((), dtype=torch.float64), logits.double())
            w = None if weight is None else weight.double()
            return F.cross_entropy(x, target, weight=w, ignore_index=ignore_index, reduction=reduction,
                                   label_smoothing=label_smoothing).to(logits.dtype)
    ''',
    "my_pkg/__init__.py": "",
    "my_pkg/attention.py": '''
        import torch


        def flash_fwd(q, k, v, *, causal=False, scale=None):
            g = q.shape[1] // k.shape[1]  # grouped heads: each k/v head serves g query heads
            k, v = k.double().repeat_interleave(g, dim=1), v.double().repeat_interleave(g, dim=1)
            s = (q.double() @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
            if causal:
                m, n = s.shape[-2:]
                s = s.masked_fill(torch.ones(m, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
            return (torch.softmax(s, dim=-1) @ v).to(q.dtype)
    ''',
}


def readme_commands() -> list[str]:
    """The commands of the README's bash blocks, comments cut."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            if cmd:
                out.append(cmd)
    return out


def test_every_readme_command_is_run() -> None:
    shown = set(readme_commands())
    assert not shown - set(HOW), f"README commands CI does not run (add each to HOW): {sorted(shown - set(HOW))}"
    assert not set(HOW) - shown, f"HOW lists commands the README no longer shows: {sorted(set(HOW) - shown)}"
    script = CI_SCRIPT.read_text()
    for cmd, how in HOW.items():
        if how == ".ci/run":  # the same install and test command, in CI's own script
            assert "-c constraints-cpu.txt -e ." in script and "pytest -n auto" in script, script
        elif "::" in how:
            path, name = how.split("::")
            assert re.search(rf"^def {re.escape(name)}\(", (HOME / path).read_text(), re.M), f"{how} is gone ({cmd})"


def _expected_status(cmd: str) -> int:
    shown = next(line for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
                 for line in block.splitlines() if line.strip().startswith(cmd))
    m = re.search(r"#\s*exit (\d+)", shown)
    return int(m.group(1)) if m else 0


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c, how in HOW.items() if how in (RUN, AUTHOR)])
def test_readme_command_as_written(cmd: str, tmp_path: Path) -> None:
    bindir = str(Path(sys.executable).parent)  # this Python's flashcheck and pytest, not another's
    env = clean_env({"CI": "true", "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")])})
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The outer run's workers already hold the cores: `-n auto` in a command would start as many
        # again, each importing torch (on 2 cores, 3 more per command). One worker keeps it a
        # distributed run (controller and worker); the count is the environment's, not the
        # command's, which stays as written. The five commands with -n 3 outside: 172 CPU-s with
        # two workers each, 144 with one (this CPU, fourteenth session).
        env["PYTEST_XDIST_AUTO_NUM_WORKERS"] = "1"
    cwd = HOME
    if HOW[cmd] == AUTHOR:
        for rel, text in AUTHOR_FILES.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(textwrap.dedent(text))
        cwd = tmp_path
    else:
        env[SAMPLE_ENV] = SAMPLE
    assert shutil.which(cmd.split()[0], path=env["PATH"]), f"{cmd.split()[0]} is not installed beside {sys.executable}"
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                       check=False)
    expected = _expected_status(cmd)
    if SAMPLE_ENV in env and expected == 0:
        expected = 5  # a passing sample is not a verdict (flashcheck.exitcodes.NOTHING_CHECKED)
    assert p.returncode == expected, f"{cmd}\nexit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
