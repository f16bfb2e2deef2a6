"""What is mutated and which tests see it: the targets (kernel modules, their jit roots and the
specs that launch them), the mutants generated from their source, and the selection a run makes."""
from __future__ import annotations

import ast
import difflib
import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from flashcheck import HOME, SUITE
from flashcheck.mutation import between_launches
from flashcheck.mutation.operators import GPU_ONLY_OPERATORS, OPERATORS, is_tl

# ---- what is mutated, and which tests see it -------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One production kernel module. `roots`: its @triton.jit functions that a launcher calls, with the
    registered specs that launch them; helpers get the union of the specs of the roots that call
    them (the call graph is read from the source). `tests`: the family's suite files. `unit_tests`:
    self-test files of the module's helpers, run whole after the suite (not narrowed to the specs)."""

    module: str  # file kernels/<module>.py, imported as flashcheck.kernels.<module>
    family: str
    roots: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]
    unit_tests: tuple[str, ...] = ()


def _suite(*names: str) -> tuple[str, ...]:
    """Suite files as pytest arguments relative to HOME (the subprocess's folder)."""
    return tuple(str((SUITE / n).relative_to(HOME)) for n in names)


# The *_gpu.py files skip under the interpreter; on a GPU they are where narrow_int64 mutants die.
SOFTMAX_TESTS = _suite("test_softmax.py", "test_softmax_metamorphic.py", "test_softmax_gpu.py", "test_regressions.py")
ATTENTION_TESTS = _suite("test_attention.py", "test_attention_gpu.py", "test_regressions.py")
ATTENTION_BACKWARD_TESTS = _suite("test_attention_backward.py", "test_regressions.py")
# The interpreter's bf16 emulation (store_f32 and the loads' BF16_BITS branches, attention's P
# rounding): a wrong tie or NaN stays inside every bound, so its own exactness test runs too.
BF16_BITS_TESTS = ("tests/test_bf16_bits.py",)

ALL_TARGETS: tuple[Target, ...] = (
    Target("softmax", "softmax", {
        "_softmax_row_kernel": ("softmax_row",),
        "_softmax_online_kernel": ("softmax_online",),
        "_split_stats_kernel": ("softmax_split",),
        "_split_row_stats": ("softmax_split",),
        "_split_normalize_kernel": ("softmax_split",),
    }, SOFTMAX_TESTS),
    Target("attention", "attention", {"_attn_fwd_kernel": ("attention",)}, ATTENTION_TESTS, BF16_BITS_TESTS),
    Target("attention_merge", "attention", {"_merge_splits_tile": ("attention",), "_arrive": ("attention",)},
           ATTENTION_TESTS),
    # The backward's kernels run only under autograd: the backward suite and its kernel's own tests.
    Target("attention_backward_kernels", "attention",
           {"_attn_bwd_delta_kernel": ("attention",), "_attn_bwd_dkdv_kernel": ("attention",),
            "_attn_bwd_dq_kernel": ("attention",)},
           ATTENTION_BACKWARD_TESTS, ("tests/test_kernels_attention_backward.py",)),
    # The shared 16-bit I/O of kernels/_common.py: softmax's loads read -inf padding, attention's read
    # zeros. store_f32 serves both families; its mutants run the softmax suite.
    Target("_common", "softmax", {"load_f32": ("softmax_row", "softmax_online", "softmax_split"),
                                  "store_f32": ("softmax_row", "softmax_online", "softmax_split")},
           SOFTMAX_TESTS, BF16_BITS_TESTS),
    Target("_common", "attention", {"load_f32_zero": ("attention",)}, ATTENTION_TESTS, BF16_BITS_TESTS),
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
    interpreter_only: bool = False  # in code a GPU never compiles (`interpreter_only_nodes`)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def diff(self) -> str:
        original = module_file(self.module).read_text().splitlines(keepends=True)
        lines = difflib.unified_diff(original, self.source.splitlines(keepends=True),
                                     f"a/kernels/{self.module}.py", f"b/kernels/{self.module}.py", n=0)
        return "".join(lines)



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


#: Constexpr flags that launchers set to `bf16_as_bits(...)`: True only under Triton's interpreter
#: (its bf16 casts are wrong, so bf16 moves as int16 bits there). On a GPU the body of an `if FLAG:`
#: is never compiled, so a mutant inside it cannot change a compiled kernel.
#: tests/test_shrinking.py holds every launch of these flags to bf16_as_bits.
INTERPRETER_FLAGS = ("BF16_BITS", "MASK_BF16_BITS", "X_BITS", "Y_BITS")


def _flag_body(node: ast.AST, field: str) -> bool:
    return (isinstance(node, ast.If) and field == "body" and isinstance(node.test, ast.Name)
            and node.test.id in INTERPRETER_FLAGS)


def node_key(n: ast.AST) -> tuple:
    """Where a node stands in its source (a fresh parse of the same source gives the same key)."""
    return (n.lineno, n.col_offset, n.end_lineno, n.end_col_offset, type(n).__name__)


def interpreter_only_nodes(source: str) -> set[tuple]:
    """`node_key`s of the nodes of `jit_functions(source)` that only the interpreter runs: inside the
    body of an `if FLAG:` (INTERPRETER_FLAGS), or anywhere in a jit function whose every call is
    such a node."""
    fns = jit_functions(source)
    inside: set[tuple] = set()
    calls: dict[str, list[bool]] = {name: [] for name in fns}

    def rec(node: ast.AST, on: bool) -> None:
        if on and hasattr(node, "end_lineno"):
            inside.add(node_key(node))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in calls:
            calls[node.func.id].append(on)
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    rec(child, on or _flag_body(node, field))

    for fn in fns.values():
        for stmt in fn.body:
            rec(stmt, False)
    for name, on in calls.items():
        if on and all(on):
            inside |= {node_key(n) for n in ast.walk(fns[name]) if hasattr(n, "end_lineno")}
    return inside


def _rescale_names(fn: ast.FunctionDef) -> set[str]:
    """Names assigned from an expression that calls exp2/exp: the factors a rescale multiplies by
    (the parameters of the lane helpers named e/f/alpha are that too)."""
    names = {a.arg for a in fn.args.args if a.arg in ("e", "f", "alpha")}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            if any(isinstance(c, ast.Call) and is_tl(c.func, "exp2", "exp") for c in ast.walk(n.value)):
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
    interp_only = interpreter_only_nodes(source)
    ops = {k: OPERATORS[k] for k in (operators or OPERATORS) if k in OPERATORS}
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

            # ast.get_source_segment re-splits the whole module per call; the offsets are a and b's
            # (col offsets count bytes: the kernels are ASCII)
            def seg(n: ast.AST) -> str:
                if getattr(n, "end_lineno", None) is None:
                    return ""
                return source[starts[n.lineno - 1] + n.col_offset:starts[n.end_lineno - 1] + n.end_col_offset]

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
                        description=desc, specs=fn_specs[name], source=new_source,
                        interpreter_only=node_key(node) in interp_only))
    return out


