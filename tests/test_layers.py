"""The layer order (issue 22): oracles <- kernels <- strategies <- engine <- reports/CLI, and no
product code importing the test tree (`tests/`, the self-tests). The shipped suite
(`flashcheck/suite/`: family suites, regressions, the zoo) is product code at the engine's layer. Imports are read from the source (AST), including those
inside functions. The violations still standing are listed by name: a new one fails, and so does
fixing one without taking it off the list (a ratchet, never a blanket allowance)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"oracles": 0, "kernels": 1, "strategies": 2, "flashcheck": 3, "reports": 4}
TOP = {"cli": 4}  # flashcheck/cli.py is the command line: the reports' layer

# (importing file, imported layer or module): still to be undone, each with why it stands.
STANDING: set[tuple[str, str]] = set()


def _layer_of(path: Path, root: Path) -> tuple[str, int]:
    rel = path.relative_to(root)
    top = rel.parts[0]
    if top == "flashcheck" and path.stem in TOP:
        return top, TOP[path.stem]
    return top, LAYERS[top]


def _imported(path: Path) -> set[str]:
    """Top-level package names (oracles, kernels, ..., tests) of every import in path."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level and node.module is None:
            continue
        for m in mods:
            parts = m.split(".")
            if parts[0] == "flashcheck" and len(parts) > 1 and parts[1] in LAYERS | {"tests": 9}:
                names.add(parts[1])
            elif parts[0] == "flashcheck" and len(parts) > 1:
                names.add("flashcheck")
            elif parts[0] in ("tests", "reports", "kernels", "oracles", "strategies"):
                names.add(parts[0])
    return names


def _violations(root: Path = ROOT) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(p for top in LAYERS for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts):
        _, level = _layer_of(path, root)
        for name in _imported(path):
            if name == "tests" or (name in LAYERS and LAYERS[name] > level):
                found.add((str(path.relative_to(root)), name))
    return found


def test_arrows_point_one_way() -> None:
    found = _violations()
    assert not found - STANDING, f"imports against the layer order: {sorted(found - STANDING)}"
    assert not STANDING - found, f"fixed: take these off STANDING: {sorted(STANDING - found)}"


def test_the_check_sees_upward_and_test_tree_imports(tmp_path: Path) -> None:
    for top, text in (("oracles", "def f():\n    from flashcheck.reports.stability.attention import blocking\n"),
                      ("strategies", "import flashcheck.kernels\nfrom flashcheck.tests.zoo import ZOO\n"),
                      ("flashcheck", "from flashcheck import oracles, strategies\n"),
                      ("reports", "from flashcheck.properties_attention import blocking\n")):
        (tmp_path / top).mkdir()
        (tmp_path / top / "m.py").write_text(text)
    # the shipped suite is at the engine's layer: it may not import reports/, reports/ may import it
    (tmp_path / "flashcheck" / "suite").mkdir()
    (tmp_path / "flashcheck" / "suite" / "m.py").write_text("from flashcheck.reports.stability.attention import sdpa_output\n")
    (tmp_path / "reports" / "z.py").write_text("from flashcheck.suite.zoo import zoo\n")
    assert _violations(tmp_path) == {("oracles/m.py", "reports"), ("strategies/m.py", "tests"),
                                     ("flashcheck/suite/m.py", "reports")}


def test_kernels_run_plain_until_the_engine_attaches_its_hooks() -> None:
    """The kernels load no engine module; the engine's entry points add the interpreter patch and
    the GPU-fault guard (flashcheck.kernel_hooks) before a kernel runs."""
    import subprocess
    import sys

    script = (
        "import sys, flashcheck.kernels as K\n"
        "engine = sorted(m for m in sys.modules if m.startswith('flashcheck.') and m.split('.')[1] not in "
        "('kernels', 'oracles'))\n"
        "assert not engine, engine\n"
        "assert not K.registry._CALL_HOOK\n"
        "import flashcheck.properties\n"
        "from flashcheck import faults, interpreter\n"
        "assert K.registry._CALL_HOOK == [faults.guarded_call]\n"
        "assert interpreter.installed() == K.INTERPRET\n"
        "calls = faults.CALLS[0]\n"
        "import torch\n"
        "K.get('softmax_row').fn(torch.zeros(1, 4, device=K.DEVICE))\n"
        "assert faults.CALLS[0] == calls + 1, 'a registered kernel call goes through the guard'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unrelated_pytest_run_loads_no_torch(tmp_path: Path) -> None:
    """The plugin is loaded by every pytest where flashcheck is installed (entry point pytest11):
    a run of someone else's tests imports neither torch nor the kernels for it (it used to attach
    the kernels' hooks at configure time: 7 s instead of 0.7 s for one empty test on a 2-core CPU)."""
    import subprocess
    import sys

    from flashcheck.selftest import clean_env

    env = clean_env()  # an author's shell: no supervision or settings inherited from this run
    (tmp_path / "test_other.py").write_text(
        "import sys\n\n\ndef test_other():\n"
        "    heavy = sorted(m for m in ('torch', 'triton', 'flashcheck.kernels') if m in sys.modules)\n"
        "    assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_other.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "flashcheck" in subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=tmp_path, env=env,
                                          capture_output=True, text=True, timeout=300).stdout
