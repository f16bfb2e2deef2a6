"""Mutation testing of the production Triton kernels: break them mechanically, count what the suite misses.

`python -m flashcheck.mutants` parses every `@triton.jit` function of the production kernel modules
(`kernels/softmax.py`, `kernels/attention.py`, the shared loads/stores of `kernels/_common.py`) with
`ast`, applies one mutation operator at one place (the source text of that node is replaced, the rest
of the file is kept byte for byte, so a mutant's diff is one line), and runs the family's ci suite
against each mutant, one at a time, in a subprocess:

    CI=true pytest <family test files> --family F -k "<specs whose code the mutant changes>" -x
           --no-save-fixtures -p flashcheck.mutants -p flashcheck.killrun

with FLASHCHECK_MUTANT naming the mutated source: this module, loaded as a pytest plugin, installs
an import hook before anything imports `flashcheck.kernels`, so `flashcheck.kernels.<module>` is
the mutated file (Triton reads the kernels' source from it too). Hypothesis's shrink phase is
skipped (flashcheck/killrun.py's switch): only "is it caught" matters.

Outcome per mutant: killed (the catching test, the property, the exception), survived, timed out,
crashed (the pytest process died), or equivalent-candidate: a survivor whose outputs are bit
identical to the original kernel's on a fixed probe set (run in the same subprocess after the
suite passed). Candidates are triaged by hand in the report, never counted as killed.

Results go to a JSON store (one record per mutant, keyed by the mutated source's hash, so runs
add up and `--resume` skips what is done) and `--report` writes reports/mutants.md.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as _dt
import difflib
import hashlib
import importlib.abc
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from flashcheck import HOME, atomic

MUTANT_ENV = "FLASHCHECK_MUTANT"
DEFAULT_STORE = HOME / "reports" / "out" / "mutants.json"
DEFAULT_REPORT = HOME / "reports" / "mutants.md"


# ---- what is mutated, and which tests see it -------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One production kernel module. `roots`: its @triton.jit functions that a launcher calls, with the
    registered specs that launch them; helpers get the union of the specs of the roots that call
    them (the call graph is read from the source). `tests`: the family's suite files."""

    module: str  # file kernels/<module>.py, imported as flashcheck.kernels.<module>
    family: str
    roots: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]


SOFTMAX_TESTS = ("tests/test_softmax.py", "tests/test_softmax_metamorphic.py", "tests/test_regressions.py")
ATTENTION_TESTS = ("tests/test_attention.py", "tests/test_regressions.py")

ALL_TARGETS: tuple[Target, ...] = (
    Target("softmax", "softmax", {
        "_softmax_row_kernel": ("softmax_row",),
        "_softmax_online_kernel": ("softmax_online",),
        "_split_stats_kernel": ("softmax_split",),
        "_split_merge_kernel": ("softmax_split",),
        "_split_normalize_kernel": ("softmax_split",),
    }, SOFTMAX_TESTS),
    Target("attention", "attention", {"_attn_fwd_kernel": ("attention",)}, ATTENTION_TESTS),
    # The shared 16-bit I/O of kernels/_common.py: softmax's loads read -inf padding, attention's read
    # zeros. store_f32 serves both families; its mutants run the softmax suite.
    Target("_common", "softmax", {"load_f32": ("softmax_row", "softmax_online", "softmax_split"),
                                  "store_f32": ("softmax_row", "softmax_online", "softmax_split")},
           SOFTMAX_TESTS),
    Target("_common", "attention", {"load_f32_zero": ("attention",)}, ATTENTION_TESTS),
)


def module_file(module: str) -> Path:
    return HOME / "kernels" / f"{module}.py"


@dataclass(frozen=True)
class Mutant:
    id: str  # "<module>:<function>:<operator>:<line>:<k>", stable while the source is unchanged
    module: str
    family: str
    function: str
    operator: str
    line: int
    description: str  # "`a < b` -> `a <= b`"
    specs: tuple[str, ...]  # registered kernels whose code this changes
    source: str  # the whole mutated module

    @property
    def key(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def diff(self) -> str:
        original = module_file(self.module).read_text().splitlines(keepends=True)
        lines = difflib.unified_diff(original, self.source.splitlines(keepends=True),
                                     f"a/kernels/{self.module}.py", f"b/kernels/{self.module}.py", n=0)
        return "".join(lines)


# ---- operators -----------------------------------------------------------------------------------------
#
# An operator looks at one node and returns (replacement text, description) pairs; `seg` gives a node's
# original source text, so replacements keep the operands exactly as written.

Seg = Callable[[ast.AST], str]
Edit = tuple[str, str]

_FLIP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">"}
_SYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
# Names the kernels use for a problem size or a bound: a comparison against one is a mask.
_BOUNDS = re.compile(r"\b(N|M|NB|D|n_valid|ITERS|offs_m)\b")
_MAXLIKE = re.compile(r"^(m|mx|mi|m_i|m_new|m_ref|m_old)$")
_PTRLIKE = re.compile(r"(_ptrs?|_row|^ws_[ml]|^row_[ml]|^x_row|^y_row)$")
_INDEX_NAMES = {"rows", "cols", "row", "base", "idx", "pid", "offs_m", "offs_n", "start_m", "row0"}


