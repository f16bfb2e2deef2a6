"""The stability report judges honestly: known-bad and all-NaN kernels FAIL (summary, colours,
exit status), a planted rounding bias is detected, bad targets and empty runs are refused."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from flashcheck.targets.external import load_kernel
from flashcheck.reports.stability import plots
from flashcheck.reports.stability.cli import main
from flashcheck.reports.stability.run import collect

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "flashcheck" / "suite" / "zoo" / "softmax_bugs.py"

# Small and fast: one dtype, two classes, two inputs each (a few seconds under the interpreter).
FAST = ["--family", "softmax", "--examples", "2", "--dtypes", "fp16", "--no-baselines", "--quiet"]

KERNELS = '''
import torch


def all_nan(x):
    return torch.full_like(x, float("nan"))


def half_up(x):
    """torch.softmax, then one ULP up on every other output: a planted +0.5 ULP bias."""
    y = torch.softmax(x, dim=-1)
    bits = y.view(torch.int16).clone()
    up = torch.zeros_like(bits, dtype=torch.bool)
    up[:, ::2] = True
    up &= torch.isfinite(y) & (bits >= 0)  # +1 in the bits is +1 ULP for a value >= +0
    return torch.where(up, bits + 1, bits).view(torch.float16)


def too_long(x):
    return torch.softmax(x, dim=-1)


too_long.flashcheck = {"min_n": 10**6}
'''


@pytest.fixture
def kernels_file(tmp_path: Path) -> Path:
    p = tmp_path / "report_kernels.py"
    p.write_text(textwrap.dedent(KERNELS))
    return p


def _report(out: Path) -> tuple[dict, str]:
    return json.loads((out / "stability.json").read_text()), (out / "stability.md").read_text()


def _assert_fails_everywhere(out: Path, kernel: str) -> None:
    data, md = _report(out)
    (v,) = [v for v in data["verdicts"] if v["kernel"] == kernel]
    assert v["status"] == "FAIL"
    verdict_lines = md.split("## Verdict", 1)[1].split("\n\n", 2)[1]
    assert verdict_lines.startswith(f"- **FAIL** [{kernel}](#kernel-"), verdict_lines
    # The heat map colours every failing cell with the failure colour, none with a passing one.
    rows = [{**r, "max_bound_ratio": float(r["max_bound_ratio"])} for r in data["rows"]]
    keys, classes, cells = plots.heat_grid(rows, "softmax")
    failing = [(r, c) for (r, c) in cells.values() if r and r["kernel"] == kernel and r["status"] == "FAIL"]
    assert failing
    for r, colour in failing:
        assert plots.is_failure_colour(colour), (r["strategy"], colour)
    for r, colour in cells.values():
        if r and r["status"] == "PASS":
            assert not plots.is_failure_colour(colour), (r["kernel"], r["strategy"], colour)
    assert (out / "stability.html").read_text().count('class="fail"') > 0


def test_known_bad_zoo_kernel_fails(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    target = f"{ZOO}:no_max_subtraction"
    assert main([target, *FAST, "--classes", "huge_magnitude,benign", "--out", str(out), "--no-plots"]) == 1
    _assert_fails_everywhere(out, "softmax_bugs.no_max_subtraction")
    assert main([target, *FAST, "--classes", "huge_magnitude", "--out", str(out), "--no-plots", "--no-fail"]) == 0


def test_all_nan_kernel_fails_never_zero(tmp_path: Path, kernels_file: Path) -> None:
    out = tmp_path / "rep"
    assert main([f"{kernels_file}:all_nan", *FAST, "--classes", "benign,ties", "--out", str(out)]) == 1
    _assert_fails_everywhere(out, "report_kernels.all_nan")
    data, _ = _report(out)
    for r in data["rows"]:
        assert r["max_bound_ratio"] == "inf" and r["mismatch"] == r["outputs"] > 0
        assert plots.cell_text({**r, "max_bound_ratio": float("inf")}).startswith("NaN/inf")
    assert (out / "stability_softmax_heatmap.png").stat().st_size > 0


def test_planted_bias_detected_torch_unbiased(kernels_file: Path) -> None:
    spec = load_kernel(f"{kernels_file}:half_up", "softmax", overrides={"dtypes": "fp16"})
    res = collect([spec], examples=4, dtypes=["fp16"], classes=["benign"], progress=False)
    (ours,) = [r for r in res.rows if r["kernel"] == spec.name]
    (torch_row,) = [r for r in res.rows if r["kernel"] == "torch.softmax"]
    s = ours["signed_ulp"]
    assert 0.4 < s["mean"] < 0.6 and s["lo"] > 0, s
    t = torch_row["signed_ulp"]
    assert t["lo"] <= 0 <= t["hi"] and abs(t["mean"]) < 0.05, t


def test_unknown_kernel_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["nosuch", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nosuch" in err, err
    assert not (tmp_path / "rep").exists()


def test_existing_report_not_overwritten_by_empty_run(tmp_path: Path, kernels_file: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "rep"
    out.mkdir()
    (out / "stability.md").write_text("the five-minute report")
    assert main([f"{kernels_file}:too_long", *FAST, "--examples", "1", "--classes", "benign", "--out", str(out)]) == 5
    assert (out / "stability.md").read_text() == "the five-minute report"
    assert "nothing was checked" in capsys.readouterr().err


def test_default_output_is_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["softmax_row", *FAST, "--examples", "1", "--classes", "ties", "--no-plots"]) == 0
    assert (tmp_path / "flashcheck-report" / "stability.html").is_file()


def test_compare_and_budget(tmp_path: Path, kernels_file: Path) -> None:
    out = tmp_path / "rep"
    args = ["--compare", f"{kernels_file}:all_nan", "softmax_row", *FAST, "--classes", "nan_inf,ties", "--out", str(out),
            "--no-plots", "--budget", "0.001"]
    assert main(args) == 1
    data, md = _report(out)
    assert "## report_kernels.all_nan vs softmax_row" in md
    assert data["environment"]["budget_hit"] and data["environment"]["inputs_done"] == 2  # one per class
    assert {v["kernel"]: v["status"] for v in data["verdicts"]} == {"report_kernels.all_nan": "FAIL",
                                                                     "softmax_row": "PASS"}


def _readme_report_command() -> str:
    """The README's first command, after its install step (CI installs the same way)."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "python -m flashcheck.reports" in line:
            return line.split("#", 1)[0].split("&&")[-1].strip()
    raise AssertionError("README.md no longer shows `python -m flashcheck.reports`")


