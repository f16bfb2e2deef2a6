"""Out-of-bounds memory accesses caught under Triton's interpreter, as they would fault (or read
another tensor's data) on a GPU.

Triton's interpreter turns every tensor argument into its raw host address and lets ``tl.load`` /
``tl.store`` read and write any address: a kernel reading one element past its row gets whatever
lies there (often the next row, or the guard bytes around a view) and the CPU run passes where a
GPU raises "an illegal memory access was encountered" or silently reads another tensor.

:func:`install` makes every launch record its pointer arguments with the byte extent of the view
each one was handed, ``[data_ptr + min offset, data_ptr + max offset + itemsize)`` from sizes and
strides (the view, not its whole storage: reading past a view inside a guard buffer is caught),
and checks every active lane of every load, store and atomic (block pointers and tensor
descriptors included) against it. Each pointer value carries the argument it was derived from
(propagated through ``+``, splat, broadcast, reshape, ...); a pointer whose origin is lost (cast
through an integer, a ``tl.where`` between two arguments) must at least fall inside some
argument. A violation raises :class:`OutOfBoundsAccess` naming the kernel, the access, the
parameter, the element offsets and how far they miss. ``FLASHCHECK_OOB_CHECK=0`` switches it off.
"""
from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KernelFault", "OutOfBoundsAccess", "ENV", "enabled", "install", "extent_of"]

ENV = "FLASHCHECK_OOB_CHECK"
_ORIGIN = "_flashcheck_origin"  # attribute set on the interpreter's TensorHandle of a pointer
_MAX_SHOWN = 6


class KernelFault(AssertionError):
    """The interpreter caught the kernel doing what fails on a GPU: every property would see it."""


class OutOfBoundsAccess(KernelFault):
    """A kernel under the interpreter read or wrote memory outside the tensors it was given."""


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def extent_of(t: Any) -> tuple[int, int]:
    """The bytes a tensor view covers, [lo, hi) as absolute addresses (lo == hi: empty)."""
    base, size = t.data_ptr(), t.element_size()
    if t.numel() == 0:
        return base, base
    lo = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    return base + lo * size, base + (hi + 1) * size


@dataclass
class _Arg:
    name: str
    data_ptr: int
    lo: int
    hi: int
    desc: str


@dataclass
class _Launch:
    kernel: str
    args: list[_Arg] = field(default_factory=list)
    by_id: dict[int, int] = field(default_factory=dict)  # id(host tensor) -> index in args


_STACK: list[_Launch] = []
#: exceptions that are the kernel's failure, re-raised as they are rather than as Triton's InterpreterError
KERNEL_FAILURES: list[type] = [KernelFault]


def _describe(t: Any) -> str:
    dtype = str(getattr(t, "dtype", "?")).replace("torch.", "")
    return f"{dtype} tensor of shape {tuple(t.shape)}, strides {tuple(t.stride())}"


def _record(launch: _Launch, name: str, arg: Any) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(arg, tuple):
        for i, a in enumerate(arg):
            _record(launch, f"{name}[{i}]", a)
    elif isinstance(arg, TensorDescriptor):
        _record(launch, f"{name}.base", arg.base)
    elif hasattr(arg, "data_ptr"):
        t = getattr(arg, "base", arg) if type(arg).__name__ == "TensorWrapper" else arg
        lo, hi = extent_of(t)
        launch.by_id[id(arg)] = len(launch.args)
        launch.args.append(_Arg(name, arg.data_ptr(), lo, hi, _describe(t)))


# --- the check -----------------------------------------------------------------------------------

