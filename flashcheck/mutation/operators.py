"""The mutation operators: each looks at one AST node of a `@triton.jit` function and proposes
replacement texts for it (one mutant each)."""
from __future__ import annotations

import ast
import re
from typing import Callable

from flashcheck.mutation import between_launches

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


def is_tl(node: ast.AST, *names: str) -> bool:
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
    if isinstance(node, ast.Call) and is_tl(node.func, "load", "store"):
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
    if isinstance(node, ast.Call) and is_tl(node.func, "load") and any(k.arg == "other" for k in node.keywords):
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
    if isinstance(node, ast.Call) and is_tl(node.func, "where") and len(node.args) == 3:
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
        is_alloc = is_tl(node.func, "zeros", "full")
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
    if isinstance(node, ast.Attribute) and is_tl(node, *swap) and ctx.get("is_call_func"):
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




# Operators whose mutants only a GPU run can kill: int32 offsets overflow only past 2^31 elements
# (or strides), tensors the interpreter cannot hold; the GPU tests (flashcheck/suite/test_softmax_gpu.py
# test_more_than_2_31_elements, test_strides_past_2_31) are the ones that can see them. And the
# hand-written mutants of state kept between launches (flashcheck/mutation/between_launches.py).
GPU_ONLY_OPERATORS = ("narrow_int64", between_launches.OPERATOR)
