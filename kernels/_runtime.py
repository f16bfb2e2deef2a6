"""Where kernels run: the GPU when there is one, else Triton's interpreter on the CPU.

`TRITON_INTERPRET` must be set before `triton` is first imported, so every module of the
project that imports triton imports this one first. The kernels are plain Triton: the test tool's
interpreter patch (exact bf16, runnable autotune) is the engine's (`flashcheck.kernel_hooks`).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

import torch

if "TRITON_INTERPRET" not in os.environ:
    if "triton" in sys.modules and not torch.cuda.is_available():
        raise RuntimeError(
            "triton was imported before flashcheck could switch on the interpreter; "
            "import kernels first or set TRITON_INTERPRET=1"
        )
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE: torch.device = torch.device("cpu" if INTERPRET else "cuda")

import triton  # noqa: E402  (after the switch above, on purpose)
import triton.language as tl  # noqa: E402

__all__ = ["DEVICE", "INTERPRET", "triton", "tl", "check_device", "on_input_device", "settle_cache_keys"]

F = TypeVar("F", bound=Callable[..., torch.Tensor])


def on_input_device(fn: F) -> F:
    """Run a launcher with its first tensor's GPU as the current device.

    Triton launches on the *current* device and its current stream, not the tensors' device:
    without this, inputs on cuda:1 while cuda:0 is current would be read from cuda:0's stream
    (FlashAttention #1782; tests/test_devices.py).
    """

    @functools.wraps(fn)
    def launch(*args, **kwargs):
        first = args[0] if args else None
        if (isinstance(first, torch.Tensor) and first.device.type == "cuda"
                and first.device.index != torch.cuda.current_device()):
            with torch.cuda.device(first.device):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)  # already current: a device switch costs microseconds a call

    return launch  # type: ignore[return-value]


def check_device(name: str, t: torch.Tensor) -> None:
    """Raise a clear error when a tensor is not where the kernels run."""
    if t.device.type != DEVICE.type:
        raise ValueError(
            f"{name} is on {t.device}, but kernels run on {DEVICE.type}"
            + (" (Triton interpreter: no GPU found)" if INTERPRET else "")
        )


def settle_cache_keys(*modules) -> None:
    """Compute the cache key of every `@triton.jit` function of `modules` now, in definition
    order (helpers before the kernels that call them).

    Triton 3.6 folds a callee's constexpr globals (`_LOG2E = tl.constexpr(...)`) into its
    caller's key only when the callee's own key was computed first (`DependenciesFinder.
    _update_hash` merges `used_global_vals` before asking the callee for its key). So a kernel's
    key, and the binary's name in the on-disk cache, depended on which kernel a process happened
    to launch first: on one H200 5 of 11 xdist workers keyed the online and split softmax kernels
    one way and 6 the other, and a warm cache rebuilt 142 binaries. Keys computed at import, in
    one order, are the same in every process. The interpreter hashes nothing: a no-op there."""
    from triton.runtime.jit import JITFunction

    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):
                value.cache_key  # noqa: B018  (computed and kept by Triton)
