"""The suite's Hypothesis profiles, and its plugin for runs from a checkout where flashcheck is
not installed (installed, the `pytest11` entry point has already loaded it)."""
from __future__ import annotations

import os

# Before NumPy loads its BLAS: the oracles' float64 products are small, one thread per process.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from flashcheck import kernels  # noqa: E402,F401  (switches on the interpreter before anything imports triton)

pytest_plugins = ["flashcheck.plugin"]

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.large_base_example, HealthCheck.differing_executors]
_COMMON = dict(deadline=None, suppress_health_check=_SLOW_OK, print_blob=True)
# ci: derandomized and sized so the whole CPU run fits CI; dev: random, a bit more;
# gpu: an order of magnitude more than ci (the GPU runs kernels in microseconds), still
# derandomized so GPU CI is repeatable; soak: as many, random, for hunting false alarms with
# --hypothesis-seed.
settings.register_profile("ci", max_examples=12, derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", max_examples=25, **_COMMON)
settings.register_profile("gpu", max_examples=120, derandomize=True, database=None, **_COMMON)
settings.register_profile("soak", max_examples=120, database=None, **_COMMON)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("gpu" if torch.cuda.is_available() else "ci")
else:
    settings.load_profile("gpu" if torch.cuda.is_available() else "dev")


def pytest_configure(config) -> None:
    # The interpreter computes in NumPy: IEEE specials raise these warnings by design.
    for w in ("ignore:invalid value encountered:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning",
              "ignore:divide by zero encountered:RuntimeWarning", "ignore:All-NaN slice encountered:RuntimeWarning",
              # Triton 3.6's interpreter on run-time loop bounds (NUMERICS.md s. 6; an error from NumPy 2.4)
              "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"):
        config.addinivalue_line("filterwarnings", w)