def hand_mutants(module: str, family: str) -> list[Mutant]:
    """The hand-written mutants of kernels/<module>.py (`between_launches.HAND_MUTANTS`). Raises
    ValueError when one no longer matches the source exactly once: its code moved or changed."""
    source = module_file(module).read_text()
    out = []
    for h in between_launches.HAND_MUTANTS:
        if h.module != module:
            continue
        if source.count(h.old) != 1:
            raise ValueError(f"hand mutant of {module}.{h.function} ({h.description}): its code appears "
                             f"{source.count(h.old)} times in kernels/{module}.py, not once; update "
                             "flashcheck/mutation/between_launches.py")
        at = source.index(h.old)
        line = source.count("\n", 0, at) + 1
        k = 1 + sum(m.line == line for m in out)
        out.append(Mutant(id=f"{module}:{h.function}:{between_launches.OPERATOR}:{line}:{k}", module=module,
                          family=family, function=h.function, operator=between_launches.OPERATOR, line=line,
                          description=h.description, specs=h.specs, source=source.replace(h.old, h.new)))
    return out


def all_mutants(*, modules: list[str] | None = None, **kw: Any) -> list[Mutant]:
    out = []
    for t in ALL_TARGETS:
        if not modules or t.module in modules:
            out += generate(t, **kw)
    for module, family in {t.module: t.family for t in reversed(ALL_TARGETS)}.items():  # a module's first family
        if (not modules or module in modules) and (not kw.get("operators")
                                                   or between_launches.OPERATOR in kw["operators"]):
            out += hand_mutants(module, family)
    return out




def select(mutants: list[Mutant], *, functions: list[str] | None, operators: list[str] | None,
           sample: int | None, seed: int, gpu_only: bool = False, interpreted: bool = True) -> list[Mutant]:
    """gpu_only: keep the GPU-only operators' mutants; interpreted: keep the interpreter-only ones."""
    out = [m for m in mutants if (not functions or m.function in functions)
           and (not operators or m.operator in operators)
           and (gpu_only or m.operator not in GPU_ONLY_OPERATORS)
           and (interpreted or not m.interpreter_only)]
    if sample is not None and sample < len(out):
        out = sorted(random.Random(seed).sample(out, sample), key=out.index)
    return out
