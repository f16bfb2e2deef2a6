"""The self-tests run under the shipped suite's setup (Hypothesis profiles, the flashcheck plugins,
the interpreter's warning filters): `flashcheck/suite/conftest.py`, so a run of `tests/` alone has it."""
import pytest

from flashcheck.suite.conftest import pytest_configure, pytest_plugins  # noqa: F401


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_auto_num_workers(config):  # noqa: ANN001, ANN201
    """`pytest -n auto` of this repository on a machine without a GPU: one worker more than the
    CPU has cores. The self-tests spend much of their time waiting on subprocesses (a `flashcheck
    check` starting up, a hang running into its timeout), which left a 2-core CI machine idle 22% of
    the run with two workers (user 1,507 s in 970 s wall); three took the run from 966 s to 879 s
    with the same CPU time. With a GPU, xdist's own count stands.

    The same run then steals work (`--dist worksteal`) unless a mode was chosen: with `load`, tests
    already queued on a worker stay there, and on the 2-core machine two of three workers sat idle
    for the last 57 s of a 766 s run while the third finished its queue of softmax classes."""
    import os

    from flashcheck.kernels import INTERPRET

    if not INTERPRET or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if config.option.dist == "no":  # xdist would make it "load" next (pytest_cmdline_main)
        config.option.dist = "worksteal"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1
