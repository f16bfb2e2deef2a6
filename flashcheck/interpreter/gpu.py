"""Triton's interpreter made to follow the GPU where the two differ (docs/interpreter.md).

* ``tl.maximum`` / ``tl.minimum`` on floats: with the default ``propagate_nan=NONE`` the GPU
  returns the other operand when one is NaN (``maxnum``: PTX ``max.f32``); the interpreter
  propagated NaN (``np.maximum``). Now ``np.fmax`` / ``np.fmin``; ``propagate_nan=ALL`` keeps
  propagating. (``tl.max`` / ``tl.min`` reductions already ignore NaN in both.)
* ``tl.dot`` on fp32 operands: the GPU's default input precision is tf32 (tensor cores read 10
  explicit mantissa bits; Triton feeds the fp32 registers as they are, the low 13 bits dropped).
  Now tf32 truncates both operands to 10 mantissa bits before an fp32 product; ``"tf32x3"`` is
  emulated as Triton lowers it (a_big = tf32 round-to-nearest-away of a, a_small = a - a_big,
  likewise b; a_small b_big + a_big b_small + a_big b_big + c); ``"ieee"`` is exact fp32 as before.
* A global that is not ``tl.constexpr`` read inside a ``@triton.jit`` function: the GPU compiler
  raises "Cannot access global variable X"; the interpreter ran it. Now the first launch of each
  kernel scans its bytecode (and the jit functions it calls) and raises :class:`GpuIncompatible`.
  The scan is static: a global read only in a branch a constexpr switches off is reported too,
  though the GPU compiler never visits that branch.
* A grid whose x > 2^31 - 1 or y, z > 65535: a GPU launch fails; now :class:`GpuIncompatible`.
* Shared memory: the interpreter has none to run out of. A ``tl.dot`` whose two operand tiles
  take more than the H100/H200 per-block limit (227 KiB) even single-buffered warns once per
  kernel (:class:`GpuResourceWarning`): the GPU raises OutOfResources there. Pipelining
  (num_stages) multiplies the need; that is not estimated (no false failures).
"""
from __future__ import annotations

import dis
import os
import types
import warnings
from typing import Any

import numpy as np

from flashcheck.interpreter.bounds import KernelFault
from flashcheck.interpreter.patching import fixed_order_dot

__all__ = ["GpuIncompatible", "GpuResourceWarning", "install", "tf32_truncate", "tf32_round", "GRID_LIMITS",
           "SHARED_MEMORY_BYTES"]

GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's gridDim limits (x, y, z)
SHARED_MEMORY_BYTES = 227 * 1024  # the most one block may use on H100/H200 (sm_90)


class GpuIncompatible(KernelFault):
    """The kernel does something a GPU rejects, which Triton's interpreter would have run."""


class GpuResourceWarning(UserWarning):
    """The kernel may need more of a GPU resource (shared memory) than a GPU has."""


