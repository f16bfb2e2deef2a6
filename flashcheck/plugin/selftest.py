"""Running pytest in a subprocess for the suite's own self-tests (fixtures, timeouts, sharding).

A subprocess must see only the flags its test gives it. Everything that configures pytest,
Hypothesis or flashcheck through the environment (`PYTEST_ADDOPTS`, `PYTEST_TIMEOUT`,
`PYTEST_XDIST_WORKER`, `FLASHCHECK_SAVE_FIXTURES`, `FLASHCHECK_FIXTURE_DIR`, `CI`, ...) is
dropped, so an outer run's `--no-save-fixtures`, worker id or profile cannot leak in; and
`FLASHCHECK_SUITE_FIXTURES=0`: a subprocess never writes into flashcheck's own flashcheck/suite/regressions
(the checkout's pyproject.toml opts its pytest runs in), whatever kernel it breaks on purpose.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from flashcheck import HOME, IMPORT_ROOT

_DROP_PREFIXES = ("PYTEST_", "HYPOTHESIS_", "FLASHCHECK_")
_DROP = ("CI",)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without pytest/Hypothesis/flashcheck settings, with this copy
    of flashcheck first on PYTHONPATH, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES) and k not in _DROP}
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["FLASHCHECK_SUITE_FIXTURES"] = "0"  # flashcheck.fixtures.store.SUITE_ENV (not imported: it loads torch)
    env.update(extra or {})
    return env


#: What every pytest subprocess runs with before its own arguments: one process, quiet.
PYTEST_FLAGS = ("-p", "no:xdist", "-q")


def run_pytest(*args: str, cwd: Path = HOME, env: Mapping[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m pytest -p no:xdist -q ARGS` in `cwd` with a clean environment (plus `env`); the
    suite's measured runs (`flashcheck.plugin.killrun.run_pytest`) go through here too."""
    return subprocess.run([sys.executable, "-m", "pytest", *PYTEST_FLAGS, *args], cwd=cwd,
                          env=clean_env(env), capture_output=True, text=True, timeout=timeout)
