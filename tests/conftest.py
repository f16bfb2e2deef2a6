"""Suite configuration: Hypothesis profiles, the kernel under test, parametrization.

Test modules set `FAMILY = "softmax"` (or "attention"); any test taking a `spec` argument is
run for every active kernel of that family, and a `dtype` argument for each dtype it supports.
`--kernel path/to/file.py:function --family softmax` replaces the registry by that one kernel.
"""
from __future__ import annotations

import os

# The oracles' float64 matrix products are small: one BLAS thread per xdist worker beats a pool
# per worker fighting over the same cores. Set before NumPy loads its BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from flashcheck import kernels  # noqa: F401  (switches on the interpreter before anything imports triton)
from flashcheck.kernels.registry import ALL_DTYPES, FAMILIES, REGISTRY, KernelSpec
from flashcheck.external import KernelLoadError, load_kernel
from flashcheck.oracles.formats import format_of
from flashcheck import harness

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


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashcheck")
    g.addoption("--kernel", default=None, metavar="FILE.py:FUNCTION",
                help="check this kernel instead of the registered ones")
    g.addoption("--family", default=None, choices=FAMILIES,
                help="the kernel family: which suite runs (required with --kernel)")
    g.addoption("--kernel-dtypes", default=None, metavar="fp16,bf16,fp32",
                help="dtypes the external kernel supports (default: all, or its `flashcheck` attribute)")
    g.addoption("--kernel-max-n", type=int, default=None, help="longest row/key length it supports")
    g.addoption("--no-save-fixtures", action="store_true",
                help="do not write regression fixtures for shrunk failures")
    g.addoption("--fixture-dir", default=None, help="where regression fixtures are written and read")


def load_external_kernel(target: str, family: str, dtypes: str | None, max_n: int | None) -> KernelSpec:
    overrides = {k: v for k, v in (("dtypes", dtypes), ("max_n", max_n)) if v is not None}
    try:
        return load_kernel(target, family, overrides=overrides)
    except KernelLoadError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--no-save-fixtures"):
        os.environ[harness.SAVE_ENV] = "0"
    if config.getoption("--fixture-dir"):
        os.environ[harness.DIR_ENV] = str(Path(config.getoption("--fixture-dir")).resolve())
    target, family = config.getoption("--kernel"), config.getoption("--family")
    if target:
        if not family:
            raise pytest.UsageError("--kernel needs --family softmax|attention")
        spec = load_external_kernel(target, family, config.getoption("--kernel-dtypes"),
                                    config.getoption("--kernel-max-n"))
        REGISTRY[:] = [spec]


def _active(family: str, config: pytest.Config) -> list[KernelSpec]:
    wanted = config.getoption("--family")
    if wanted and wanted != family:
        return []
    return [s for s in REGISTRY if s.family == family]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spec" not in metafunc.fixturenames:
        return
    family = getattr(metafunc.module, "FAMILY", None)
    if family is None:
        raise pytest.UsageError(f"{metafunc.module.__name__} takes `spec` but sets no FAMILY")
    specs = _active(family, metafunc.config)
    if "dtype" in metafunc.fixturenames:
        params = [(s, d) for s in specs for d in s.dtypes]
        ids = [f"{s.name}-{format_of(d).name}" for s, d in params]
        metafunc.parametrize(("spec", "dtype"), params, ids=ids)
    else:
        metafunc.parametrize("spec", specs, ids=[s.name for s in specs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --kernel or --family, run the family's kernel tests and nothing else."""
    if not (config.getoption("--kernel") or config.getoption("--family")):
        return
    def runs_a_kernel(item: pytest.Item) -> bool:
        callspec = getattr(item, "callspec", None)
        return callspec is not None and ("spec" in callspec.params or "fixture" in callspec.params)

    keep = [i for i in items if runs_a_kernel(i)]
    drop = [i for i in items if not runs_a_kernel(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
