"""What every interpreter patch shares: its error, whether kernels run in the interpreter, the
record of replaced functions (`unpatched` undoes them for a block), and the exact fixed-order dot
product the patches use. The patching modules import this one, never each other's installers."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import numpy as np


class InterpreterPatchError(RuntimeError):
    """The installed Triton's interpreter is not the one the exact-bf16 patch was written for."""


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (the same test as flashcheck.kernels)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_PATCHES: list[tuple[type, str, Any, Any]] = []  # (class, name, original or _ABSENT, replacement)
_ABSENT = object()


_DOT_FLOATS = (np.dtype(np.float16), np.dtype(np.float32))


def fixed_order_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for fp16/fp32 operands, rounded once to fp32, the same bits for a row wherever it sits
    in the tile. Triton's interpreter calls np.matmul in fp32, i.e. BLAS, whose kernels sum a
    row's products in an order that depends on the row's position and the tile's height (on an AVX2
    machine, OpenBLAS: a third of a 32 x 32 product changed bits when its rows were permuted), so a
    correct kernel failed the bit-identity properties (query permutation, block_m) there. The
    products are exact in float64 (24 + 24 significant bits) and einsum sums every output element
    in one fixed order, independent of the others."""
    return np.einsum("...ik,...kj->...ij", a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


def _replace(cls: type, name: str, new: Any) -> None:
    _PATCHES.append((cls, name, cls.__dict__.get(name, _ABSENT), new))
    setattr(cls, name, new)


@contextlib.contextmanager
def unpatched() -> Iterator[None]:
    """Triton's own (inexact) interpreter inside the block: for tests that show what the patch
    fixes. Not thread-safe, like the interpreter itself."""
    # What is current comes back afterwards, including what other hooks (interp_gpu,
    # interp_bounds) layered over these patches since they were made.
    current = {(cls, name): cls.__dict__.get(name, _ABSENT) for cls, name, _, _ in _PATCHES}
    for cls, name, old, _ in reversed(_PATCHES):
        if old is _ABSENT:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, old)
    try:
        yield
    finally:
        for (cls, name), value in current.items():
            if value is _ABSENT:
                if name in cls.__dict__:
                    delattr(cls, name)
            else:
                setattr(cls, name, value)


def _triton_version() -> str:
    import triton
    return getattr(triton, "__version__", "unknown")


def patch_error(what: str) -> InterpreterPatchError:
    """The error for a Triton whose internals the patch does not fit (`what` names the misfit)."""
    return InterpreterPatchError(
        f"flashcheck's interpreter patch does not fit triton {_triton_version()}: {what}. Without it, "
        "bf16 results under TRITON_INTERPRET=1 are inexact and autotuned kernels do not run; use a "
        "Triton version flashcheck supports (3.6) or run on a GPU.")
