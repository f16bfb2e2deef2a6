"""Triton's interpreter without its repeated language patching (docs/interpreter.md).

Triton 3.6's interpreter patches `triton.language` (every builtin of `tl`, `tl.tensor`, `tl.math`
and `tl.core`, found by `inspect.getmembers`) at each launch, and again at every call of a
`@triton.jit` helper from inside the kernel, without undoing the helper's patch: the launch's own
patch is still in place then, so the repeat finds nothing left to patch and only pays for the
scan. A kernel that calls helpers in its loops (the split and online softmax, attention's key
blocks) spent a third of its CPU time there (cProfile of one ci-profile test, softmax_split fp32
neg_inf_padding: 23.7 s of 72 s in 87,625 `_patch_builtin` calls).

Here a helper called inside a launch is not patched again when the modules it sees (its globals'
`tl` / `tl.core`; triton.language's own jit helpers see `core`) were patched earlier in that launch,
by the launch or by a helper (whose patch Triton never undoes either); anything else is patched as
before, and the launch restores what it patched, as before. Nothing a kernel computes changes.

Two more per-operation costs are cut the same way. `_get_np_dtype` (Triton's dtype -> NumPy dtype,
called for every cast, constant and load) builds a 19-entry dict of `tl.dtype` keys at each call:
9.8 s of an 88 s cProfile in 203,312 calls (softmax_split fp16 neg_inf_padding); here the answer
is kept per element type, computed by Triton's own function the first time. `tl.tuple_type`
formats its name when built (`_lazy_tuple_type_name`); here it is formatted when read. Block types,
tensor shapes and same-shape broadcasts are shared or short-cut, and the int32 overflow checks whose
assert the interpreter drops are not computed (each function below says what it measured).
"""
from __future__ import annotations

import inspect
import types

_installed = False
_LAUNCHES: list = []  # per launch in progress: the language modules its patch covers (None: not yet)


_LANGS: dict = {}  # function -> the language modules among its globals (fixed once it is imported)


def _langs(fn, tl, core) -> frozenset[int]:
    langs = _LANGS.get(fn)
    if langs is None:  # a scan of the whole module's globals: 3.7 s of 103 in 32,207 calls
        langs = _LANGS[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                       if inspect.ismodule(v) and (v is tl or v is core))
    return langs


