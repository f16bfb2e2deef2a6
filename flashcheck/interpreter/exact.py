"""An exact Triton interpreter for bf16, and autotuned kernels that run under it.

Triton's interpreter (``TRITON_INTERPRET=1``) keeps bf16 tensors as raw ``uint16`` bit patterns but
converts them with a helper that truncates fp32 -> bf16 instead of rounding to nearest even and
mangles subnormals both ways; bf16 arithmetic, comparisons, reductions and ``tl.dot`` then run
NumPy on the raw bit patterns (triton #11584). A correct kernel fails on the CPU for reasons that are
the interpreter's, not the kernel's. :func:`install` replaces those few interpreter functions with
exact ones:

* conversions (``.to``, implicit casts in ``tl.store``/``tl.where``/arithmetic, bf16 constants):
  bf16 -> wider formats exact (a 16-bit shift, NaN payload kept, as the hardware does); fp32, fp16,
  fp64 and integers -> bf16 rounded once to nearest even, subnormals kept, overflow to inf, NaN to a
  quiet NaN (0x7FC0, as torch); ``fp_downcast_rounding="rtz"`` rounds toward zero;
* bf16 arithmetic, comparisons, min/max, clamp, fma, reductions and scans: computed on the exact
  fp32 values and rounded to bf16 once (a correctly rounded bf16 result for + - *, what the
  hardware gives);
* bf16 ``tl.dot``: operands widened exactly to fp32 (products of 8-bit significands are exact in
  fp32), accumulated in fp32.

Bit casts (``.to(..., bitcast=True)``), loads and stores of raw bits are untouched. fp16 needs
little: NumPy's float16 conversions round to nearest even with subnormals; the patch only makes a
narrowed signalling NaN quiet and adds ``fp_downcast_rounding="rtz"``.

``@triton.autotune`` kernels fail under the interpreter ("0 active drivers": the autotuner asks the
GPU driver for a benchmarker); :func:`install` makes them run with their first config
(:mod:`flashcheck.interpreter.autotune` forces one config, or each in turn).

The patch replaces functions of Triton's interpreter by name; :func:`install` checks they exist with
the expected signatures and then checks the patched interpreter against known answers, and raises
:class:`InterpreterPatchError` naming the Triton version when either check fails, rather than
leaving a silently inexact interpreter.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

import numpy as np

from flashcheck.interpreter.patching import (  # re-exported: the interpreter's public face
    _DOT_FLOATS, InterpreterPatchError, _replace, _triton_version, fixed_order_dot, interpreting, patch_error, unpatched,
)
# The exact bf16 <-> float conversions on bit patterns (NumPy, vectorised) live with the formats;
# re-exported here, the interpreter's public face.
from flashcheck.oracles.formats import QNAN_BF16, bf16_bits_to_f32, f32_to_bf16_bits, f64_to_bf16_bits

__all__ = [
    "InterpreterPatchError", "interpreting", "install", "installed", "unpatched", "bf16_bits_to_f32",
    "f32_to_bf16_bits", "f64_to_bf16_bits", "patch_error", "UNFIXED_INTERPRETER_BUGS", "skip_if_interpreter_bug",
]


# --- exact bf16 <-> float conversions ------------------------------------------------------------

def _to_float(data: np.ndarray, ty: Any) -> np.ndarray:
    """A handle's data as exact float values (bf16 decoded; fp16/fp32/fp64 as they are)."""
    return bf16_bits_to_f32(data) if ty.name == "bf16" else data


def _quiet_f16(values: np.ndarray) -> np.ndarray:
    """NumPy keeps a signalling NaN signalling when it narrows to float16; the hardware quiets it."""
    nan = np.isnan(values)
    if not nan.any():
        return values
    bits = values.view(np.uint16)
    return np.where(nan, bits | np.uint16(0x0200), bits).view(np.float16)


