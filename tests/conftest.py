"""The self-tests run under the shipped suite's setup (Hypothesis profiles, the flashcheck plugins,
the interpreter's warning filters): `flashcheck/suite/conftest.py`, so a run of `tests/` alone has it."""
from flashcheck.suite.conftest import pytest_configure, pytest_plugins  # noqa: F401


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    """CPU CI (two workers): the slowest tests first, by `tests/ci_durations.json` (seconds per test
    of a CI run on the 2-core machine; an unknown test counts as the median), so xdist does not end
    on one long test started last; with xdist's default "load" scheduling the first consecutive batch
    would hold every slow test, hence `--dist worksteal` (pyproject.toml). The GPU lane orders by its
    own file (`--order-from`)."""
    from pathlib import Path

    from flashcheck.kernels import INTERPRET
    from flashcheck.results_log import load_durations, longest_first

    order = Path(__file__).with_name("ci_durations.json")
    if INTERPRET and order.is_file() and not config.getoption("--order-from", None):
        items[:] = longest_first(items, load_durations(str(order)))
