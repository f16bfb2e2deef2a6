"""What the engine adds to the production kernels when it runs them.

Kernels never import the engine (the layer order, `tests/test_layers.py`: oracles <- kernels <-
strategies <- engine). The engine brings two things of its own:

- under Triton's interpreter, the exact-bf16 patch and runnable autotuned kernels
  (`flashcheck.interpreter.exact.install`);
- around every call of a registered kernel, the GPU-fault guard (`flashcheck.isolation.faults.guarded_call`,
  through `kernels.registry.set_call_hook`).

`attach()` does both, once per process; every engine entry point that runs kernels calls it (the
pytest plugin, the properties, replays, external kernels, the reports and the mutation probe).
Importing `flashcheck.kernels` alone gives the plain kernels on the plain interpreter.
"""
from __future__ import annotations

_ATTACHED = [False]


def attach() -> None:
    if _ATTACHED[0]:
        return
    from flashcheck.isolation import faults
    from flashcheck.kernels import _runtime, registry

    if _runtime.INTERPRET:
        from flashcheck.interpreter import exact as interpreter

        interpreter.install()
    registry.set_call_hook(faults.guarded_call)
    _ATTACHED[0] = True