def _lazy_tuple_type_name(core) -> None:
    """`tl.tuple_type` formats its name (every field and type) when built, and the interpreter builds
    one for every tuple a helper returns or takes (1.3 million, 20.9 s of a 103 s cProfile); only
    printing reads the name. Here it is formatted when read."""
    from flashcheck.interpreter.patching import _replace

    cls = core.tuple_type
    if isinstance(cls.__dict__.get("name"), property):
        return

    def __init__(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def name(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'

    _replace(cls, "__init__", __init__)
    # A setter that drops the value: Triton's own __init__ (a subclass's super() call) still works.
    _replace(cls, "name", property(name, lambda self, value: None))


def _cached_block_types(core) -> None:
    """`tl.block_type` validates and formats its shape each time one is built, and the interpreter
    builds one for every operation's result (83,323 builds, 4.1 s of a 23 s cProfile of softmax_online
    fp16 long_uniform), nearly always a shape and element type it built before. Here each
    (element type, shape) is built once and shared: a block type is never changed after it is built
    (no attribute is assigned outside its __init__ in Triton 3.6's language and interpreter)."""
    from flashcheck.interpreter.patching import _replace

    cls = core.block_type
    if "_flashcheck_cache" in cls.__dict__:
        return
    init = cls.__init__
    cache: dict = {}

    def __new__(klass, element_ty=None, shape=None):
        if klass is not cls or shape is None:
            return object.__new__(klass)
        try:
            key = (element_ty, tuple(getattr(d, "value", d) for d in shape))
            obj = cache.get(key)
        except TypeError:  # unhashable: built as before
            return object.__new__(klass)
        if obj is None:
            obj = object.__new__(klass)
            init(obj, element_ty, shape)
            cache[key] = obj
        return obj

    def __init__(self, element_ty, shape):
        if "name" not in self.__dict__:  # not built by __new__ (a subclass, an unhashable shape)
            init(self, element_ty, shape)

    if "__new__" not in cls.__dict__:
        # What `interpreter.unpatched()` puts back: a class's __new__ once assigned and then
        # deleted no longer accepts __init__'s arguments (CPython keeps the slot wrapper).
        setattr(cls, "__new__", staticmethod(lambda klass, *args, **kwargs: object.__new__(klass)))
    _replace(cls, "__new__", __new__)
    _replace(cls, "__init__", __init__)
    _replace(cls, "_flashcheck_cache", cache)


def _cached_tensor_shapes(core) -> None:
    """`tl.tensor.__init__` rebuilds its shape as a `tl.tuple` of constexprs (a tuple type built for
    it too) for every value the interpreter makes: 287,818 tensors, 5.6 s of a 31.5 s cProfile of
    softmax_split fp32 neg_inf_padding. Here that shape and numel are built once per type (by its
    name, which spells the element type and the shape) and shared; nothing assigns to them later."""
    import math

    from flashcheck.interpreter.patching import _replace

    cls = core.tensor
    if "_flashcheck_shapes" in cls.__dict__:
        return
    init = cls.__init__
    constexpr, tl_tuple = core.constexpr, core.tuple
    shapes: dict = {}

    def __init__(self, handle, type):
        key = getattr(type, "name", None)
        if not isinstance(key, str):
            return init(self, handle, type)
        got = shapes.get(key)
        if got is None:
            shape = type.shape if type.is_block() else ()
            got = shapes[key] = (constexpr(math.prod(shape)), tl_tuple([constexpr(d) for d in shape]))
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.numel, self.shape = got

    _replace(cls, "__init__", __init__)
    _replace(cls, "_flashcheck_shapes", shapes)


def _same_shape_broadcast(semantic_cls) -> None:
    """`broadcast_impl_value` compares the operands' shapes dimension by dimension before every binary
    operation (129,948 calls, 10 s of a 37 s cProfile of softmax_split fp32 neg_inf_padding); when
    both operands are scalars, or blocks of one shape (shared block types make that one identity
    test), it returns them unchanged anyway. Those cases return at once; the rest run Triton's own."""
    from flashcheck.interpreter.patching import _replace

    if "_flashcheck_fast" in semantic_cls.__dict__:
        return
    broadcast = semantic_cls.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        lt, rt = lhs.type, rhs.type
        if lt is rt or (not lt.is_block() and not rt.is_block()):
            return lhs, rhs
        return broadcast(self, lhs, rhs)

    _replace(semantic_cls, "broadcast_impl_value", broadcast_impl_value)
    _replace(semantic_cls, "_flashcheck_fast", True)


def _no_dropped_overflow_checks(semantic_cls) -> None:
    """Triton 3.6 checks every 32-bit integer add, sub and mul for overflow: it casts both operands
    to int64, repeats the operation, compares the result with the type's bounds and hands that to
    `device_assert`, which returns at once unless the builder's options ask for debug; the
    interpreter's never do (`InterpreterOptions.debug` is False). So the interpreter computed every
    check and dropped it: 5.6 s of the 14.3 s interpreting kernels in a cProfile of
    `test_adversarial_class[attention-bf16-varlen_batches]` (ci profile). Here the check is skipped
    exactly when its assert would be dropped; with debug on, Triton's own runs."""
    from flashcheck.interpreter.patching import _replace

    if "_flashcheck_no_dropped_checks" in semantic_cls.__dict__:
        return
    check = semantic_cls.binary_op_sanitize_overflow_impl

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if not self.builder.options.debug:
            return None
        return check(self, lhs, rhs, binary_op)

    _replace(semantic_cls, "binary_op_sanitize_overflow_impl", binary_op_sanitize_overflow_impl)
    _replace(semantic_cls, "_flashcheck_no_dropped_checks", True)


def install(interp: types.ModuleType) -> None:
    """Hook into this process's Triton interpreter (idempotent)."""
    global _installed
    if _installed:
        return
    import triton.language as tl

    from flashcheck.interpreter.patching import _replace, patch_error

    patch_lang = getattr(interp, "_patch_lang", None)
    grid = getattr(interp, "GridExecutor", None)
    if patch_lang is None or grid is None or "__call__" not in grid.__dict__ \
            or not hasattr(interp, "_LangPatchScope"):
        raise patch_error("triton.runtime.interpreter._patch_lang / GridExecutor.__call__ changed")
    grid_call = grid.__dict__["__call__"]

    def _patch_lang(fn):
        langs = _langs(fn, tl, tl.core)
        if _LAUNCHES and _LAUNCHES[-1] is not None and langs <= _LAUNCHES[-1]:
            return interp._LangPatchScope()  # covered by the launch's patch: nothing to restore
        scope = patch_lang(fn)
        if _LAUNCHES:  # the launch's own patch, or a helper's (Triton never undoes those either)
            _LAUNCHES[-1] = langs | (_LAUNCHES[-1] or frozenset())
        return scope

    def __call__(self, *args, **kwargs):
        _LAUNCHES.append(None)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    get_np_dtype = getattr(interp, "_get_np_dtype", None)
    if get_np_dtype is None:
        raise patch_error("triton.runtime.interpreter._get_np_dtype is gone")
    known: dict = {}

    def _get_np_dtype(tt_dtype):
        # Triton's answer depends on the element type alone (any pointer: uint64).
        el = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        key = "*" if isinstance(el, tl.pointer_type) else el.name
        np_dtype = known.get(key)
        if np_dtype is None:
            np_dtype = known[key] = get_np_dtype(tt_dtype)
        return np_dtype

    _replace(interp, "_patch_lang", _patch_lang)
    _replace(grid, "__call__", __call__)
    _replace(interp, "_get_np_dtype", _get_np_dtype)
    _lazy_tuple_type_name(tl.core)
    _cached_block_types(tl.core)
    _cached_tensor_shapes(tl.core)
    _same_shape_broadcast(interp.TritonSemantic)
    _no_dropped_overflow_checks(interp.TritonSemantic)
    _installed = True