def tf32_truncate(x: np.ndarray) -> np.ndarray:
    """fp32 -> the tf32 value the tensor cores read: the low 13 mantissa bits dropped."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return np.where(np.isnan(x), x, (b & np.uint32(0xFFFFE000)).view(np.float32))


def tf32_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> tf32 rounded to nearest, ties away from zero (PTX cvt.rna.tf32.f32), as fp32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isnan(x) | np.isinf(x), x, r)


# --- non-constexpr globals -----------------------------------------------------------------------

def _allowed_global(val: Any) -> bool:
    """Triton's code generator's rule (compiler/code_generator.py, global_lookup)."""
    import triton.language as tl
    from triton.runtime.jit import KernelInterface

    return (isinstance(val, (types.ModuleType, KernelInterface, tl.dtype, tl.constexpr))
            or getattr(val, "__triton_builtin__", False) or getattr(val, "__triton_aggregate__", False)
            or getattr(val, "__module__", "") is not None and str(getattr(val, "__module__", "")).startswith(
                ("triton.language", "triton.experimental.gluon.language"))
            or (isinstance(val, tuple) and hasattr(val, "_fields")))


def _bad_globals(fn: Any, seen: set[int]) -> list[tuple[str, str]]:
    """(function, global) pairs a GPU compile of ``fn`` would reject, through the jit functions it
    calls."""
    from triton.runtime.jit import KernelInterface

    while isinstance(fn, KernelInterface):  # @triton.autotune / @triton.heuristics / @triton.jit layers
        fn = getattr(fn, "fn", None)
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return []
    seen.add(id(fn))
    out = []
    for ins in dis.get_instructions(fn):
        if ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME"):
            continue
        name = ins.argval
        if name not in fn.__globals__:
            continue  # a builtin (range, float, min, ...)
        val = fn.__globals__[name]
        if isinstance(val, KernelInterface):
            out += _bad_globals(val, seen)
        elif not _allowed_global(val):
            out.append((fn.__name__, name))
    return out


# --- the patch -----------------------------------------------------------------------------------

_installed = False
_checked: set[int] = set()
_warned: set[str] = set()


def install(interp: types.ModuleType) -> None:
    """Hook the GPU semantics into this process's Triton interpreter (idempotent)."""
    global _installed
    if _installed:
        return
    from triton._C.libtriton import ir
    import triton.language as tl

    B = interp.InterpreterBuilder
    B.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    B.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)

    dot, TH = B.create_dot, interp.TensorHandle
    P = ir.INPUT_PRECISION

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        fp32 = a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32
        if not fp32 or input_precision not in (P.TF32, P.TF32x3):
            return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        if input_precision == P.TF32:
            return dot(self, TH(tf32_truncate(a.data), a.dtype), TH(tf32_truncate(b.data), b.dtype), d,
                       input_precision, max_num_imprecise_acc)
        a_big, b_big = tf32_round(a.data), tf32_round(b.data)
        a_small, b_small = tf32_truncate(a.data - a_big), tf32_truncate(b.data - b_big)
        acc = np.zeros_like(d.data)
        for x, y in ((a_small, b_big), (a_big, b_small), (a_big, b_big)):
            acc = fixed_order_dot(x, y) + acc  # a row's bits independent of its place in the tile
        return TH(acc + d.data, d.dtype.scalar)

    B.create_dot = create_dot

    set_grid_dim = B.set_grid_dim

    def set_grid_dim_checked(self, nx, ny, nz):
        for axis, (n, limit) in enumerate(zip((nx, ny, nz), GRID_LIMITS)):
            if n > limit:
                raise GpuIncompatible(
                    f"grid dimension {'xyz'[axis]} = {n} exceeds the GPU's limit {limit} (CUDA gridDim; x <= 2^31 - 1, "
                    f"y and z <= 65535): the launch fails on a GPU. Fold the excess into another axis.")
        return set_grid_dim(self, nx, ny, nz)

    B.set_grid_dim = set_grid_dim_checked

    run = interp.InterpretedFunction.run

    def run_checked(self, *args, grid, warmup, **kwargs):
        if id(self.fn) not in _checked and not os.environ.get("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"):
            bad = _bad_globals(self.fn, set())
            if bad:
                where = ", ".join(f"{g!r} in {f}" for f, g in bad)
                raise GpuIncompatible(
                    f"kernel {self.fn.__name__} reads global variable(s) {where} that are not tl.constexpr: the GPU "
                    f"compiler rejects it (\"Cannot access global variable ... from within @jit'ed function\"); "
                    f"Triton's interpreter would run it. Make each `NAME = tl.constexpr(value)` or pass it as an argument.")
            _checked.add(id(self.fn))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interp.InterpretedFunction.run = run_checked

    checked_dot = B.create_dot

    def create_dot_smem(self, a, b, d, input_precision, max_num_imprecise_acc):
        need = a.data.nbytes + b.data.nbytes
        if need > SHARED_MEMORY_BYTES:
            key = f"{a.data.shape}x{b.data.shape}"
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"tl.dot of a {a.data.shape} by a {b.data.shape} tile: its operands take {need // 1024} KiB "
                              f"of shared memory, more than a GPU block has ({SHARED_MEMORY_BYTES // 1024} KiB on "
                              f"H100/H200): Triton raises OutOfResources there", GpuResourceWarning, stacklevel=2)
        return checked_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    B.create_dot = create_dot_smem
    _installed = True
