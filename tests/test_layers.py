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
TOP = {"cli": 4}  # flashcheck/cli/ is the command line: the reports' layer

# (importing file, imported layer or module): still to be undone, each with why it stands.
STANDING: set[tuple[str, str]] = set()


def _layer_of(path: Path, root: Path) -> tuple[str, int]:
    rel = path.relative_to(root)
    top = rel.parts[0]
    if top == "flashcheck" and len(rel.parts) > 2 and rel.parts[1] in TOP:
        return top, TOP[rel.parts[1]]
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
                      ("reports", "from flashcheck.properties.attention import blocking\n")):
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
    the GPU-fault guard (flashcheck.isolation.hooks) before a kernel runs."""
    import subprocess
    import sys

    script = (
        "import sys, flashcheck.kernels as K\n"
        "engine = sorted(m for m in sys.modules if m.startswith('flashcheck.') and m.split('.')[1] not in "
        "('kernels', 'oracles'))\n"
        "assert not engine, engine\n"
        "assert not K.registry._CALL_HOOK\n"
        "import flashcheck.properties.runner\n"
        "from flashcheck.isolation import faults\nfrom flashcheck.interpreter import exact as interpreter\n"
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

    from flashcheck.plugin.selftest import clean_env

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


# ---- inside the engine ---------------------------------------------------------------------------

#: The engine's rooms, lowest first: a module may import its own room and the rooms below it.
ENGINE = ("foundation", "interpreter", "fixtures", "isolation", "targets", "properties", "plugin",
          ("cli", "mutation", "mutants", "suite"))
FOUNDATION = ("__init__", "atomic", "exitcodes", "records", "families")


def _room(module: str) -> int | None:
    """The engine room of a dotted module under flashcheck (None: not the engine's)."""
    parts = module.split(".")
    if parts[0] != "flashcheck":
        return None
    if len(parts) == 1 or parts[1] in FOUNDATION:
        return 0
    for i, room in enumerate(ENGINE):
        if parts[1] in (room if isinstance(room, tuple) else (room,)):
            return i
    return None


def _engine_modules(root: Path, top: str = "flashcheck") -> dict[str, Path]:
    """Dotted name -> file of every module under the top-level folder `top` (installed under
    flashcheck: reports/bench/common.py is flashcheck.reports.bench.common)."""
    mods = {}
    for p in (root / top).rglob("*.py"):
        if "__pycache__" in p.parts or "regressions" in p.parts:
            continue
        rel = p.relative_to(root).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        mods[".".join(parts if top == "flashcheck" else ["flashcheck", *parts])] = p
    return mods


def _engine_graph(root: Path = ROOT, top: str = "flashcheck") -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports (at module level or inside functions)."""
    mods = _engine_modules(root, top)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        out: set[str] = set()
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")
                    up = up[:len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out.add(t)
        graph[name] = out
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_engine_has_no_import_loops() -> None:
    assert _cycles(_engine_graph()) == []


def test_reports_have_no_import_loops() -> None:
    # benchmarks share their timing and record helpers through reports/bench/common.py, not through
    # each other (attention <-> attention_features <-> launch was a loop)
    assert _cycles(_engine_graph(top="reports")) == []


def test_the_engine_rooms_point_down() -> None:
    up = sorted((a, b) for a, outs in _engine_graph().items() for b in outs
                if _room(a) is not None and _room(b) is not None and _room(b) > _room(a))
    assert up == [], "imports from a lower room of the engine to a higher one: " + ", ".join(f"{a} -> {b}" for a, b in up)


def test_the_loop_check_sees_a_loop(tmp_path: Path) -> None:
    (tmp_path / "flashcheck" / "fixtures").mkdir(parents=True)
    (tmp_path / "flashcheck" / "__init__.py").write_text("")
    (tmp_path / "flashcheck" / "fixtures" / "__init__.py").write_text("")
    (tmp_path / "flashcheck" / "fixtures" / "a.py").write_text("def f():\n    from flashcheck.fixtures import b\n")
    (tmp_path / "flashcheck" / "fixtures" / "b.py").write_text("from . import a\n")
    assert _cycles(_engine_graph(tmp_path)) == [["flashcheck.fixtures.a", "flashcheck.fixtures.b"]]
