"""Autotuned kernels under the interpreter, and forcing one config (or each in turn) anywhere.

``@triton.autotune`` kernels fail under Triton's interpreter ("0 active drivers": the autotuner asks
the GPU driver for a benchmarker). :func:`install` (called by ``flashcheck.interpreter.exact.install``)
makes them run with their first config there, or with the one chosen by :func:`force_config`;
:func:`autotuned_kernels` and :func:`tunings` let a loader run a launcher once per config so every
config is checked (``docs/interpreter.md``, "Autotuned kernels"). Forcing works on a GPU too.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import types
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from flashcheck.interpreter import patching as interpreter

__all__ = ["install", "autotuned_kernels", "autotune_configs", "force_config", "force_configs", "Tuning",
           "tunings", "describe_config"]

_FORCED: dict[int, Any] = {}  # id(Autotuner) -> the Config it must run with
_AUTOTUNE = {"patched": False, "first_by_default": False}


def install(*, default_first: bool) -> None:
    """Autotuner.run: a forced config runs alone; under the interpreter, with nothing forced, the
    first config runs (benchmarking needs a GPU driver, and timings mean nothing there)."""
    from triton.runtime.autotuner import Autotuner

    _AUTOTUNE["first_by_default"] = _AUTOTUNE["first_by_default"] or default_first
    if _AUTOTUNE["patched"]:
        return
    if list(inspect.signature(Autotuner.run).parameters) != ["self", "args", "kwargs"] \
            or "configs" not in inspect.signature(Autotuner.__init__).parameters:
        raise interpreter.patch_error("triton.runtime.autotuner.Autotuner.run/__init__ changed")
    orig_run = Autotuner.run

    def run(self, *args, **kwargs):
        config = _FORCED.get(id(self))
        if config is None and not (_AUTOTUNE["first_by_default"] and len(self.configs) > 1):
            return orig_run(self, *args, **kwargs)
        saved = self.configs
        self.configs = [config if config is not None else saved[0]]
        try:
            return orig_run(self, *args, **kwargs)  # one config: Triton runs it without benchmarking
        finally:
            self.configs = saved

    Autotuner.run = run
    _AUTOTUNE["patched"] = True


def _autotuners_in(obj: Any, seen: set[int]) -> Iterator[Any]:
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    while isinstance(obj, KernelInterface) and id(obj) not in seen:
        seen.add(id(obj))
        if isinstance(obj, Autotuner):
            yield obj
        obj = getattr(obj, "fn", None)


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_names(c)


def autotuned_kernels(obj: Any) -> list[Any]:
    """The ``@triton.autotune`` kernels behind ``obj``: obj itself (through ``@triton.heuristics``
    layers), or, for a plain launcher function, the autotuned kernels it names (its globals and
    closure), in order of appearance."""
    from triton.runtime.jit import KernelInterface

    seen: set[int] = set()
    found = list(_autotuners_in(obj, seen))
    fn = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(fn, types.FunctionType):
        names = list(dict.fromkeys(_code_names(fn.__code__)))
        candidates = [fn.__globals__[n] for n in names if n in fn.__globals__]
        candidates += [c.cell_contents for c in fn.__closure__ or () if c.cell_contents is not None]
        # `module.kernel[grid](...)`: the kernel is an attribute of a module the launcher names
        candidates += [getattr(m, n) for m in list(candidates) if isinstance(m, types.ModuleType)
                       for n in names if isinstance(getattr(m, n, None), KernelInterface)]
        for c in candidates:
            found.extend(_autotuners_in(c, seen))
    return found


def _single_autotuner(kernel: Any) -> Any:
    found = autotuned_kernels(kernel)
    if len(found) != 1:
        raise ValueError(f"{getattr(kernel, '__name__', kernel)!r} holds {len(found)} @triton.autotune "
                         "kernels, expected exactly one (use force_configs for several)")
    return found[0]


def autotune_configs(kernel: Any) -> list[Any]:
    """The configs of one ``@triton.autotune`` kernel (or of the one a launcher names)."""
    return list(_single_autotuner(kernel).configs)


def describe_config(config: Any) -> str:
    """A short label for a ``triton.Config``: its meta-parameters, num_warps, num_stages."""
    parts = [f"{k}={v}" for k, v in config.kwargs.items()]
    parts += [f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"]
    return ",".join(parts)


@contextlib.contextmanager
def force_configs(choice: Mapping[Any, Any]) -> Iterator[None]:
    """Run each given autotuned kernel with the given config (no benchmarking) inside the block."""
    install(default_first=interpreter.interpreting())
    tuners = {}
    for kernel, config in choice.items():
        tuner = _single_autotuner(kernel)
        if not any(config is c for c in tuner.configs):
            raise ValueError(f"{describe_config(config)} is not one of {tuner.base_fn.__name__}'s configs")
        tuners[id(tuner)] = config
    saved = {k: _FORCED.get(k) for k in tuners}
    _FORCED.update(tuners)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                _FORCED.pop(k, None)
            else:
                _FORCED[k] = v


def force_config(kernel: Any, config: Any) -> contextlib.AbstractContextManager[None]:
    """Run the ``@triton.autotune`` kernel (or the one a launcher names) with ``config``."""
    return force_configs({kernel: config})


@dataclass(frozen=True)
class Tuning:
    """One choice of config for every autotuned kernel behind a launcher."""
    choice: tuple[tuple[Any, Any], ...]  # (Autotuner, Config) pairs

    @property
    def label(self) -> str:
        return ";".join(f"{t.base_fn.__name__}[{describe_config(c)}]" for t, c in self.choice)

    def __call__(self) -> contextlib.AbstractContextManager[None]:
        return force_configs(dict(self.choice))


def tunings(launcher: Any) -> list[Tuning]:
    """Every combination of configs of the autotuned kernels behind ``launcher`` (empty when it
    has none): run the launcher once inside each ``with tuning():`` to check every config."""
    tuners = autotuned_kernels(launcher)
    if not tuners:
        return []
    return [Tuning(tuple(zip(tuners, combo))) for combo in itertools.product(*(t.configs for t in tuners))]
