"""Where a test's time goes: Triton compilation, kernel launches, oracles, the rest (`-p
flashcheck.phases`).

Each test's call phase is split into
- `compile`: Triton building a binary (`JITFunction._do_compile`: a real compilation, or a load
  from the on-disk cache, which takes milliseconds), with the count of binaries;
- `kernel`: launching kernels, less their compilation (on a GPU launches are asynchronous: the
  GPU-fault guard's synchronisation after each call lands in `rest`; under the interpreter this is the
  interpreted run itself);
- `oracle`: the softmax, log-sum-exp and attention oracles (fast path and mpmath fallback);
- `rest`: Hypothesis's drawing and shrinking, comparisons, fixture I/O, synchronisation.

The numbers ride on the test report (`user_properties`, so they cross from xdist workers), and
`flashcheck.results_log` writes them into each test's line; `summarize` adds them up per file.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

import pytest

PHASES = ("compile", "kernel", "oracle", "rest")
_ORACLES = ("softmax_oracle", "logsumexp_oracle", "attention_oracle")
_clock: dict[str, float] = defaultdict(float)
_depth = {"kernel": 0, "oracle": 0}


def _timed(fn: Callable, phase: str) -> Callable:
    if getattr(fn, "_flashcheck_phase", None):
        return fn

    def wrapper(*args, **kwargs):
        if _depth[phase]:  # nested (a launcher calling a launcher): the outer call counts
            return fn(*args, **kwargs)
        _depth[phase] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _clock[phase] += time.perf_counter() - t0
            _depth[phase] -= 1

    wrapper._flashcheck_phase = phase  # type: ignore[attr-defined]
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapper, attr, getattr(fn, attr, None))
    return wrapper


def _patch_triton() -> None:
    from flashcheck import kernels  # noqa: F401  (switches on the interpreter first where needed)
    from triton.runtime import jit

    if not getattr(jit.JITFunction.run, "_flashcheck_phase", None):
        jit.JITFunction.run = _timed(jit.JITFunction.run, "kernel")
        original = jit.JITFunction._do_compile

        def do_compile(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                _clock["compile"] += time.perf_counter() - t0
                _clock["compiled"] += 1

        do_compile._flashcheck_phase = "compile"  # type: ignore[attr-defined]
        jit.JITFunction._do_compile = do_compile
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        return
    if not getattr(InterpretedFunction.run, "_flashcheck_phase", None):
        InterpretedFunction.run = _timed(InterpretedFunction.run, "kernel")


def _patch_oracles(modules: Iterable[Any]) -> None:
    """Every module-level name bound to an oracle function now points at its timed wrapper
    (test modules import them by name)."""
    from flashcheck.oracles import attention, softmax

    originals = {id(getattr(m, n)): (n, getattr(m, n)) for m in (softmax, attention) for n in _ORACLES if hasattr(m, n)}
    for mod in list(modules):
        for name, (oname, fn) in ((n, originals[id(v)]) for n, v in list(vars(mod).items()) if id(v) in originals):
            setattr(mod, name, _timed(fn, "oracle"))


def pytest_configure(config: pytest.Config) -> None:
    _patch_triton()


def pytest_collection_finish(session: pytest.Session) -> None:
    _patch_oracles(m for n, m in list(sys.modules.items()) if m is not None and n.startswith(("flashcheck", "test")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    _clock.clear()
    t0 = time.perf_counter()
    try:
        return (yield)
    finally:
        total = time.perf_counter() - t0
        spent = {p: _clock.get(p, 0.0) for p in PHASES[:3]}
        spent["kernel"] = max(0.0, spent["kernel"] - spent["compile"])
        spent["rest"] = max(0.0, total - sum(spent.values()))
        item.user_properties.append(("phases", {**{p: round(v, 3) for p, v in spent.items()},
                                                "compiled": int(_clock.get("compiled", 0))}))


def phases_of(report: pytest.TestReport) -> dict[str, float] | None:
    for name, value in getattr(report, "user_properties", ()) or ():
        if name == "phases":
            return value
    return None


def summarize(records: Iterable[dict]) -> dict[str, dict[str, float]]:
    """Per test file: seconds in each phase, binaries compiled and tests, from results_log lines."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        ph = r.get("phases")
        if r.get("event") != "test" or not ph:
            continue
        row = out[r["nodeid"].split("::")[0]]
        for k, v in ph.items():
            row[k] += v
        row["tests"] += 1
    return {f: dict(v) for f, v in out.items()}


__all__ = ["PHASES", "phases_of", "summarize"]