@pytest.mark.slow
def test_readme_first_command_as_written(tmp_path: Path) -> None:
    """`python -m flashcheck.reports` with no flags, every family, kernel, dtype and class (varlen
    included), shortened only by FLASHCHECK_REPORT_EXAMPLES/BUDGET: it broke unseen once."""
    import os
    import shlex
    import subprocess
    import sys

    cmd = _readme_report_command()
    assert shlex.split(cmd) == ["python", "-m", "flashcheck.reports"], cmd
    env = dict(os.environ, FLASHCHECK_REPORT_EXAMPLES="2")
    res = subprocess.run([sys.executable, *shlex.split(cmd)[1:]], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data, md = _report(tmp_path / "flashcheck-report")
    measured = {(r["family"], r["strategy"]) for r in data["rows"] if r["outputs"]}
    for family, cls in (("attention", "varlen_batches"), ("softmax", "benign")):
        assert (family, cls) in measured, f"{family} {cls} measured by no kernel"
    assert not [r for r in data["rows"] if r["errors"] and not r["baseline"]], md[-2000:]


def test_error_profiles_leave_allowed_flushes_out() -> None:
    """A flushed tiny output is millions of ULPs from its subnormal value but within the contract
    (NUMERICS.md 3.4): the profiles plot it against a bound without the flush allowance, so it
    must stay out of them, as it stays out of err/bound; the counts keep it."""
    import numpy as np

    from flashcheck.reports.stability._stats import Accumulator, Measurement

    z = np.zeros((1, 3))
    flushed = np.array([[False, True, False]])
    m = Measurement(dist=np.array([[0.0, 2e6, 1.0]]), ratio=z, violation=np.zeros((1, 3), bool),
                    mismatch=np.zeros((1, 3), bool), ftz=flushed, wide=np.zeros((1, 3), bool),
                    signed_ulp=z, signed_rel=z, y=np.array([[0.0, 2e6, 1.0]]), ybound=np.ones((1, 3)),
                    features={k: np.array([[1.0, 1.0, 1.0]]) for k in ("n", "cond")})
    acc = Accumulator()
    acc.add(m)
    assert acc.ftz == 1
    for k in ("n", "cond"):
        p = acc.profiles[k].summary()
        assert sum(p["count"]) == 2 and max(p["max"]) == 1.0, (k, p)


def test_profile_scale_clips_only_bound_spikes() -> None:
    """A profile's scale follows its errors and typical bounds: a subnormal output's bound of 1e31
    ULPs is clipped (it squeezed every error onto the axis), a bound a few times the others is not."""
    err = np.array([0.0, 20.0, 60.0, np.inf])
    assert plots._bound_cap(err, np.array([50.0, 100.0, 1e31, 300.0]), "ULP") == 6000.0
    assert plots._bound_cap(np.array([0.02]), np.array([1.0, 1.0, 5.0]), "x bound") == 10.0
    assert plots._bound_cap(np.zeros(3), np.array([1.0, 1e31, 1.0]), "ULP") == 10.0
