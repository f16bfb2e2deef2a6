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
from flashcheck.fixtures.store import SAVE_ENV, fixture_key, fixture_payload, load_fixture
from flashcheck.strategies.case import Case

from flashcheck import HOME as ROOT
from flashcheck.plugin.selftest import run_pytest

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
    run = _pytest("flashcheck/suite/test_softmax.py", "-k", "test_adversarial_class and benign and fp32",
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
    run = _pytest("flashcheck/suite/test_regressions.py", "--kernel", f"{tmp}/broken.py:broken_tail",
                  "--family", "softmax", "--fixture-dir", str(fixtures))
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.slow
def test_self_tests_pass_under_no_save_fixtures() -> None:
    """The outer run's --no-save-fixtures (as a flag, in PYTEST_ADDOPTS and as the environment
    variable) must not reach the runs these self-tests start: they save fixtures on purpose. The
    test that asserts the saved fixture is enough (its replay twin only adds a process)."""
    run = run_pytest("tests/test_fixtures.py", "-k", "minimal_fixture", "--no-save-fixtures",
                     env={"PYTEST_ADDOPTS": "--no-save-fixtures", SAVE_ENV: "0"}, timeout=900)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.slow
def test_saving_can_be_switched_off(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BROKEN)
    fixtures = tmp_path / "fixtures"
    run = _pytest("flashcheck/suite/test_softmax.py", "-k", "test_adversarial_class and benign and fp32",
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


# ---- fixtures are data (issue 18.2) ---------------------------------------------------------------------

from flashcheck.fixtures import store as fx  # noqa: E402
from flashcheck.cli.main import main as cli  # noqa: E402
from flashcheck.targets.external import load_kernel  # noqa: E402
from flashcheck.kernels.registry import get as registered  # noqa: E402

CORRECT = "import torch\n\ndef soft(x):\n    return torch.softmax(x.float(), dim=-1).to(x.dtype)\n"


def _case(n: int = 3) -> Case:
    return Case(tensors={"x": torch.linspace(-1, 1, n).reshape(1, n)}, label="t")


def _write(path: Path, spec, prop: str = "matches_oracle", case: Case | None = None, **edit) -> Path:
    payload = fixture_payload(spec, prop, case or _case(), AssertionError("recorded"))
    payload.update(edit)
    path.write_text(json.dumps(payload))
    return path


def _evil(tmp: Path) -> tuple[str, Path]:
    """A kernel file whose import leaves a marker: nothing may import it because a fixture says so."""
    marker = tmp / "imported"
    (tmp / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n{CORRECT}")
    return f"{tmp}/evil.py:soft", marker


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> dict:
    """This process's fixture settings, restored afterwards (`flashcheck replay` in-process switches
    saving off), environment cleared of overrides."""
    for k in list(fx._SETTINGS):
        monkeypatch.setitem(fx._SETTINGS, k, None)
    for env in (fx.DIR_ENV, fx.SAVE_ENV, fx.SUITE_ENV, "FLASHCHECK_MUTANT"):
        monkeypatch.delenv(env, raising=False)
    return fx._SETTINGS


def test_no_fixture_field_is_imported(tmp_path: Path, capfd: pytest.CaptureFixture, settings: dict) -> None:
    target, marker = _evil(tmp_path)
    folder = tmp_path / "fixtures"
    folder.mkdir()
    # Every field that once chose the kernel: a registered kernel's name, a target, an identity.
    _write(folder / "a.json", registered("softmax"), target=target, identity=f"file:{tmp_path}/evil.py:soft")
    _write(folder / "b.json", registered("softmax"), target="this:x", kernel="this.x", identity=None, format=1)
    for argv in (["replay", str(folder)], ["replay", str(folder / "a.json")],
                 ["replay", str(folder), "--kernel", "softmax_row"]):
        cli(argv)
    out = capfd.readouterr().out
    assert not marker.exists(), "replay imported a file a fixture named"
    assert "Beautiful is better" not in out, "replay imported the module a fixture named"
    assert "not for this kernel" in out and "--kernel TARGET" in out, out


def test_same_stem_in_two_folders_is_two_kernels(tmp_path: Path) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "k.py").write_text(CORRECT)
    a, b = (load_kernel(f"{tmp_path}/{d}/k.py:soft", "softmax") for d in ("a", "b"))
    assert a.name == b.name and fx.kernel_identity(a) != fx.kernel_identity(b)
    folder = tmp_path / "fixtures"
    paths = [fx.save_fixture(s, "matches_oracle", _case(), AssertionError("x"), folder) for s in (a, b)]
    assert paths[0] != paths[1], "one file for two kernels"
    plan = fx.plan_replays(paths, [b])
    assert [r.status for r in plan] == ["skip", "run"] and plan[1].spec is b, plan
    assert "not for this kernel" in plan[0].reason


def test_identity_is_project_relative(tmp_path: Path) -> None:
    """Stable across clones (a committed fixture replays in CI) and across edits of the kernel."""
    ids = []
    for clone in ("one", "two"):
        (tmp_path / clone / "src").mkdir(parents=True)
        (tmp_path / clone / "pyproject.toml").write_text("")
        (tmp_path / clone / "src" / "k.py").write_text(CORRECT + f"# {clone}\n")
        ids.append(fx.kernel_identity(load_kernel(f"{tmp_path}/{clone}/src/k.py:soft", "softmax")))
    assert ids == ["file:src/k.py:soft"] * 2
    assert fx.kernel_identity(registered("softmax")) == "registered:softmax"


def test_temporary_files_are_never_collected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _write(tmp_path / "k__p__1.json", registered("softmax"))
    (tmp_path / ".tmp-abc.json").write_text("{")
    assert fx.fixture_paths(tmp_path) == [good]

    def boom(*a, **k):
        raise OSError("disk full")

    from flashcheck import atomic

    monkeypatch.setattr(atomic.os, "replace", boom)  # the temporary file exists by then
    with pytest.raises(OSError, match="disk full"):
        fx.save_fixture(registered("softmax"), "matches_oracle", _case(), AssertionError("x"), tmp_path / "w")
    assert not list((tmp_path / "w").iterdir()), "a failed write left its temporary file"


def _bad(payload: dict, **edit) -> dict:
    out = json.loads(json.dumps(payload))
    for key, value in edit.items():
        node, *path = key.split("__")
        target = out
        for p in [node, *path][:-1]:
            target = target[p]
        target[[node, *path][-1]] = value
    return out


BAD = {  # name -> (edit of a good payload, or raw text) and a word of the expected reason
    "not json": ("{", "unreadable"),
    "a list": ("[]", "not an object"),
    "tensors a list": ({"tensors": []}, "tensors"),
    "kwargs a list": ({"kwargs": []}, "kwargs"),
    "tensor a list": ({"tensors__x": []}, "not an object"),
    "too wide word": ({"tensors__x__bits": ["1ffffffff 0 0"]}, "hex word"),
    "not hex": ({"tensors__x__bits": ["zz 0 0"]}, "hex word"),
    "huge storage": ({"tensors__x__storage_words": 10 ** 12}, "implausibly large"),
    "past storage": ({"tensors__x__shape": [1, 9]}, "reach past"),
    "bool in shape": ({"tensors__x__shape": [True, 3]}, "integer"),
    "negative stride": ({"tensors__x__stride": [3, -1]}, "integer"),
    "unknown dtype": ({"tensors__x__dtype": "complex64"}, "dtype"),
    "bad dtype kwarg": ({"kwargs": {"out_dtype": {"dtype": "nope"}}}, "dtype"),
    "unknown family": ({"family": "conv"}, "family"),
    "unknown property": ({"property": "nope"}, "unknown softmax property"),
    "unknown format": ({"format": 9}, "format"),
    "stale kernel": ({"identity": "registered:gone", "kernel": "gone"}, "not registered"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_fixture_is_its_own_error_and_the_rest_replay(name: str, tmp_path: Path, capfd: pytest.CaptureFixture,
                                                         settings: dict) -> None:
    edit, word = BAD[name]
    good = _write(tmp_path / "good.json", registered("softmax_row"))
    payload = json.loads(good.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(edit if isinstance(edit, str) else json.dumps(_bad(payload, **edit)))
    rc = cli(["replay", str(tmp_path)])
    out = capfd.readouterr().out
    assert rc == 2, out  # bad input (exitcodes.USAGE), never the kernel's failure
    line = next(ln for ln in out.splitlines() if "bad.json" in ln)
    assert line.startswith(f"ERROR bad fixture {bad}:") and word in line, out
    assert f"pass {good}" in out and "1 passed, 0 failed, 1 bad fixtures" in out, out
    assert "Traceback" not in out


@pytest.mark.slow
def test_bad_fixture_under_pytest_is_labelled(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json", registered("softmax_row"))
    (tmp_path / "bad.json").write_text(json.dumps(_bad(json.loads(good.read_text()), tensors__x__bits=["1ffff"])))
    run = _pytest("flashcheck/suite/test_regressions.py", "--family", "softmax", "--fixture-dir", str(tmp_path),
                  "-p", "no:randomly")
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "1 failed, " in out and "bad fixture" in out, out[-3000:]
    assert "good.json" not in out.split("short test summary")[-1], out[-3000:]


def test_unwritable_fixture_dir_keeps_the_failure(tmp_path: Path, settings: dict) -> None:
    from hypothesis import given, settings as hsettings, strategies as st

    from flashcheck.properties.runner import check
    from flashcheck.kernels.registry import KernelSpec

    (tmp_path / "file").write_text("")
    fx.configure(save=True, directory=tmp_path / "file" / "sub")
    ns: dict = {}
    exec(BROKEN, ns)
    spec = KernelSpec(name="broken", family="softmax", fn=ns["broken_tail"])

    @hsettings(max_examples=5, database=None, deadline=None)
    @given(st.integers(2, 4))
    def run(n: int) -> None:
        check(spec, "matches_oracle", Case(tensors={"x": torch.ones(1, n)}))

    with pytest.raises(AssertionError) as info:
        run()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "no fixture written" in notes and "file" in notes, notes


def test_unwritable_fixture_dir_is_one_line_up_front(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    (tmp_path / "k.py").write_text(CORRECT)
    (tmp_path / "file").write_text("")
    rc = cli(["check", f"{tmp_path}/k.py:soft", "--family", "softmax", "--fixture-dir", str(tmp_path / "file" / "d")])
    err = capfd.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "is not a folder" in err, err


def test_only_the_suite_writes_into_its_regressions(tmp_path: Path, settings: dict,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert fx.fixture_dir() == tmp_path / "flashcheck-regressions"  # no opt-in: never the package's
    fx.configure(suite=True)
    assert fx.fixture_dir() == fx.DEFAULT_FIXTURE_DIR
    d = fx.DEFAULT_FIXTURE_DIR
    assert fx.write_refusal("registered:softmax", d) is None
    assert "registered kernels only" in fx.write_refusal("file:k.py:soft", d)
    assert fx.write_refusal("unregistered:x", tmp_path) is None and fx.write_refusal("unregistered:x", d)
    monkeypatch.setenv(fx.SUITE_ENV, "0")  # what every tooling subprocess gets
    assert fx.fixture_dir() == tmp_path / "flashcheck-regressions" and fx.write_refusal("registered:softmax", d)
    monkeypatch.setenv(fx.SUITE_ENV, "1")
    monkeypatch.setenv("FLASHCHECK_MUTANT", "/tmp/m.json")  # a mutant is broken on purpose
    assert fx.write_refusal("registered:softmax", d)
    from flashcheck.plugin.selftest import clean_env

    assert clean_env()[fx.SUITE_ENV] == "0"


def test_a_real_failure_of_ours_still_leaves_a_fixture(tmp_path: Path, settings: dict,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's own run (opted in) writes a registered kernel's shrunk failure to commit."""
    import dataclasses

    from hypothesis import given, settings as hsettings, strategies as st

    from flashcheck.properties.runner import check

    monkeypatch.setattr(fx, "DEFAULT_FIXTURE_DIR", tmp_path / "regressions")
    fx.configure(suite=True)
    ns: dict = {}
    exec(BROKEN, ns)
    spec = dataclasses.replace(registered("softmax"), fn=ns["broken_tail"])

    @hsettings(max_examples=5, database=None, deadline=None)
    @given(st.integers(2, 4))
    def run(n: int) -> None:
        check(spec, "matches_oracle", Case(tensors={"x": torch.ones(1, n)}))

    with pytest.raises(AssertionError):
        run()
    files = list((tmp_path / "regressions").glob("softmax__matches_oracle__*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["identity"] == "registered:softmax"


def test_tooling_runs_get_a_temporary_fixture_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.plugin import killrun

    seen = {}

    def fake(cmd, **kw):
        seen.update(cmd=cmd, env=kw["env"])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(killrun.subprocess, "run", fake)
    # The subprocess path, whose command this fake sees; a forked run (flashcheck.isolation.zygote) gets the same
    # arguments, and would run the whole file for real here.
    monkeypatch.setenv("FLASHCHECK_NO_ZYGOTE", "1")
    killrun.run_pytest(["flashcheck/suite/test_softmax.py"])
    dirs = [a for a in seen["cmd"] if a.startswith("--fixture-dir=")]
    assert len(dirs) == 1 and not fx.is_suite_dir(Path(dirs[0].split("=", 1)[1])), seen["cmd"]
    assert seen["env"][fx.SUITE_ENV] == "0"


def test_committed_fixtures_are_real_findings_of_registered_kernels() -> None:
    from flashcheck.kernels.registry import PRODUCTION

    names = {f"registered:{s.name}" for s in PRODUCTION}
    for path in fx.fixture_paths(fx.DEFAULT_FIXTURE_DIR):
        payload = fx.read_fixture(path)
        assert fx.payload_identity(payload) in names, path
        # A property's verdict, not a crash of a broken tool (mutation runs once left 41 KeyErrors).
        assert payload["message"].startswith(("AssertionError", "OutOfBoundsAccess")), (path, payload["message"][:200])