def _where() -> str:
    """The kernel's source lines on the stack (innermost first), for the message."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the engine (flashcheck/)
    out = []
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if f.f_code.co_name == "__call__" and "args_dev" in f.f_code.co_varnames:  # GridExecutor: the launch
            break
        if "triton" + os.sep not in path and not os.path.abspath(path).startswith(here):
            out.append(f"{os.path.relpath(path) if path.startswith(os.getcwd()) else path}:{f.f_lineno}")
        f = f.f_back
    return " <- ".join(dict.fromkeys(out))


def _violation(kind: str, launch: _Launch, addr: np.ndarray, bad: np.ndarray, active: int,
               itemsize: int, origin: int | None, program: Any) -> OutOfBoundsAccess:
    wrong = addr[bad].astype(np.uint64)
    if origin is not None:
        a = launch.args[origin]
        how = ""
    else:  # no provenance: name the nearest argument whose base lies below the address
        below = [i for i, a in enumerate(launch.args) if a.data_ptr <= int(wrong.min())]
        a = launch.args[max(below, key=lambda i: launch.args[i].data_ptr)] if below else None
        how = " (pointer of unknown origin, outside every argument; nearest argument below it)"
        if a is None:
            return OutOfBoundsAccess(
                f"out-of-bounds {kind} in kernel {launch.kernel}: {len(wrong)} of {active} active lanes use "
                f"addresses below every pointer argument ({', '.join(x.name for x in launch.args) or 'none'})"
                + (f" at {_where()}" if _where() else ""))
    off = (wrong.view(np.int64) - np.int64(a.data_ptr)) // itemsize
    lo_e, hi_e = (a.lo - a.data_ptr) // itemsize, (a.hi - a.data_ptr) // itemsize
    shown = np.unique(off)
    listed = ", ".join(str(int(x)) for x in shown[:_MAX_SHOWN]) + (", ..." if len(shown) > _MAX_SHOWN else "")
    past = off[off >= hi_e]
    before = off[off < lo_e]
    miss = []
    if past.size:
        miss.append(f"up to {int(past.max()) - hi_e + 1} element(s) past the end")
    if before.size:
        miss.append(f"up to {lo_e - int(before.min())} element(s) before the start")
    valid = "the tensor is empty" if a.lo == a.hi else f"valid element offsets [{lo_e}, {hi_e})"
    verb = {"load": "read", "store": "write", "atomic": "update"}[kind]
    where = _where()
    return OutOfBoundsAccess(
        f"out-of-bounds {kind} in kernel {launch.kernel}{how}, program {tuple(program or ())}: {len(wrong)} of {active} active lanes {verb} "
        f"{a.name} ({a.desc}; {valid}) at element offset(s) {listed} ({'; '.join(miss) or 'outside the view'})"
        + (f" at {where}" if where else "")
        + ". On a GPU this is an illegal memory access or a silent read/write of other data.")


def check_access(kind: str, ptrs: Any, mask: Any, program: Any = None) -> None:
    """Raise OutOfBoundsAccess when an active lane of ``ptrs`` (a pointer TensorHandle) falls
    outside the argument it points into."""
    if not _STACK:
        return
    launch = _STACK[-1]
    if not launch.args:
        return
    addr = np.asarray(ptrs.data)
    if addr.dtype != np.uint64:
        return
    elt = ptrs.get_element_ty()
    itemsize = max(1, elt.primitive_bitwidth // 8)
    m = None if mask is None else np.asarray(getattr(mask, "data", mask), dtype=bool)
    origin = getattr(ptrs, _ORIGIN, None)
    if origin is not None:
        a = launch.args[origin]
        bad = (addr < np.uint64(a.lo)) | (addr > np.uint64(max(a.hi - itemsize, 0)))
        if a.hi - a.lo < itemsize:
            bad = np.ones(addr.shape, dtype=bool)
    else:
        los = np.array([x.lo for x in launch.args], dtype=np.uint64)
        his = np.array([x.hi for x in launch.args], dtype=np.uint64)
        flat = addr.reshape(-1, 1)
        inside = ((flat >= los) & (flat + np.uint64(itemsize) <= his)).any(axis=1)
        bad = ~inside.reshape(addr.shape)
    if m is not None:
        bad = bad & m
    if not bad.any():
        return
    active = int(np.broadcast_to(m, addr.shape).sum()) if m is not None else addr.size
    bad = np.broadcast_to(bad, addr.shape)
    raise _violation(kind, launch, np.broadcast_to(addr, bad.shape), bad, active, itemsize, origin, program)


# --- the patch -----------------------------------------------------------------------------------

# builder methods whose result is derived from their pointer operands: the origin follows
_PROPAGATE = ("create_addptr", "create_splat", "create_broadcast", "create_expand_dims", "create_reshape",
              "create_trans", "create_cat", "create_join", "create_split", "create_unsplat", "create_bitcast",
              "ternary_op", "create_gather")
_installed = False


def _origin_of(values: Any) -> int | None:
    found = None
    for v in values:
        o = getattr(v, _ORIGIN, None)
        if o is None:
            continue
        if found is not None and found != o:
            return None  # two arguments mixed (tl.where between them): fall back to "inside some argument"
        found = o
    return found


def _propagating(fn: Any) -> Any:
    def run(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        o = _origin_of(args)
        if o is not None:
            for h in (out if isinstance(out, tuple) else (out,)):
                if getattr(h, "dtype", None) is not None and h.dtype.is_ptr():
                    setattr(h, _ORIGIN, o)
        return out
    run.__name__ = getattr(fn, "__name__", "run")
    return run


def _checked(fn: Any, kind: str, p: int, m: int | None) -> Any:
    def run(self, *args, **kwargs):
        check_access(kind, args[p], None if m is None else args[m], self.grid_idx)
        return fn(self, *args, **kwargs)
    run.__name__ = fn.__name__
    return run


def install(interp: types.ModuleType) -> None:
    """Hook the bounds check into this process's Triton interpreter (idempotent)."""
    global _installed
    if _installed:
        return
    from triton.runtime.errors import InterpreterError

    B, GE = interp.InterpreterBuilder, interp.GridExecutor
    for name in _PROPAGATE:
        setattr(B, name, _propagating(B.__dict__[name]))

    # (method, access, index of the pointer operand, index of the mask operand or None)
    for name, kind, p, m in (("create_masked_load", "load", 0, 1), ("create_masked_store", "store", 0, 2),
                             ("create_atomic_rmw", "atomic", 1, 3), ("create_atomic_cas", "atomic", 0, None)):
        setattr(B, name, _checked(B.__dict__[name], kind, p, m))

    # block pointers and tensor descriptors: the materialized pointers keep the base's origin
    for cls in (interp.BlockPointerHandle, interp.TensorDescHandle):
        def materialize(self, *args, _orig=cls.materialize_pointers):
            ptrs, masks = _orig(self, *args)
            o = getattr(self.base, _ORIGIN, None)
            if o is not None:
                setattr(ptrs, _ORIGIN, o)
            return ptrs, masks
        cls.materialize_pointers = materialize

    # the launch: record the host copies' extents, tag the pointers made from them
    init_args, call, implicit_cvt = GE._init_args_hst, GE.__call__, interp._implicit_cvt

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        if _STACK and enabled():
            import inspect
            try:
                named = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
            except TypeError:  # Triton reports the bad call itself
                named = {}
            for name, arg in named.items():
                if name not in self.constexprs:
                    _record(_STACK[-1], name, arg)
        return args_hst, kwargs_hst

    def _implicit_cvt(arg):
        out = implicit_cvt(arg)
        if _STACK and hasattr(arg, "data_ptr"):
            i = _STACK[-1].by_id.get(id(arg))
            if i is not None:
                setattr(out.handle, _ORIGIN, i)
        return out

    def __call__(self, *args_dev, **kwargs):
        _STACK.append(_Launch(kernel=getattr(self.fn, "__name__", "?")))
        try:
            return call(self, *args_dev, **kwargs)
        except InterpreterError as e:
            cause = e.__cause__  # wrapped once more per @triton.jit helper the access was made in
            while isinstance(cause, InterpreterError):
                cause = cause.__cause__
            if isinstance(cause, tuple(KERNEL_FAILURES)):  # the kernel's failure, not the interpreter's
                raise cause.with_traceback(None) from None
            raise
        finally:
            _STACK.pop()

    GE._init_args_hst, GE.__call__ = _init_args_hst, __call__
    interp._implicit_cvt = _implicit_cvt
    _installed = True
