"""Pytest side of the tiers (`flashcheck.plugin.profiles`): the `slow` and `gpu_only` markers and the
default per-test timeout. A pytest plugin (loaded next to `flashcheck.plugin`).

Markers, all registered so `-m "softmax and not slow"` selects without warnings:
- one per family (`softmax`, `attention`, `cross_entropy`, ...): from the test module's `FAMILY` (added by
  `flashcheck.plugin`);
- `gpu_only`: skipped with a reason under Triton's interpreter. Given explicitly, or added to any
  test whose skip condition is "GPU only: ..." (a `skipif(INTERPRET, reason="GPU only: ...")`),
  so `-m gpu_only` on a GPU runs exactly those;
- `slow`: tests that start subprocesses or otherwise take far longer than a property test;
  `-m "not slow"` leaves them out (the smoke tier's command line does).

The timeout (pytest-timeout) is the tier's `profiles.default_timeout` unless `--timeout`,
`PYTEST_TIMEOUT` or an ini `timeout` says otherwise (`--timeout 0` switches it off). The default
method is `thread` (dump every stack, end the process; under xdist the test is reported failed and
a new worker starts), not pytest-timeout's `signal`: a kernel hung inside a CUDA call never returns
to Python to receive the signal's exception, and in a Hypothesis test that exception is caught as
an ordinary failure and the hung example run again while shrinking, with no timer left.
"""
from __future__ import annotations

import os

import pytest

from flashcheck.plugin import profiles

MARKERS = {
    "slow": "starts subprocesses or otherwise takes far longer than a property test (deselect: -m 'not slow')",
    "gpu_only": "needs a GPU: skipped under Triton's interpreter",
}
#: The reason prefix that marks an existing skip condition as a GPU-only test.
GPU_ONLY_REASON = "GPU only"


def active_profile(config: pytest.Config) -> str:
    """The Hypothesis profile this run uses: `--hypothesis-profile`, else the default."""
    return config.getoption("hypothesis_profile", default=None) or profiles.default_profile()


def _timeout_given(config: pytest.Config) -> bool:
    return (config.getoption("timeout", default=None) is not None or bool(os.environ.get("PYTEST_TIMEOUT"))
            or bool(config.getini("timeout")))


def _check_profile(config: pytest.Config) -> None:
    """An unknown --hypothesis-profile is a usage error, before Hypothesis's own plugin meets it as
    an INTERNALERROR (flashcheck's tiers and any a conftest registered are known by now)."""
    name = config.getoption("hypothesis_profile", default=None)
    if not name:
        return
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(name)
    except InvalidArgument:
        raise pytest.UsageError(f"--hypothesis-profile {name!r}: no such profile (flashcheck's tiers: "
                                f"{', '.join(profiles.PROFILES)}; or one your conftest registers)") from None


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout and Hypothesis read their settings in theirs
def pytest_configure(config: pytest.Config) -> None:
    _check_profile(config)
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if not config.pluginmanager.hasplugin("timeout"):
        return
    if not _timeout_given(config):
        config.option.timeout = profiles.default_timeout(active_profile(config))
    if config.getoption("timeout_method", default=None) is None and not config.getini("timeout_method"):
        config.option.timeout_method = "thread"


def _is_gpu_only_skip(mark: pytest.Mark) -> bool:
    return mark.name == "skipif" and str(mark.kwargs.get("reason", "")).startswith(GPU_ONLY_REASON)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from flashcheck.kernels import INTERPRET

    skip = pytest.mark.skip(reason=f"{GPU_ONLY_REASON}: marked gpu_only, and kernels run in Triton's interpreter")
    for item in items:
        if item.get_closest_marker("gpu_only") is None and any(_is_gpu_only_skip(m) for m in item.iter_markers()):
            item.add_marker("gpu_only")
        elif item.get_closest_marker("gpu_only") is not None and INTERPRET:
            item.add_marker(skip)
