"""The suite's Hypothesis profiles, and its plugins for runs from a checkout where flashcheck is
not installed (installed, the `pytest11` entry points have already loaded them). It ships with the
suite; the repository's self-tests (`tests/conftest.py`) reuse it."""
from __future__ import annotations

import os

import pytest

# Before NumPy loads its BLAS: the oracles' float64 products are small, one thread per process.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from flashcheck.plugin import devices  # noqa: E402

from flashcheck.plugin import profiles

devices.assign_worker_gpu()  # first: before anything asks torch for a GPU (one GPU per xdist worker)

from hypothesis import settings  # noqa: E402

from flashcheck import kernels  # noqa: E402,F401  (switches on the interpreter before anything imports triton)
from flashcheck.isolation import compile_lock  # noqa: E402

compile_lock.install()  # on a GPU: xdist workers needing one binary compile it once

pytest_plugins = ["flashcheck.plugin", "flashcheck.plugin.tiers", "flashcheck.plugin.quick_first"]

profiles.register_profiles()
settings.load_profile(profiles.default_profile())


def pytest_configure(config) -> None:
    # The interpreter computes in NumPy: IEEE specials raise these warnings by design.
    for w in ("ignore:invalid value encountered:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning",
              "ignore:divide by zero encountered:RuntimeWarning", "ignore:All-NaN slice encountered:RuntimeWarning",
              # Triton 3.6's interpreter on run-time loop bounds (NUMERICS.md s. 6; an error from NumPy 2.4)
              "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"):
        if w not in config.getini("filterwarnings"):  # once when tests/conftest.py runs this too
            config.addinivalue_line("filterwarnings", w)


@pytest.hookimpl(tryfirst=True)  # after Hypothesis's wrapper has keyed the test, before it runs
def pytest_runtest_call(item: pytest.Item) -> None:
    inner = getattr(getattr(getattr(item, "obj", None), "hypothesis", None), "inner_test", None)
    if inner is not None and hasattr(inner, "_hypothesis_internal_add_digest"):  # Hypothesis keyed it
        from flashcheck.suite import seed_key

        inner._hypothesis_internal_add_digest = seed_key(item.path.name, item.nodeid.split("::", 1)[1]).encode()
