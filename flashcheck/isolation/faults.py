"""GPU faults: a kernel call that kills the CUDA context is named once, on the call that caused it.

CUDA errors are asynchronous: an illegal memory access in one launch surfaces at whatever CUDA
call comes next (often an unrelated `tensor.to(device)` in a strategy), and from then on every
CUDA call in the process fails the same way. So every kernel call goes through `guarded_call` (the
call hook of `KernelSpec.fn` and `varlen_fn`, the one choke point every property, test and report
uses; `flashcheck.isolation.hooks` attaches it):

- after the call, when an input is on CUDA, `torch.cuda.synchronize(device)`: a fault surfaces at
  the launch that caused it;
- an exception whose text is one of CUDA's context-killing errors becomes `GpuFault`, naming the
  kernel and its inputs; the process remembers it, and every later guarded call raises at once
  (nothing run in a dead context means anything).

`GpuFault` is a BaseException, not an Exception: nothing that catches a kernel's ordinary errors
(a bad-input test expecting a raise, a report counting a kernel's errors) swallows it, and
Hypothesis does not shrink it (it re-runs only failures it catches; shrinking in a dead context
would blame every later example). `flashcheck.properties.runner.check` saves the case as a fixture at once,
and the pytest plugin ends the poisoned process (`flashcheck.isolation.journal`).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import torch

from flashcheck.isolation import journal

#: Error texts after which the CUDA context is unusable (cudaError 700 illegal address, 716
#: misaligned address, 715 illegal instruction, 719 launch failure, 710 device-side assert, plus
#: the driver's names for them as Triton and torch print them).
CONTEXT_KILLERS = {
    "illegal memory access": "illegal memory access",
    "illegal address": "illegal memory access",
    "misaligned address": "misaligned address",
    "illegal instruction": "illegal instruction",
    "unspecified launch failure": "unspecified launch failure",
    "device-side assert": "device-side assert",
    "hardware stack error": "hardware stack error",
    "uncorrectable ecc error": "uncorrectable ECC error",
}
_CODES = {700: "illegal memory access", 716: "misaligned address", 715: "illegal instruction",
          719: "unspecified launch failure", 710: "device-side assert", 714: "hardware stack error",
          214: "uncorrectable ECC error"}
_CODE_RE = re.compile(r"(?:CUDA error|cudaError\w*|error code|CUresult)\D{0,12}(\d{3})\b", re.I)


class GpuFault(BaseException):
    """A kernel call killed the CUDA context (the message names the kernel and its input)."""

    ends_the_process = True  # the journal leaves its task open: `fault_exit` ends the child

    def __init__(self, message: str, kind: str = "GPU fault") -> None:
        super().__init__(message)
        self.kind = kind


_LOST: list[str] = []  # the first fault's message: this process's CUDA context is dead
#: Kernel calls made in this process (every one goes through `guarded`): how much a test checked.
CALLS = [0]


def context_lost() -> str | None:
    """The message of the fault that killed this process's CUDA context, if one did."""
    return _LOST[0] if _LOST else None


def fault_kind(exc: BaseException) -> str | None:
    """The context-killing error `exc` reports (its chain included), or None for any other error."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, GpuFault):
            return e.kind
        if isinstance(e, AssertionError):  # a verdict (the interpreter's OutOfBoundsAccess too), not CUDA's
            return None
        text = str(e).lower()
        for needle, kind in CONTEXT_KILLERS.items():
            if needle in text:
                return kind
        m = _CODE_RE.search(str(e))
        if m and int(m.group(1)) in _CODES:
            return _CODES[int(m.group(1))]
        e = e.__cause__ or e.__context__
    return None


def describe_args(args: tuple, kwargs: dict) -> str:
    """Shapes, dtypes, strides and devices of a call's tensors, and its other keyword arguments."""
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return (f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')} stride={tuple(v.stride())}"
                    f"{f' offset={v.storage_offset()}' if v.storage_offset() else ''} on {v.device}")
        return repr(v) if not isinstance(v, (list, tuple)) or len(v) < 8 else f"{type(v).__name__} of {len(v)}"
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _cuda_devices(args: tuple, kwargs: dict) -> list[torch.device]:
    devs = {a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_cuda}
    return sorted(devs, key=str)


def _begin_call(name: str, args: tuple, kwargs: dict) -> None:
    """What every kernel call does first: refused in a process whose CUDA context a fault killed
    (it would fail or hang), else noted for crash isolation (a crash names the last call launched)
    and counted in CALLS."""
    if _LOST:
        raise GpuFault(f"not run: the CUDA context was lost earlier in this process ({_LOST[0]})",
                       "context lost")
    journal.note_call(name, lambda: describe_args(args, kwargs))
    CALLS[0] += 1


def _end_call() -> None:
    """What every kernel call that returned does last: the crash isolation's note is cleared."""
    journal.note_return()


def unsynchronised_call(fn: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """Call the unhooked kernel fn as `name` without `guarded_call`'s synchronisation, for a test
    that queues calls on several streams or captures them in a CUDA graph (a synchronisation after
    each would run them one after another, and cannot be captured). Counted in CALLS like any call;
    a fault surfaces at the test's own synchronisation."""
    _begin_call(name, args, kwargs)
    out = fn(*args, **kwargs)
    _end_call()
    return out


def guarded_call(fn: Callable[..., Any], name: str, args: tuple, kwargs: dict) -> Any:
    """Call fn(*args, **kwargs) as the kernel `name`: a device synchronisation after a CUDA call,
    context-killing errors raised as GpuFault. The hook every registered kernel call goes through
    (`kernels.registry.set_call_hook`, attached by `flashcheck.isolation.hooks`)."""
    _begin_call(name, args, kwargs)
    try:
        out = fn(*args, **kwargs)
        for dev in _cuda_devices(args, kwargs):
            torch.cuda.synchronize(dev)
    except BaseException as e:
        kind = fault_kind(e)
        if kind is None or isinstance(e, GpuFault):
            raise
        msg = f"{kind} in {name} on ({describe_args(args, kwargs)}): {type(e).__name__}: {str(e).strip()}"
        _LOST.append(msg)
        raise GpuFault(msg, kind) from e
    _end_call()
    return out
