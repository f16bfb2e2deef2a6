"""flashcheck: property-based correctness and numerical-stability tests for softmax and attention
kernels.

One import name holds everything: `flashcheck.kernels` (production Triton kernels and the
registry), `flashcheck.oracles`, `flashcheck.strategies` and `flashcheck.reports`, plus the engine in this
package (properties, fixtures, the pytest plugin, the command line) and `flashcheck.suite` (the
family suites that ship, their regression fixtures and the known-bad zoo). The project's own
self-tests (the repository's `tests/`) do not ship.

Installed, those live under `site-packages/flashcheck/`. In a source checkout they are the
repository's top-level folders (the layout the project is developed in); the package then
extends its own `__path__` with the repository root so `flashcheck.kernels` is `kernels/`.
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0"

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent
if not (_HERE / "kernels").is_dir() and (_CHECKOUT / "kernels" / "__init__.py").is_file() \
        and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821  (a package's own __path__)

#: The folder holding `kernels/`, `oracles/`, `strategies/`, `reports/`: the repository root in a
#: checkout, this package's folder when installed.
HOME: Path = _HERE if (_HERE / "kernels").is_dir() else _CHECKOUT
#: The folder to put on `sys.path` (e.g. a subprocess's PYTHONPATH) so `import flashcheck` finds
#: this very copy.
IMPORT_ROOT: Path = _HERE.parent
#: The shipped suite (`flashcheck.suite`): the family suites, `regressions/` and the zoo.
SUITE: Path = _HERE / "suite"


#: Where fixtures go when no folder is named and the run is not flashcheck's own suite (an external
#: kernel's author's repository, not flashcheck's).
LOCAL_FIXTURE_DIR = "flashcheck-regressions"