def _round_toward_zero(x: np.ndarray, dst: Any, np_dtype: np.dtype) -> np.ndarray:
    """Exact float64 values -> ``dst`` rounded toward zero (bf16 as bits)."""
    if dst.name == "bf16":
        bits = f64_to_bf16_bits(x)
        away = np.abs(bf16_bits_to_f32(bits).astype(np.float64)) > np.abs(x)
        return np.where(away & ~np.isnan(x), bits - np.uint16(1), bits).astype(np.uint16)
    with np.errstate(over="ignore"):
        t = x.astype(np_dtype)
    away = np.abs(t.astype(np.float64)) > np.abs(x)
    t = np.where(away, np.nextafter(t, np_dtype.type(0)), t).astype(np_dtype)
    return _quiet_f16(t) if np_dtype == np.float16 else t


# --- the patch -----------------------------------------------------------------------------------

_STANDARD_FLOATS = ("fp16", "bf16", "fp32", "fp64")

# What the patch replaces, with the parameters it expects (a Triton whose interpreter differs fails
# loudly here instead of running inexact).
_EXPECTED = {
    "InterpreterBuilder.cast_impl": ["self", "src", "dst_type"],
    "InterpreterBuilder.create_fp_to_fp": ["self", "src", "dst_type", "rounding_mode"],
    "InterpreterBuilder.binary_op": ["self", "lhs", "rhs", "op"],
    "InterpreterBuilder.unary_op": ["self", "arg", "op"],
    "InterpreterBuilder.create_clampf": ["self", "arg", "lo", "hi", "propagate_nans"],
    "InterpreterBuilder.create_fma": ["self", "x", "y", "z"],
    "InterpreterBuilder.create_dot": ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"],
    "InterpreterBuilder.create_tensor_pointer_load": [
        "self", "ptr", "boundary_check", "padding_option", "cache_modifier", "eviction_policy", "is_volatile"],
    "InterpreterBuilder.create_masked_load": [
        "self", "ptrs", "mask", "other", "cache_modifier", "eviction_policy", "is_volatile"],
    "ReduceOps.min_max": ["self", "input", "val_reduce_op", "idx_reduce_op"],
    "ReduceOps.sum": ["self", "input"],
    "ScanOps.cumsum": ["self", "input"],
    "ScanOps.cumprod": ["self", "input"],
}

_installed = False



