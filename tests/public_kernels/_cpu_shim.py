"""What a public kernel's Python wrapper asks of a CUDA device, answered on a CPU machine (the Triton
interpreter), so that its own @triton.jit code runs unchanged.

`install(module)` gives that module (and only it) a `torch` whose `cuda` answers the host-side
queries: `device_of` / `device` are no-op contexts, `get_device_capability` returns the capability
given (it picks the wrapper's tile config), `get_device_properties` an object with
`multi_processor_count`. Every other name is torch's own; nothing inside a kernel is touched, and the
backward, which autograd runs after the forward returned, sees the same answers. Off the interpreter
(a real GPU) install does nothing.
"""
from __future__ import annotations

import contextlib
import os
import types

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()


class _Proxy(types.ModuleType):
    def __init__(self, base, overrides):
        super().__init__(base.__name__)
        self._base, self._overrides = base, overrides

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._base, name)


def install(module, capability: tuple[int, int] = (9, 0), sms: int = 132) -> None:
    if not INTERPRET or isinstance(getattr(module, "torch", None), _Proxy):
        return
    props = types.SimpleNamespace(multi_processor_count=sms, major=capability[0], minor=capability[1])
    cuda = _Proxy(torch.cuda, {"device_of": lambda *a, **k: contextlib.nullcontext(),
                               "device": lambda *a, **k: contextlib.nullcontext(),
                               "get_device_capability": lambda *a, **k: capability,
                               "get_device_properties": lambda *a, **k: props})
    module.torch = _Proxy(torch, {"cuda": cuda})
