"""Where a test's time goes (`-p flashcheck.plugin.phases`).

Each test's call phase is split, every second counted once (a timed function called inside
another counts for its own phase, not the caller's):
- `compile`: Triton building a binary (`JITFunction._do_compile`: a real compilation, or a load
  from the on-disk cache, which takes milliseconds), with the count of binaries and of those
  built rather than loaded (Triton's compilation listener; workers building one binary each
  show as more built than distinct);
- `kernel`: launching kernels, less their compilation (under the interpreter, the interpreted run
  itself; on a GPU launches are asynchronous and the GPU's work lands in `sync`);
- `sync`: `torch.cuda.synchronize` (the GPU-fault guard waits after each call: the kernels' GPU time);
- `oracle`: the softmax, log-sum-exp and attention oracles (fast path and mpmath fallback);
- `compare`: the comparisons against the oracle (`compare_softmax`, `compare_attention`, `compare_lse`),
  less the oracle calls inside them;
- `fixtures`: fixture I/O and the input snapshots that check inputs are left untouched;
- `draw`: Hypothesis outside the example bodies (drawing the inputs, shrinking, its database);
- `rest`: the remainder of the example bodies (and of tests that do not use Hypothesis).

The numbers ride on the test report (`user_properties`, so they cross from xdist workers), and
`flashcheck.plugin.results_log` writes them into each test's line; `summarize` adds them up per file.

`FLASHCHECK_BUILDS_OUT=DIR` also writes one JSON line per binary compiled or loaded (the test,
cache hit or not, Triton's hash, the kernel, its signature, constants, attributes and options)
to `DIR/builds-PID.jsonl`: two runs' logs tell which key parts made a binary new.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

import pytest

PHASES = ("compile", "kernel", "sync", "oracle", "compare", "fixtures", "draw", "rest")
#: (module, function names) whose module-level bindings are timed, per phase; test modules import
#: them by name, so every binding in a flashcheck or test module is rebound (`_patch_names`).
_NAMED = {"oracle": [("flashcheck.oracles.softmax", ("softmax_oracle", "logsumexp_oracle")),
                     ("flashcheck.oracles.attention", ("attention_oracle",))],
          "compare": [("flashcheck.oracles.compare", ("compare_softmax",)),
                      ("flashcheck.oracles.attention", ("compare_attention", "compare_lse"))],
          "fixtures": [("flashcheck.fixtures.store", ("save_fixture", "load_fixture", "storage_snapshot"))]}
_clock: dict[str, float] = defaultdict(float)
_stack: list[list[float]] = []  # per open timed call: [start, seconds of timed calls inside it]


def _enter() -> None:
    _stack.append([time.perf_counter(), 0.0])


def _leave(phase: str) -> None:
    t0, inner = _stack.pop()
    elapsed = time.perf_counter() - t0
    _clock[phase] += elapsed - inner
    if _stack:
        _stack[-1][1] += elapsed


def _timed(fn: Callable, phase: str) -> Callable:
    if getattr(fn, "_flashcheck_phase", None):
        return fn

    def wrapper(*args, **kwargs):
        _enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _leave(phase)

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
        compile_ = _timed(jit.JITFunction._do_compile, "compile")

        def do_compile(self, *args, **kwargs):
            _clock["compiled"] += 1
            return compile_(self, *args, **kwargs)

        do_compile._flashcheck_phase = "compile"  # type: ignore[attr-defined]
        jit.JITFunction._do_compile = do_compile
        from triton import knobs

        previous = knobs.compilation.listener
        if not getattr(previous, "_flashcheck_phase", None):
            def listener(*, cache_hit: bool, **kwargs):
                if not cache_hit:  # built here, not loaded from the on-disk cache
                    _clock["built"] += 1
                _log_build(cache_hit, kwargs.get("src"), kwargs.get("metadata") or {})
                if previous is not None:
                    previous(cache_hit=cache_hit, **kwargs)

            listener._flashcheck_phase = "compile"  # type: ignore[attr-defined]
            knobs.compilation.listener = listener
    import torch

    if not getattr(torch.cuda.synchronize, "_flashcheck_phase", None):
        torch.cuda.synchronize = _timed(torch.cuda.synchronize, "sync")
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        return
    if not getattr(InterpretedFunction.run, "_flashcheck_phase", None):
        InterpretedFunction.run = _timed(InterpretedFunction.run, "kernel")


_BUILDS_OUT = os.environ.get("FLASHCHECK_BUILDS_OUT")


def _log_build(cache_hit: bool, src: Any, metadata: dict) -> None:
    if not _BUILDS_OUT:
        return
    fn = getattr(src, "fn", None)
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "hit": cache_hit, "hash": metadata.get("hash"),
            "kernel": getattr(fn, "__name__", repr(fn)), "fn_key": getattr(fn, "cache_key", None),
            "signature": repr(getattr(src, "signature", None)), "constants": repr(getattr(src, "constants", None)),
            "attrs": repr(getattr(src, "attrs", None)),
            "options": {k: repr(metadata.get(k)) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}}
    os.makedirs(_BUILDS_OUT, exist_ok=True)
    with open(os.path.join(_BUILDS_OUT, f"builds-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line, default=repr) + "\n")


def _patch_names(modules: Iterable[Any]) -> None:
    """Every module-level name bound to one of the `_NAMED` functions now points at its timed
    wrapper."""
    import importlib

    originals = {}
    for phase, where in _NAMED.items():
        for mod_name, names in where:
            mod = importlib.import_module(mod_name)
            for n in names:
                fn = getattr(mod, n, None)
                if fn is not None:
                    fn = getattr(fn, "__wrapped__", fn) if getattr(fn, "_flashcheck_phase", None) else fn
                    originals[id(fn)] = (fn, phase)
    for mod in list(modules):
        for name, value in list(vars(mod).items()):
            if id(value) in originals:
                fn, phase = originals[id(value)]
                setattr(mod, name, _timed(fn, phase))


def pytest_configure(config: pytest.Config) -> None:
    _patch_triton()


def pytest_collection_finish(session: pytest.Session) -> None:
    _patch_names(m for n, m in list(sys.modules.items()) if m is not None and n.startswith(("flashcheck", "test")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    _clock.clear()
    _stack.clear()
    # Hypothesis calls `hypothesis.inner_test` once per example (the hook its docs give plugins):
    # time outside it is Hypothesis's own (drawing, shrinking).
    hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
    inner = getattr(hyp, "inner_test", None)
    if inner is not None:
        hyp.inner_test = _timed(inner, "body")
    t0 = time.perf_counter()
    try:
        return (yield)
    finally:
        total = time.perf_counter() - t0
        if inner is not None:
            hyp.inner_test = inner
        spent = {p: _clock.get(p, 0.0) for p in PHASES[:6]}
        if inner is not None:
            spent["rest"] = _clock.get("body", 0.0)
            spent["draw"] = max(0.0, total - sum(spent.values()))
        else:
            spent["draw"] = 0.0
            spent["rest"] = max(0.0, total - sum(spent.values()))
        item.user_properties.append(("phases", {**{p: round(spent[p], 3) for p in PHASES},
                                                "compiled": int(_clock.get("compiled", 0)),
                                                "built": int(_clock.get("built", 0))}))


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