def _fma_round_to_odd(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z for bf16-valued x, y, z as a float64 rounded to odd, so that one more rounding to
    bf16 (or fp16, fp32: any format of at most 51 bits) is the correctly rounded fma, as the GPU's.
    x * y is exact in float64 (8-bit significands); the sum's error comes from TwoSum. Rounding the
    sum to nearest and then to bf16 would round twice (the GPU run of tests/test_interpreter.py
    found 2 of 1000 bf16 fmas 1 ulp apart)."""
    with np.errstate(all="ignore"):
        p = x * y
        s = p + z
        bp = s - p
        e = (p - (s - bp)) + (z - bp)
        odd = (s.view(np.int64) & 1) == 1
        fix = np.isfinite(s) & (e != 0) & ~odd
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s





def installed() -> bool:
    """True once :func:`install` has patched this process's interpreter."""
    return _installed





def _check_internals(interp: types.ModuleType) -> None:
    for dotted, params in _EXPECTED.items():
        cls_name, name = dotted.split(".")
        fn = getattr(getattr(interp, cls_name, None), name, None)
        if fn is None:
            raise patch_error(f"triton.runtime.interpreter.{dotted} is missing")
        got = list(inspect.signature(fn).parameters)
        if got != params:
            raise patch_error(f"triton.runtime.interpreter.{dotted} takes {got}, expected {params}")
    import triton.language as tl
    if getattr(interp, "_get_np_dtype", lambda t: None)(tl.bfloat16) != np.dtype(np.uint16):
        raise patch_error("the interpreter no longer keeps bf16 as uint16 bit patterns")
    if not hasattr(interp, "TensorHandle"):
        raise patch_error("triton.runtime.interpreter.TensorHandle is missing")


def install() -> bool:
    """Make this process's Triton interpreter exact for bf16 and able to run autotuned kernels.

    Does nothing (returns False) when kernels do not run in the interpreter; idempotent. Raises
    :class:`InterpreterPatchError` when the installed Triton's interpreter is not the expected one
    or the patched interpreter fails its self-check."""
    global _installed
    if not interpreting():
        return False
    if _installed:
        return True
    import triton.runtime.interpreter as interp

    _check_internals(interp)
    _patch_index(interp)
    _patch_builder(interp)
    _patch_reduce_scan(interp)
    from flashcheck.interpreter import autotune

    autotune.install(default_first=True)
    _installed = True
    _self_check(interp)
    from flashcheck.interpreter import bounds as interp_bounds  # docs/interpreter.md
    from flashcheck.interpreter import gpu as interp_gpu
    from flashcheck.interpreter import speed as interp_speed
    interp_bounds.install(interp)
    interp_gpu.install(interp)
    interp_speed.install(interp)
    return True


def _patch_index(interp: types.ModuleType) -> None:
    """A scalar used as an index or a loop bound (`range(lo, hi, BLOCK)` with run-time `lo`): Triton
    3.6 converts it with `int(ndarray)`, which NumPy >= 2.4 refuses for the 1-element arrays its
    scalars are, so every kernel with a run-time loop bound failed with an InterpreterError (and a
    broken environment looked like a broken kernel). `.item()` takes the one element."""
    patch_tensor = getattr(interp, "_patch_lang_tensor", None)
    if patch_tensor is None:
        raise patch_error("triton.runtime.interpreter._patch_lang_tensor is missing")

    def _patch_lang_tensor(tensor, scope) -> None:  # noqa: ANN001
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0])
                       if self.handle.data.size == 1 else int(self.handle.data))

    _replace(interp, "_patch_lang_tensor", _patch_lang_tensor)