def _is_tl(node: ast.AST, *names: str) -> bool:
    """`tl.<name>` or `tl.math.<name>`."""
    if not isinstance(node, ast.Attribute) or node.attr not in names:
        return False
    v = node.value
    return (isinstance(v, ast.Name) and v.id == "tl") or (
        isinstance(v, ast.Attribute) and v.attr == "math" and isinstance(v.value, ast.Name) and v.value.id == "tl")


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _call_text(seg: Seg, call: ast.Call, drop: set[str]) -> str:
    parts = [seg(a) for a in call.args] + [seg(k) for k in call.keywords if k.arg not in drop]
    return f"{seg(call.func)}({', '.join(parts)})"


def op_cmp_flip(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
        new = f"{seg(node.left)} {_FLIP[type(node.ops[0])]} {seg(node.comparators[0])}"
        return [(new, f"`{seg(node)}` -> `{new}`")]
    return []


def op_drop_mask(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    out: list[Edit] = []
    if isinstance(node, ast.Call) and _is_tl(node.func, "load", "store"):
        kws = {k.arg for k in node.keywords}
        if "mask" in kws:
            new = _call_text(seg, node, {"mask", "other"})
            out.append((new, f"mask dropped: `{seg(node)}` -> `{new}`"))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
        # one axis of a 2-D mask (or one condition of a visibility mask) dropped
        for keep in (node.left, node.right):
            out.append((f"({seg(keep)})", f"mask half dropped: `{seg(node)}` -> `{seg(keep)}`"))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP \
            and _BOUNDS.search(seg(node.comparators[0])) and not ctx.get("in_where_cond_data"):
        # a bounds mask made always-true, same shape: `cols < N` -> `cols == cols`
        new = f"({seg(node.left)} == {seg(node.left)})"
        out.append((new, f"mask always true: `{seg(node)}` -> `{new}`"))
    return out


def op_drop_other(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Call) and _is_tl(node.func, "load") and any(k.arg == "other" for k in node.keywords):
        new = _call_text(seg, node, {"other"})
        return [(new, f"other= dropped: `{seg(node)}` -> `{new}`")]
    return []


def op_neg_inf_sentinel(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
            and str(node.args[0].value).strip().lower() == "-inf":
        return [("-1e4", f"`{seg(node)}` -> `-1e4` (finite sentinel)")]
    return []


def op_where_branch(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Call) and _is_tl(node.func, "where") and len(node.args) == 3:
        return [(f"({seg(a)})", f"`tl.where({seg(node.args[0])}, ...)` -> `{seg(a)}`") for a in node.args[1:]]
    return []


def op_off_by_one(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    out: list[Edit] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        bounds = node.args[:2] if len(node.args) >= 2 else node.args[:1]
        for i, a in enumerate(bounds):
            for d in ("+ 1", "- 1"):
                args = [seg(b) if j != i else f"({seg(b)}) {d}" for j, b in enumerate(node.args)]
                new = f"range({', '.join(args)})"
                out.append((new, f"loop bound: `{seg(node)}` -> `{new}`"))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        # a pointer plus an offset: read/write one element off
        names = (_base_name(node.left), _base_name(node.right))
        for ptr, off, side in ((names[0], node.right, "r"), (names[1], node.left, "l")):
            if ptr and _PTRLIKE.search(ptr) and not (isinstance(off, ast.Name) and _PTRLIKE.search(off.id)):
                for d in ("+ 1", "- 1"):
                    new_off = f"({seg(off)} {d})"
                    new = f"{seg(node.left)} + {new_off}" if side == "r" else f"{new_off} + {seg(node.right)}"
                    out.append((new, f"offset: `{seg(node)}` -> `{new}`"))
                break
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
            and node.targets[0].id in _INDEX_NAMES:
        for d in ("+ 1", "- 1"):
            new = f"{node.targets[0].id} = ({seg(node.value)}) {d}"
            out.append((new, f"index: `{seg(node)}` -> `{new}`"))
    return out


def op_drop_rescale(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return []
    factors = ctx["rescale_names"]
    out = []
    for f, keep in ((node.right, node.left), (node.left, node.right)):
        if _base_name(f) in factors:
            out.append((f"({seg(keep)})", f"rescale dropped: `{seg(node)}` -> `{seg(keep)}`"))
    return out


def op_narrow_acc(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    """fp32 -> fp16 where a value is widened or an accumulator is created (not bit casts)."""
    if isinstance(node, ast.Call) and not any(k.arg == "bitcast" for k in node.keywords):
        is_to = isinstance(node.func, ast.Attribute) and node.func.attr == "to"
        is_alloc = _is_tl(node.func, "zeros", "full")
        if is_to or is_alloc:
            text = seg(node)
            if "tl.float32" in text.replace(seg(node.func), "", 1):
                new = _replace_last_arg_dtype(seg, node, "tl.float32", "tl.float16")
                if new:
                    return [(new, f"fp32 narrowed: `{text}` -> `{new}`")]
    return []


def _replace_last_arg_dtype(seg: Seg, node: ast.Call, old: str, new_t: str) -> str | None:
    parts = []
    hit = False
    for a in node.args:
        s = seg(a)
        if s == old:
            s, hit = new_t, True
        parts.append(s)
    for k in node.keywords:
        s = seg(k)
        if k.arg == "dtype" and seg(k.value) == old:
            s, hit = f"dtype={new_t}", True
        parts.append(s)
    return f"{seg(node.func)}({', '.join(parts)})" if hit else None


def op_narrow_int64(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Attribute) and node.attr == "int64" and isinstance(node.value, ast.Name) \
            and node.value.id == "tl":
        return [("tl.int32", f"`tl.int64` -> `tl.int32` in `{ctx['line_text']}`")]
    return []


def op_max_min(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    swap = {"maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max"}
    if isinstance(node, ast.Attribute) and _is_tl(node, *swap) and ctx.get("is_call_func"):
        new = seg(node)[: -len(node.attr)] + swap[node.attr]
        return [(new, f"`{seg(node)}` -> `{new}` in `{ctx['line_text']}`")]
    return []


def op_drop_max_sub(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _MAXLIKE.match(_base_name(node.right) or ""):
        return [(f"({seg(node.left)})", f"max subtraction dropped: `{seg(node)}` -> `{seg(node.left)}`")]
    return []


def op_constant(node: ast.AST, seg: Seg, ctx: dict) -> list[Edit]:
    if isinstance(node, ast.Name) and node.id == "_LOG2E":
        return [("1.0", f"`_LOG2E` -> `1.0` in `{ctx['line_text']}`")]
    if isinstance(node, ast.Constant) and ctx.get("arith_operand") and not isinstance(node.value, (bool, str)):
        v = node.value
        if isinstance(v, float):
            new = "1.0" if v == 0.0 else repr(v * 2.0)
        elif isinstance(v, int):
            new = str(v + 1)
        else:
            return []
        return [(new, f"constant `{seg(node)}` -> `{new}` in `{ctx['line_text']}`")]
    return []


OPERATORS: dict[str, Callable[[ast.AST, Seg, dict], list[Edit]]] = {
    "cmp_flip": op_cmp_flip,
    "drop_mask": op_drop_mask,
    "drop_other": op_drop_other,
    "neg_inf_sentinel": op_neg_inf_sentinel,
    "where_branch": op_where_branch,
    "off_by_one": op_off_by_one,
    "drop_rescale": op_drop_rescale,
    "narrow_acc": op_narrow_acc,
    "narrow_int64": op_narrow_int64,
    "max_min": op_max_min,
    "drop_max_sub": op_drop_max_sub,
    "constant": op_constant,
}


# ---- generation ------------------------------------------------------------------------------------------

def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit"):
            return True
    return False


def jit_functions(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)}


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def specs_of_functions(source: str, roots: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Each jit function of the module -> the specs of every root that (transitively) calls it."""
    fns = jit_functions(source)
    out: dict[str, set[str]] = {name: set() for name in fns}

    def visit(name: str, specs: tuple[str, ...], seen: set[str]) -> None:
        if name in seen or name not in fns:
            return
        seen.add(name)
        out[name].update(specs)
        for callee in _calls(fns[name]):
            visit(callee, specs, seen)

    for root, specs in roots.items():
        visit(root, specs, set())
    order = {s: i for i, s in enumerate(s for specs in roots.values() for s in specs)}
    return {k: tuple(sorted(v, key=order.get)) for k, v in out.items() if v}


def _rescale_names(fn: ast.FunctionDef) -> set[str]:
    """Names assigned from an expression that calls exp2/exp: the factors a rescale multiplies by
    (the parameters of the lane helpers named e/f/alpha are that too)."""
    names = {a.arg for a in fn.args.args if a.arg in ("e", "f", "alpha")}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            if any(isinstance(c, ast.Call) and _is_tl(c.func, "exp2", "exp") for c in ast.walk(n.value)):
                names.add(n.targets[0].id)
    return names - {"p", "y"}  # p is the probability matrix itself, y the output: not factors


def _walk_with_context(fn: ast.FunctionDef) -> Iterator[tuple[ast.AST, dict]]:
    body = fn.body[1:] if (fn.body and isinstance(fn.body[0], ast.Expr)
                           and isinstance(getattr(fn.body[0], "value", None), ast.Constant)) else fn.body

    def rec(node: ast.AST, ctx: dict) -> Iterator[tuple[ast.AST, dict]]:
        yield node, ctx
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                c = {}
                if isinstance(node, ast.Call) and field == "func":
                    c["is_call_func"] = True
                if isinstance(node, (ast.BinOp, ast.Compare)) and isinstance(child, ast.Constant):
                    c["arith_operand"] = True
                if isinstance(node, ast.keyword) and node.arg == "other" and isinstance(child, ast.Constant):
                    c["arith_operand"] = True
                if isinstance(node, ast.Subscript) or (isinstance(node, ast.keyword) and node.arg == "axis"):
                    c["no_const"] = True
                if ctx.get("no_const"):
                    c["no_const"] = True
                yield from rec(child, c)

    for stmt in body:
        yield from rec(stmt, {})


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    return starts


def generate(target: Target, *, operators: list[str] | None = None, functions: list[str] | None = None) -> list[Mutant]:
    source = module_file(target.module).read_text()
    lines = source.splitlines()
    starts = _offsets(source)
    fn_specs = specs_of_functions(source, target.roots)
    ops = {k: OPERATORS[k] for k in (operators or OPERATORS)}
    seen: set[str] = set()
    out: list[Mutant] = []
    for name, fn in jit_functions(source).items():
        if name not in fn_specs or (functions and name not in functions):
            continue
        rescale = _rescale_names(fn)
        counter: dict[tuple[str, int], int] = {}
        for node, ctx in _walk_with_context(fn):
            if not hasattr(node, "end_lineno"):
                continue
            ctx = dict(ctx, rescale_names=rescale, line_text=lines[node.lineno - 1].strip())
            if ctx.get("no_const"):
                ctx.pop("arith_operand", None)

            def seg(n: ast.AST) -> str:
                return ast.get_source_segment(source, n) or ""

            a = starts[node.lineno - 1] + node.col_offset
            b = starts[node.end_lineno - 1] + node.end_col_offset
            for op_name, op in ops.items():
                for text, desc in op(node, seg, ctx):
                    if "\n" in text:
                        text = " ".join(text.split())
                    new_source = source[:a] + text + source[b:]
                    if new_source == source or new_source in seen:
                        continue
                    try:
                        ast.parse(new_source)
                    except SyntaxError:
                        continue
                    seen.add(new_source)
                    k = counter[(op_name, node.lineno)] = counter.get((op_name, node.lineno), 0) + 1
                    out.append(Mutant(
                        id=f"{target.module}:{name}:{op_name}:{node.lineno}:{k}", module=target.module,
                        family=target.family, function=name, operator=op_name, line=node.lineno,
                        description=desc, specs=fn_specs[name], source=new_source))
    return out


def all_mutants(*, modules: list[str] | None = None, **kw: Any) -> list[Mutant]:
    out = []
    for t in ALL_TARGETS:
        if not modules or t.module in modules:
            out += generate(t, **kw)
    return out


# ---- the pytest plugin (inside the subprocess) ----------------------------------------------------------

class _MutantFinder(importlib.abc.MetaPathFinder):
    """Serves `flashcheck.kernels.<module>` from the mutated file."""

    def __init__(self, fullname: str, path: str) -> None:
        self.fullname, self.path = fullname, path

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001
        if fullname == self.fullname:
            return importlib.util.spec_from_file_location(fullname, self.path)
        return None


def _install_from_env() -> dict[str, Any] | None:
    raw = os.environ.get(MUTANT_ENV)
    if not raw:
        return None
    spec = json.loads(Path(raw).read_text())
    fullname = f"flashcheck.kernels.{spec['module']}"
    if fullname in sys.modules:
        raise RuntimeError(f"{fullname} was imported before the mutant could be installed")
    sys.meta_path.insert(0, _MutantFinder(fullname, spec["path"]))
    return spec


# Loaded with `-p flashcheck.mutants`: pytest imports plugins before any conftest, so the hook is in
# place before tests/conftest.py imports the kernels.
_ACTIVE = _install_from_env()


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001
    """The suite passed: is the mutant observably different at all? Run the probe set."""
    if _ACTIVE is None or int(exitstatus) != 0:
        return
    try:
        result = probe(_ACTIVE)
    except Exception as exc:  # noqa: BLE001  (the probe must not turn a survivor into a crash)
        result = {"identical": None, "error": f"{type(exc).__name__}: {exc}"}
    Path(_ACTIVE["probe_out"]).write_text(json.dumps(result))


# ---- the equivalence probe -------------------------------------------------------------------------------

def _load_original(module: str):  # noqa: ANN202
    name = f"flashcheck.kernels._original_{module}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, module_file(module))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _softmax_probe_inputs() -> Iterator[tuple[str, Any]]:
    import numpy as np
    import torch

    from flashcheck.kernels import DEVICE

    rng = np.random.default_rng(12)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n in (1, 7, 64, 65, 129, 300, 1025, 2500):
            rows = [rng.standard_normal(n) * 3, rng.standard_normal(n) * 0.01 + np.eye(1, n, n // 2)[0] * 20,
                    np.full(n, -np.inf), rng.standard_normal(n) - 1e4 * (dtype != torch.float16),
                    -np.arange(n, dtype=float)[::-1] * 0.3, np.full(n, 3.0),
                    rng.standard_normal(n) * 5 - 100]
            r = rng.standard_normal(n)
            r[: max(1, n // 3)] = -np.inf
            rows.append(r)
            r = rng.standard_normal(n)
            r[n // 2] = np.nan
            rows.append(r)
            r = rng.standard_normal(n)
            r[-1] = np.inf
            rows.append(r)
            x = torch.from_numpy(np.array(rows)).to(dtype).to(DEVICE)
            yield f"{dtype} {tuple(x.shape)}", x
            yield f"{dtype} {tuple(x.shape)} transposed", x.t().contiguous().t()


def _attention_probe_inputs() -> Iterator[tuple[str, dict[str, Any]]]:
    import torch

    from flashcheck.kernels import DEVICE

    g = torch.Generator().manual_seed(12)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for (b, h, m, n, d) in ((1, 2, 5, 7, 16), (2, 1, 40, 70, 64), (1, 1, 33, 100, 24)):
            q, k, v = (torch.randn(b, h, s, d, generator=g).to(dtype).to(DEVICE) for s in (m, n, n))
            yield f"{dtype} {(b, h, m, n, d)}", dict(q=q, k=k, v=v)
            yield f"{dtype} {(b, h, m, n, d)} causal", dict(q=q, k=k, v=v, causal=True)
            kv = torch.tensor([n // 2, 0][:b] if b > 1 else [n // 3], dtype=torch.int32, device=DEVICE)
            yield f"{dtype} {(b, h, m, n, d)} kv_lens", dict(q=q, k=k, v=v, kv_lens=kv)
            yield f"{dtype} {(b, h, m, n, d)} big", dict(q=q * 8, k=k * 8, v=v * 1000)


_PUBLIC = {"softmax": ("softmax_row", "softmax_online", "softmax_split"), "attention": ("attention",)}


def same_bits(a: Any, b: Any) -> bool:
    """Same shape, dtype and bits (any NaN equals any NaN)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    both_nan = torch.isnan(a) & torch.isnan(b)
    ia = a.view({2: torch.int16, 4: torch.int32}[a.element_size()])
    ib = b.view({2: torch.int16, 4: torch.int32}[b.element_size()])
    return bool(((ia == ib) | both_nan).all())


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the mutated and the original public functions on fixed inputs and compare bits."""
    import importlib

    mutated = importlib.import_module(f"flashcheck.kernels.{spec['module']}")
    original = _load_original(spec["module"])
    family = spec["family"]
    fns = [f for f in _PUBLIC[family] if f in spec["specs"]] or list(_PUBLIC[family])
    if spec["module"] == "_common":  # the helpers are reached through the family's kernels module
        import flashcheck.kernels.softmax as km_soft  # noqa: F401
        mutated = importlib.import_module(f"flashcheck.kernels.{family}")
        original = _load_original_with_common(family)
    count = 0
    inputs = _softmax_probe_inputs() if family == "softmax" else _attention_probe_inputs()
    for label, inp in inputs:
        for f in fns:
            kwargs = inp if isinstance(inp, dict) else {"x": inp}
            try:
                got = getattr(mutated, f)(**kwargs)
            except Exception as exc:  # noqa: BLE001
                return {"identical": False, "probes": count, "witness": f"{f} on {label}: raised {type(exc).__name__}: {exc}"}
            want = getattr(original, f)(**kwargs)
            count += 1
            if not same_bits(got, want):
                return {"identical": False, "probes": count, "witness": f"{f} on {label}: different bits"}
    return {"identical": True, "probes": count}


def _load_original_with_common(family: str):  # noqa: ANN202
    """The family module bound to an unmutated copy of _common (for _common mutants)."""
    src = module_file(family).read_text().replace("from ._common import", "from ._original__common import")
    _load_original("_common")
    name = f"flashcheck.kernels._original_{family}_c"
    tmp = Path(tempfile.mkdtemp(prefix="mutant-orig-")) / f"{family}.py"
    tmp.write_text(src)
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---- running ---------------------------------------------------------------------------------------------

FIRST_SPEC_ONLY = False  # --first-spec-only
ONLY_SPECS: tuple[str, ...] = ()  # --spec


def _specs_run(m: Mutant) -> tuple[str, ...]:
    if ONLY_SPECS:
        return tuple(s for s in m.specs if s in ONLY_SPECS) or m.specs
    return m.specs[:1] if FIRST_SPEC_ONLY else m.specs


def suite_args(m: Mutant) -> list[str]:
    tests = next(t.tests for t in ALL_TARGETS if t.module == m.module and t.family == m.family)
    specs = _specs_run(m)
    return [*tests, f"--family={m.family}", "-k", " or ".join(specs), "-x", "--no-save-fixtures",
            "-p", "flashcheck.mutants"]


def classify(rc: int, timed_out: bool, failed: bool, probe_result: dict[str, Any] | None) -> str:
    if timed_out:
        return "timed_out"
    if failed and rc != 0:  # a test failed (the process may have died afterwards, e.g. a heap
        return "killed"     # corrupted by an out-of-bounds store: the failure was already recorded)
    if rc == 0:
        return "equivalent_candidate" if probe_result and probe_result.get("identical") else "survived"
    if rc < 0:  # the test process died of a signal (an out-of-bounds access) before any failure
        return "crashed"
    return "error"  # pytest's own codes (collection, usage, internal): the engine failed, not the mutant


def probe_main() -> None:
    """`python -c "import flashcheck.mutants as M; M.probe_main()"` with FLASHCHECK_MUTANT set: the
    probe alone (the import installed the mutant)."""
    if _ACTIVE is None:
        raise SystemExit(f"{MUTANT_ENV} is not set")
    Path(_ACTIVE["probe_out"]).write_text(json.dumps(probe(_ACTIVE)))


def _probe_first(spec_file: Path, probe_out: Path, timeout: float) -> dict[str, Any] | None:
    from flashcheck.killrun import clean_env

    env = clean_env()
    env[MUTANT_ENV] = str(spec_file)
    try:
        subprocess.run([sys.executable, "-c", "import flashcheck.mutants as M; M.probe_main()"], cwd=HOME, env=env,
                       capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(probe_out.read_text()) if probe_out.exists() else None


def run_mutant(m: Mutant, *, timeout: float, probe_first: bool = False) -> dict[str, Any]:
    """Run the suite against one mutant. probe_first: run the bit-equivalence probe before the suite
    and skip the suite when the mutant is bit-identical on every probe (status
    equivalent_candidate, `suite_skipped`): on a loaded CPU a survivor costs the whole suite."""
    from flashcheck.killrun import run_pytest

    tmp = Path(tempfile.mkdtemp(prefix="mutant-"))
    path = tmp / f"{m.module}.py"
    path.write_text(m.source)
    spec_file = tmp / "mutant.json"
    probe_out = tmp / "probe.json"
    spec_file.write_text(json.dumps({"module": m.module, "family": m.family, "path": str(path),
                                     "specs": list(m.specs), "probe_out": str(probe_out)}))
    early = _probe_first(spec_file, probe_out, timeout) if probe_first else None
    if early and early.get("identical"):
        r = {"returncode": 0, "timed_out": False, "wall_seconds": 0.0, "tail": "suite skipped: bit-identical on the probes",
             "data": {}}
    else:
        if probe_out.exists():
            probe_out.unlink()
        r = run_pytest(suite_args(m), env_extra={MUTANT_ENV: str(spec_file)}, shrink=False, timeout=timeout)
    data, rc = r["data"], r["returncode"]
    first = data.get("first") or {}
    failed = data.get("tests_failed") or []
    pr = json.loads(probe_out.read_text()) if probe_out.exists() else None
    status = classify(rc, r["timed_out"], bool(failed), pr)
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    return {
        "id": m.id, "key": m.key, "module": m.module, "family": m.family, "function": m.function,
        "operator": m.operator, "line": m.line, "description": m.description, "specs": list(m.specs),
        "specs_run": list(_specs_run(m)),
        "status": status, "returncode": rc, "wall_seconds": r["wall_seconds"],
        "caught_by_test": failed[0]["nodeid"] if failed else None,
        "caught_by_property": first.get("property"), "exception": first.get("exception"),
        "message": (first.get("message") or (failed[0]["summary"] if failed else ""))[:600],
        "tests_passed": data.get("tests_passed"), "probe": pr, "suite_skipped": bool(early and early.get("identical")),
        "output_tail": None if status == "killed" else r["tail"][-1500:],
    }


def load_store(path: Path) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else {}


def _runs_file(store: Path) -> Path:
    return store.with_name(store.stem + "_runs.json")


def log_run(store: Path, command: str, selected: int, ran: int, wall: float) -> None:
    """What ran, for the report: every invocation's command line, counts and wall time."""
    path = _runs_file(store)
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({"command": command, "selected": selected, "ran": ran, "wall_seconds": round(wall),
                 "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes")})
    path.write_text(json.dumps(runs, indent=1))


_STORE_LOCK = __import__("threading").Lock()


def run(mutants: list[Mutant], *, jobs: int, timeout: float, store: Path, resume: bool, probe_first: bool = False,
        log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    results = load_store(store)
    todo = [m for m in mutants if not (resume and m.key in results)]
    log(f"{len(mutants)} mutants selected, {len(mutants) - len(todo)} already in {store}, running {len(todo)}")

    def one(m: Mutant) -> None:
        r = run_mutant(m, timeout=timeout, probe_first=probe_first)
        results[m.key] = r
        store.parent.mkdir(parents=True, exist_ok=True)
        with _STORE_LOCK:  # merge with the file: another run may have written it meanwhile
            on_disk = load_store(store)
            on_disk[m.key] = r
            atomic.write_text(store, json.dumps(on_disk, indent=1))
        by = f" by {r['caught_by_test']} [{r['caught_by_property']}]" if r["status"] == "killed" else ""
        log(f"  {r['status']:<20} {r['wall_seconds']:>6.1f}s  {m.id}  {m.description}{by}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return results


# ---- the report ------------------------------------------------------------------------------------------

# A timeout is not counted as a kill: on a shared CPU it may be load, not a mutant that hangs.
DETECTED = ("killed", "crashed")
UNDECIDED = ("timed_out",)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=HOME, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def to_markdown(mutants: list[Mutant], results: dict[str, dict[str, Any]], triage: dict[str, str],
                runs: list[dict[str, Any]]) -> str:
    rows = [(m, dict(results[m.key], status=classify(results[m.key]["returncode"],
                                                     results[m.key]["status"] == "timed_out",
                                                     bool(results[m.key]["caught_by_test"]),
                                                     results[m.key]["probe"])))
            for m in mutants if m.key in results]
    errors = [m.id for m, r in rows if r["status"] == "error"]
    rows = [(m, r) for m, r in rows if r["status"] != "error"]
    commit = _git("log", "-1", "--format=%h %cs", "--", "kernels/")
    out = ["# flashcheck mutation score", "",
           f"{_dt.date.today().isoformat()}; kernels at commit {commit} (`git log -1 -- kernels/`); Triton "
           "interpreter (CPU). Every `@triton.jit` function of `kernels/` mutated one node at a time "
           "(`flashcheck/mutants.py`); each mutant runs the ci suite of the kernels it changes with `-x`, "
           "Hypothesis shrinking skipped. **Score** = detected / (run - equivalent - timed out): detected = "
           "killed (a test failed) + crashed (the test process died of a signal, e.g. an out-of-bounds "
           "access, before a test could fail); equivalent = survivors argued equivalent below (triage); "
           "timed out = undecided (on a shared CPU a timeout may be load, not a hanging mutant), listed "
           "and left out of the score.", "",
           "Runs (accumulated in the results store; `--resume` skips mutants already run):", "",
           *[f"- `{r['command']}`: {r['ran']} of {r['selected']} selected mutants run, {r['wall_seconds']} s wall "
             f"({r['date']})" + (f". {r['note']}" if r.get("note") else "") for r in runs], ""]
    if errors:
        out += [f"Engine errors (pytest could not run; not counted, to be re-run): {', '.join(errors)}", ""]
    gen_total = len(mutants)
    gpu = [m for m in mutants if m.operator in GPU_ONLY_OPERATORS and m.key not in results]
    per_mod: dict[str, list[int]] = {}
    for m in mutants:
        c = per_mod.setdefault(f"{m.module}.{m.function}", [0, 0])
        c[0] += 1
        c[1] += m.key in results
    out += [f"Mutants generated: {gen_total}; run: {len(rows)}; GPU-only, not run under the interpreter: "
            f"{len(gpu)} ({', '.join(GPU_ONLY_OPERATORS)}: int32 offsets only overflow past 2^31 elements; "
            "tests/test_softmax_gpu.py is where they can die).", "",
            "Generated / run per function: " + "; ".join(f"{k} {v[1]}/{v[0]}" for k, v in sorted(per_mod.items())) + ".",
            ""]
    out += ["## Score per kernel", "",
            "| kernel (jit function) | run | killed | timed out | crashed | survived | equivalent | score | wall s (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        groups.setdefault(f"{m.module}.{m.function}", []).append(r)
    tot: dict[str, float] = {}

    def line(name: str, rs: list[dict[str, Any]]) -> str:
        c = {s: sum(r["status"] == s for r in rs) for s in ("killed", "timed_out", "crashed", "survived",
                                                                "equivalent_candidate")}
        eq = sum(r["status"] in ("survived", "equivalent_candidate") and triage.get(r["id"], "").startswith("equivalent")
                 for r in rs)
        surv = c["survived"] + c["equivalent_candidate"] - eq
        det = c["killed"] + c["crashed"]
        denom = len(rs) - eq - c["timed_out"]
        score = f"{100 * det / denom:.1f}% ({det}/{denom})" if denom else "-"
        wall = sum(r["wall_seconds"] for r in rs) / max(1, len(rs))
        for k, v in (("run", len(rs)), ("det", det), ("denom", denom), ("wall", wall * len(rs))):
            tot[k] = tot.get(k, 0) + v
        return (f"| {name} | {len(rs)} | {c['killed']} | {c['timed_out']} | {c['crashed']} | {surv} | {eq} | "
                f"{score} | {wall:.1f} |")

    for name in sorted(groups):
        out.append(line(name, groups[name]))
    specs: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        for s in m.specs:
            specs.setdefault(s, []).append(r)
    out += ["", "## Score per registered kernel (a mutant of a shared helper counts for each kernel it changes)", "",
            "| kernel | run | killed | timed out | crashed | survived | equivalent | score | wall s (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(specs):
        out.append(line(s, specs[s]))
    all_rs = [r for _, r in rows]
    tot.clear()
    out += ["", "## Overall", "", "| | run | killed | timed out | crashed | survived | equivalent | score | wall s (mean) |",
            "|---|---|---|---|---|---|---|---|---|", line("all", all_rs), "",
            f"Total wall time of the mutant runs: {tot.get('wall', 0) / 60:.1f} min (sum over mutants).", ""]
    ops: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        ops.setdefault(m.operator, []).append(r)
    out += ["## By operator", "", "| operator | run | detected | survived or equivalent |", "|---|---|---|---|"]
    for o in OPERATORS:
        rs = ops.get(o, [])
        out.append(f"| {o} | {len(rs)} | {sum(r['status'] in DETECTED for r in rs)} | "
                   f"{sum(r['status'] not in DETECTED + UNDECIDED for r in rs)} |")
    out += ["", "## Survivors", ""]
    surv = [(m, r) for m, r in rows if r["status"] not in DETECTED + UNDECIDED]
    undecided = [m.id for m, r in rows if r["status"] in UNDECIDED]
    if undecided:
        out += [f"Timed out (undecided, not in the score): {', '.join(f'`{i}`' for i in undecided)}", ""]
    if not surv:
        out.append("None.")
    for m, r in surv:
        pr = r.get("probe") or {}
        probe_txt = ("bit-identical to the original on all {} probe calls".format(pr.get("probes"))
                     if pr.get("identical") else f"differs from the original: {pr.get('witness') or pr.get('error')}")
        ran = ("suite not run (bit-identical on the probes, `--probe-first`)" if r.get("suite_skipped") else
               f"specs run: {', '.join(r.get('specs_run') or m.specs)}; {r['tests_passed']} tests passed in "
               f"{r['wall_seconds']:.0f}s")
        out += [f"### `{m.id}` ({r['status']})", "", f"{m.description}. Changes {', '.join(m.specs)}; {ran}. "
                f"Probe: {probe_txt}.", "",
                "```diff", m.diff().rstrip(), "```", "",
                f"**Triage**: {triage.get(m.id, 'NOT TRIAGED')}", ""]
    out += ["## Killed mutants", "", "| mutant | change | caught by (test) | property | s |", "|---|---|---|---|---|"]
    for m, r in rows:
        if r["status"] in DETECTED:
            test = (r["caught_by_test"] or r["status"]).split("::")[-1]
            out.append(f"| `{m.id}` | {m.description.replace('|', '/')} | {test} | "
                       f"{r['caught_by_property'] or r.get('exception') or '-'} | {r['wall_seconds']:.0f} |")
    return "\n".join(out) + "\n"


TRIAGE_FILE = HOME / "reports" / "mutants_triage.json"


# Operators whose mutants only a GPU run can kill: int32 offsets overflow only past 2^31 elements
# (or strides), tensors the interpreter cannot hold; the GPU tests (tests/test_softmax_gpu.py
# test_more_than_2_31_elements, test_strides_past_2_31) are the ones that can see them.
GPU_ONLY_OPERATORS = ("narrow_int64",)


def select(mutants: list[Mutant], *, functions: list[str] | None, operators: list[str] | None,
           sample: int | None, seed: int, gpu_only: bool = False) -> list[Mutant]:
    out = [m for m in mutants if (not functions or m.function in functions)
           and (not operators or m.operator in operators)
           and (gpu_only or m.operator not in GPU_ONLY_OPERATORS)]
    if sample is not None and sample < len(out):
        out = sorted(random.Random(seed).sample(out, sample), key=out.index)
    return out


def _interpreter() -> bool:
    from flashcheck.kernels import INTERPRET

    return INTERPRET


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.mutants", description=__doc__.splitlines()[0])
    p.add_argument("--module", action="append", choices=sorted({t.module for t in ALL_TARGETS}),
                   help="only this kernels/ module (repeatable)")
    p.add_argument("--function", action="append", help="only mutants of this @triton.jit function (repeatable)")
    p.add_argument("--operator", action="append", choices=list(OPERATORS), help="only this operator (repeatable)")
    p.add_argument("--gpu-only-operators", action="store_true",
                   help=f"also run {', '.join(GPU_ONLY_OPERATORS)} mutants (only a GPU can kill them)")
    p.add_argument("--sample", type=int, default=None, help="a deterministic random sample of this many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--jobs", type=int, default=1, help="mutants run in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per mutant (default 600)")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="JSON results, accumulated over runs")
    p.add_argument("--resume", action="store_true", help="skip mutants already in the store")
    p.add_argument("--probe-first", action="store_true",
                   help="probe before the suite; skip the suite for mutants bit-identical on every probe")
    p.add_argument("--spec", action="append", help="run only this kernel's tests (repeatable; of the kernels "
                   "a mutant changes)")
    p.add_argument("--id", action="append", help="only this mutant (repeatable)")
    p.add_argument("--first-spec-only", action="store_true",
                   help="a shared helper's mutant runs only its first kernel's tests (faster; says so in the report)")
    p.add_argument("--list", action="store_true", help="list the selected mutants and exit")
    p.add_argument("--diff", metavar="ID", help="print one mutant's diff and exit")
    p.add_argument("--report", type=Path, nargs="?", const=DEFAULT_REPORT, default=None,
                   help=f"write the markdown report (default {DEFAULT_REPORT.relative_to(HOME)}) from the store")
    p.add_argument("--no-run", action="store_true", help="only write the report from the store")
    args = p.parse_args(argv)
    global FIRST_SPEC_ONLY, ONLY_SPECS
    FIRST_SPEC_ONLY = args.first_spec_only
    ONLY_SPECS = tuple(args.spec or ())
    every = all_mutants(modules=args.module)
    if args.id:
        every_ids = {m.id for m in every}
        missing = [i for i in args.id if i not in every_ids]
        if missing:
            p.error(f"no mutant {missing}")
    chosen = select([m for m in every if not args.id or m.id in args.id], functions=args.function, operators=args.operator, sample=args.sample, seed=args.seed,
                    gpu_only=args.gpu_only_operators or not _interpreter())
    if args.diff:
        m = next((m for m in every if m.id == args.diff), None)
        if m is None:
            print(f"no mutant {args.diff!r}", file=sys.stderr)
            return 2
        print(m.description)
        print(m.diff())
        return 0
    if args.list:
        for m in chosen:
            print(f"{m.id:<60} {m.description}")
        print(f"{len(chosen)} mutants")
        return 0
    results = load_store(args.store)
    if not args.no_run:
        t0 = time.perf_counter()
        todo = sum(not (args.resume and m.key in results) for m in chosen)
        results = run(chosen, jobs=args.jobs, timeout=args.timeout, store=args.store, resume=args.resume,
                      probe_first=args.probe_first)
        wall = time.perf_counter() - t0
        log_run(args.store, "python -m flashcheck.mutants " + " ".join(argv if argv is not None else sys.argv[1:]),
                len(chosen), todo, wall)
        print(f"ran in {wall:.0f}s wall")
    if args.report:
        triage = json.loads(TRIAGE_FILE.read_text()) if TRIAGE_FILE.exists() else {}
        runs_path = _runs_file(args.store)
        runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
        args.report.write_text(to_markdown(every, results, triage, runs))
        print(f"wrote {args.report}")
    rs = [results[m.key] for m in chosen if m.key in results]
    return 1 if any(r["status"] == "survived" for r in rs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
