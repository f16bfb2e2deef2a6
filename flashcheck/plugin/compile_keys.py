"""Count the distinct Triton compilations each test would cause on a GPU, from a CPU run.

On a GPU, Triton compiles one binary per kernel and specialisation key: the constexpr values,
the argument dtypes, which integers equal 1 or are multiples of 16, which pointers are 16-byte
aligned, and the launch options (num_warps, num_stages). The first GPU run of a test pays a
compilation (about a second) for every new key. Under the interpreter nothing is compiled, but
the keys can be counted: this plugin records them per test.

    pytest -p flashcheck.plugin.compile_keys -p no:xdist flashcheck/suite/test_attention.py -k metamorphic

prints, after the run, the tests with the most distinct keys (keys already met by an earlier
test of the same process are not counted again: that is what a worker's cache does). The counts
follow the run's own shapes: under the interpreter they are smaller than a GPU run's.

`FLASHCHECK_NO_SPECIALIZE=name,name,...` counts as if those arguments were listed in
`@triton.jit(do_not_specialize=[...])`: a what-if for cutting compilations.
`FLASHCHECK_KEYS_OUT=FILE` writes every distinct key (JSON lines: kernel, test, argument -> key
part, options) for what-ifs worked out afterwards.
"""
from __future__ import annotations

import inspect
import os
from collections import defaultdict
from typing import Any

import pytest

_SEEN: set[tuple] = set()
_PER_TEST: dict[str, set[tuple]] = defaultdict(set)
_CURRENT: list[str] = []
_TOP = 25
_NO_SPECIALIZE = frozenset(filter(None, os.environ.get("FLASHCHECK_NO_SPECIALIZE", "").split(",")))


def _arg_key(value: Any, constexpr: bool, align: bool = True) -> Any:
    if constexpr:
        return ("c", repr(value))
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return ("p", str(value.dtype), align and value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("b",)
    if isinstance(value, int):
        return ("i", value == 1, align and value % 16 == 0, abs(value) >= 2**31)
    if isinstance(value, float):
        return ("f",)
    return ("o", type(value).__name__)


def specialisation_key(fn: Any, args: tuple, kwargs: dict[str, Any], jit_options: dict | None = None) -> tuple:
    """The key Triton's JIT would compile `fn` under for these arguments (an approximation of
    `triton.runtime.jit`'s specialisation: enough to tell two launches need two binaries).
    `jit_options`: the `@triton.jit` keywords (do_not_specialize, do_not_specialize_on_alignment)."""
    jit_options = jit_options or {}
    skip = _NO_SPECIALIZE | set(jit_options.get("do_not_specialize") or ())
    no_align = set(jit_options.get("do_not_specialize_on_alignment") or ())
    params = list(inspect.signature(fn).parameters.values())
    bound = dict(zip((p.name for p in params), args))
    bound.update({k: v for k, v in kwargs.items() if k in {p.name for p in params}})
    options = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in bound))
    parts = tuple((p.name, _arg_key(bound[p.name], "constexpr" in str(p.annotation), p.name not in no_align))
                  for p in params if p.name in bound and p.name not in skip)
    return (getattr(fn, "__qualname__", repr(fn)), parts, options)


def _install() -> None:
    from flashcheck import kernels  # noqa: F401  (switches on the interpreter first)
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    if getattr(original, "_flashcheck_counting", False):
        return

    def run(self, *args, grid, warmup, **kwargs):
        if _CURRENT and not warmup:
            key = specialisation_key(self.fn, args, kwargs, getattr(self, "kwargs", None))
            if key not in _SEEN:
                _SEEN.add(key)
                _PER_TEST[_CURRENT[-1]].add(key)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run._flashcheck_counting = True  # type: ignore[attr-defined]
    InterpretedFunction.run = run  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    from flashcheck.kernels import INTERPRET

    if not INTERPRET:
        raise pytest.UsageError("flashcheck.plugin.compile_keys counts under Triton's interpreter (a CPU run); on a "
                                "GPU, Triton's own cache (TRITON_CACHE_DIR, TRITON_PRINT_AUTOTUNING) tells")
    _install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    _CURRENT.append(item.nodeid)
    try:
        return (yield)
    finally:
        _CURRENT.pop()


def _write_keys(path: str) -> None:
    import json

    with open(path, "w") as f:
        for test, keys in _PER_TEST.items():
            for name, parts, options in keys:
                f.write(json.dumps({"kernel": name, "test": test, "args": {a: repr(v) for a, v in parts},
                                    "options": dict(options)}) + "\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if os.environ.get("FLASHCHECK_KEYS_OUT"):
        _write_keys(os.environ["FLASHCHECK_KEYS_OUT"])
    rows = sorted(((len(keys), nodeid) for nodeid, keys in _PER_TEST.items()), reverse=True)
    tr = terminalreporter
    tr.section("Triton specialisations (new compilations on a GPU) per test")
    for n, nodeid in rows[:_TOP]:
        tr.write_line(f"{n:5d}  {nodeid}")
    kernels = defaultdict(int)
    for key in _SEEN:
        kernels[key[0]] += 1
    tr.write_line(f"total {len(_SEEN)} distinct keys: " + ", ".join(f"{k} {v}" for k, v in sorted(kernels.items())))
    for name in sorted(kernels):
        tr.write_line(f"{name}: what varies (argument: distinct values) " + ", ".join(
            f"{arg}: {n}" for arg, n in varying_parts([k for k in _SEEN if k[0] == name])))


def varying_parts(keys: list[tuple]) -> list[tuple[str, int]]:
    """Which arguments and options of one kernel's keys take more than one value, most first."""
    values: dict[str, set] = defaultdict(set)
    for _, parts, options in keys:
        for arg, v in parts:
            values[arg].add(v)
        for opt, v in options:
            values[opt].add(v)
    return sorted(((a, len(v)) for a, v in values.items() if len(v) > 1), key=lambda t: -t[1])