def _patch_builder(interp: types.ModuleType) -> None:
    import triton.language as tl
    from triton._C.libtriton import ir

    B, TH = interp.InterpreterBuilder, interp.TensorHandle
    orig = {n: B.__dict__[n] for n in (
        "cast_impl", "create_fp_to_fp", "binary_op", "unary_op", "create_clampf", "create_fma",
        "create_dot", "create_tensor_pointer_load")}

    def is_bf16(h: Any) -> bool:
        # handles of comparisons carry their operand's dtype and bool data: those are not bf16
        return h.dtype.scalar == tl.bfloat16 and h.data.dtype == np.uint16

    def encode(values: np.ndarray) -> Any:
        return TH(f32_to_bf16_bits(values), tl.bfloat16)

    def as_f32(h: Any) -> Any:
        return TH(bf16_bits_to_f32(h.data), tl.float32) if is_bf16(h) else h

    def convert(data: np.ndarray, src: Any, dst: Any) -> np.ndarray:
        if src.name == "bf16":
            return bf16_bits_to_f32(data).astype(interp._get_np_dtype(dst))
        if src.name in ("fp32", "fp16"):
            return f32_to_bf16_bits(data.astype(np.float32))  # fp16 -> fp32 is exact
        return f64_to_bf16_bits(data.astype(np.float64))  # fp64; integers (exact up to 2**53)

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s != d and tl.bfloat16 in (s, d):
            return TH(convert(src.data, s, d), d)
        out = orig["cast_impl"](self, src, dst_type)
        if d == tl.float16 and s.name in ("fp32", "fp64"):
            out = TH(_quiet_f16(out.data), d)
        return out

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if s.name not in _STANDARD_FLOATS or d.name not in _STANDARD_FLOATS:
            return orig["create_fp_to_fp"](self, src, dst_type, rounding_mode)  # fp8: not ours
        if rounding_mode != ir.ROUNDING_MODE.RTZ or d.primitive_bitwidth >= s.primitive_bitwidth:
            return self.cast_impl(src, dst_type)
        x = _to_float(src.data, s).astype(np.float64)
        return TH(_round_toward_zero(x, d, interp._get_np_dtype(d)), d)

    def get_bf16(self, value):
        return TH(f64_to_bf16_bits(np.array([value], dtype=np.float64)), tl.bfloat16)

    def binary_op(self, lhs, rhs, op):
        if not (is_bf16(lhs) or is_bf16(rhs)):
            return orig["binary_op"](self, lhs, rhs, op)
        out = op(as_f32(lhs).data, as_f32(rhs).data)
        return TH(out, tl.int1) if out.dtype == np.bool_ else encode(out)

    def unary_op(self, arg, op):
        if not is_bf16(arg):
            return orig["unary_op"](self, arg, op)
        return encode(op(as_f32(arg).data))

    def create_clampf(self, arg, lo, hi, propagate_nans):
        if not is_bf16(arg):
            return orig["create_clampf"](self, arg, lo, hi, propagate_nans)
        return encode(np.clip(as_f32(arg).data, as_f32(lo).data, as_f32(hi).data))

    def create_fma(self, x, y, z):
        if not (is_bf16(x) or is_bf16(y) or is_bf16(z)):
            return orig["create_fma"](self, x, y, z)
        f = [as_f32(h).data.astype(np.float64) for h in (x, y, z)]
        return TH(f64_to_bf16_bits(_fma_round_to_odd(f[0], f[1], f[2])), tl.bfloat16)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        fa, fb, fd = as_f32(a), as_f32(b), as_f32(d)
        if not all(h.data.dtype in _DOT_FLOATS for h in (fa, fb)) or fd.data.dtype != np.float32:
            return orig["create_dot"](self, a, b, d, input_precision, max_num_imprecise_acc)  # ints, fp8
        out = TH(fixed_order_dot(fa.data, fb.data) + fd.data, tl.float32)
        return encode(out.data) if is_bf16(d) else out

    def create_tensor_pointer_load(self, ptr, boundary_check, padding_option, cache_modifier,
                                   eviction_policy, is_volatile):
        # padding with NaN would write float('nan') into the uint16 bits of a bf16 block
        if ptr.base.get_element_ty() == tl.bfloat16 and padding_option == ir.PADDING_OPTION.PAD_NAN:
            ptrs, masks = ptr.materialize_pointers(boundary_check)
            other = TH(np.full(ptrs.data.shape, QNAN_BF16, dtype=np.uint16), tl.bfloat16)
            return self.create_masked_load(ptrs, masks, other, cache_modifier, eviction_policy, is_volatile)
        return orig["create_tensor_pointer_load"](self, ptr, boundary_check, padding_option,
                                                  cache_modifier, eviction_policy, is_volatile)

    for fn in (cast_impl, create_fp_to_fp, get_bf16, binary_op, unary_op, create_clampf, create_fma,
               create_dot, create_tensor_pointer_load):
        _replace(B, fn.__name__, fn)


