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

__all__ = ["DEVICE", "INTERPRET", "triton", "tl", "cdiv", "check_device", "launch", "on_input_device", "settle_cache_keys",
           "spec_key"]

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
    if not (t.is_cuda if DEVICE.type == "cuda" else t.is_cpu):  # 0.1 us; `t.device.type` took 1 us a call
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


# --------------------------------------------------------------------------------------------
# Replaying compiled kernels
#
# `fn[grid](*args, **meta)` costs Triton 3.6 tens of microseconds of Python a launch: it binds
# the arguments, classifies each one (native_specialize_impl), hashes the result and looks the
# binary up. A decode call's kernel runs for 10-30 us on an H200, and that machine's host spent
# 128-216 us per attention call, Triton's `run` about half of it (reports/attention_bench.md,
# twelfth section). `launch` goes through Triton once per specialization and then calls the
# compiled kernel it returned (`CompiledKernel[grid](*all_args)`, which still honours launch
# hooks and takes the current stream). Its key refines Triton's: every fact Triton specializes
# on (a tensor's dtype and 16-byte alignment; an int's value 1, divisibility by 16 and width;
# constexpr values; the launch options) is in it, so two calls that share a key share a binary.
# --------------------------------------------------------------------------------------------

def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a launch's grid: `triton.cdiv` costs 6 us a call on the host (it unwraps
    constexprs), once per launch."""
    return -(-a // b)


def replay_supported(version: str) -> bool:
    """Whether this Triton's compiled kernels take the launch `launch` replays: every argument in
    signature order, constexprs included (`CompiledKernel[grid](*args)`), as Triton 3.6's own
    `JITFunction.run` passes them. Only the versions a GPU lane has run replay; others launch
    through Triton (correct, and slower on the host)."""
    return version.split(".")[:2] == ["3", "6"]


REPLAY = replay_supported(triton.__version__)  # benchmarks turn it off to time Triton's own launch path
_REPLAYS: dict[tuple, tuple] = {}


def _arg_class(a):
    if isinstance(a, bool):
        return bool, a
    if isinstance(a, int):
        return a == 1, a % 16 == 0, -2**31 <= a < 2**31, a < 2**63
    if isinstance(a, float):
        return float
    return type(a), a  # None, a dtype: hashable or not replayed (TypeError below)


def spec_key(args: tuple, meta: dict) -> tuple:
    """What a launch's binary depends on beyond the tensors' data, for `launch(key=...)`: a caller
    whose non-tensor arguments repeat (a cached plan) computes it once."""
    return tuple(_arg_class(a) for a in args if not isinstance(a, torch.Tensor)), tuple(meta.items())


def launch(fn, grid: tuple[int, ...], args: tuple, meta: dict, *, key: tuple | None = None) -> None:
    """`fn[grid](*args, **meta)`, replaying the binary of an earlier launch of the same
    specialization. `key`: `spec_key(args, meta)` computed by a caller that repeats it; None
    computes it here. Under the interpreter every call is Triton's own."""
    if INTERPRET or not REPLAY:
        fn[grid](*args, **meta)
        return
    try:
        ptrs = tuple((a.dtype, a.data_ptr() % 16 == 0) for a in args if isinstance(a, torch.Tensor))
        full = (fn, torch.cuda.current_device(), ptrs, key if key is not None else spec_key(args, meta))
        hit = _REPLAYS.get(full)
    except TypeError:  # an unhashable argument: Triton's path, uncached
        fn[grid](*args, **meta)
        return
    if hit is not None:
        compiled, tail = hit
        compiled[grid + (1,) * (3 - len(grid))](*args, *tail)
        return
    compiled = fn[grid](*args, **meta)
    tail = _constexpr_tail(fn, len(args), meta)
    if compiled is not None and tail is not None:
        _REPLAYS[full] = compiled, tail


def _constexpr_tail(fn, n_args: int, meta: dict) -> tuple | None:
    """The values of fn's parameters after the first n_args, in signature order (meta's or the
    defaults): the arguments a compiled kernel takes after those. None when one is not a
    constexpr or has no value (not replayed)."""
    tail = []
    for param in fn.params[n_args:]:
        if not param.is_constexpr:
            return None
        if param.name in meta:
            tail.append(meta[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:
            return None
    return tuple(tail)