def _patch_reduce_scan(interp: types.ModuleType) -> None:
    """tl.max/min/argmax/sum/cumsum/cumprod on bf16: run on the fp32 values, round back once."""
    import triton.language as tl

    TH = interp.TensorHandle

    def is_bf16(t: Any) -> bool:
        return isinstance(t, tl.tensor) and t.dtype == tl.bfloat16 and t.handle.data.dtype == np.uint16

    def retype(t: Any, dtype: Any, data: np.ndarray) -> Any:
        ty = t.type.with_element_ty(dtype) if t.type.is_block() else dtype
        return tl.tensor(TH(data, dtype), ty)

    def to_f32(t: Any) -> Any:
        return retype(t, tl.float32, bf16_bits_to_f32(t.handle.data)) if is_bf16(t) else t

    def to_bf16(t: Any) -> Any:
        if isinstance(t, tl.tensor) and t.dtype == tl.float32:
            return retype(t, tl.bfloat16, f32_to_bf16_bits(t.handle.data))
        return t

    def wrap(method: Callable) -> Callable:
        def run(self, input, *args, **kwargs):
            first = input[0] if isinstance(input, tuple) else input
            if not is_bf16(first):
                return method(self, input, *args, **kwargs)
            out = method(self, to_f32(first), *args, **kwargs)
            if isinstance(out, (list, tuple)):
                return type(out)(to_bf16(o) for o in out)
            return to_bf16(out)
        run.__name__ = method.__name__
        return run

    for cls, names in ((interp.ReduceOps, ("min_max", "sum")), (interp.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            _replace(cls, name, wrap(cls.__dict__[name]))


def _self_check(interp: types.ModuleType) -> None:
    """The patched builder on known answers (a Triton whose interpreter routes casts elsewhere
    would pass the signature check and still be inexact)."""
    import triton.language as tl

    b, TH = interp.InterpreterBuilder(), interp.TensorHandle
    # tie to even down, tie to even up, bf16 subnormal, overflow, NaN
    f32 = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 13.5 * 2.0**-133, 3.4e38, np.nan], dtype=np.float32)
    want = np.array([0x3F80, 0x3F82, 0x000E, 0x7F80, QNAN_BF16], dtype=np.uint16)
    checks = {
        "fp32 -> bf16 (fp_trunc)": b.create_fp_trunc(TH(f32, tl.float32), tl.bfloat16).data,
        "bf16 -> fp32 (fp_ext)": b.create_fp_ext(TH(np.array([0x0001], np.uint16), tl.bfloat16),
                                                  tl.float32).data.view(np.uint32),
        "bf16 add": b.create_fadd(TH(np.array([0x3F80], np.uint16), tl.bfloat16),
                                  TH(np.array([0x3C40], np.uint16), tl.bfloat16)).data,  # 1 + 1.5 * 2**-7
        "int32 -> bf16 (si_to_fp)": b.create_si_to_fp(TH(np.array([257], np.int32), tl.int32), tl.bfloat16).data,
    }
    expected = {
        "fp32 -> bf16 (fp_trunc)": want,
        "bf16 -> fp32 (fp_ext)": np.array([0x00010000], np.uint32),
        "bf16 add": np.array([0x3F82], np.uint16),  # a tie, to even
        "int32 -> bf16 (si_to_fp)": np.array([0x4380], np.uint16),  # 257 ties to 256
    }
    for what, got in checks.items():
        if not np.array_equal(np.asarray(got), expected[what]):
            raise patch_error(f"after patching, {what} gives {np.asarray(got)!r}, expected {expected[what]!r}")


# --- what cannot be fixed ------------------------------------------------------------------------

#: Interpreter defects the patch leaves alone: name -> why. Tests that hit one skip with this text
#: (never fail blaming the kernel).
UNFIXED_INTERPRETER_BUGS: dict[str, str] = {
    "fp8": "Triton's interpreter converts fp8 with a truncating helper that mangles subnormals; "
           "flashcheck patches bf16 only",
    "bf16_atomics": "Triton's interpreter runs atomic_add/max/min on bf16 raw bit patterns",
}


def skip_if_interpreter_bug(name: str) -> None:
    """Skip the running pytest test when it runs under the interpreter and depends on ``name``,
    one of :data:`UNFIXED_INTERPRETER_BUGS`."""
    if name not in UNFIXED_INTERPRETER_BUGS:
        raise KeyError(f"unknown interpreter bug {name!r}; known: {sorted(UNFIXED_INTERPRETER_BUGS)}")
    if interpreting():
        import pytest
        pytest.skip(f"Triton {_triton_version()} interpreter bug, not the kernel's: {UNFIXED_INTERPRETER_BUGS[name]}")
