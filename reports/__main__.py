"""`python -m flashcheck.reports`: the stability report, exactly `flashcheck report` (supervised, so
a kernel that exits, crashes or hangs is one named error; exit status per flashcheck.exitcodes).
`main(argv)` is the unsupervised report itself (reports/stability/cli.py)."""
from __future__ import annotations

import sys

from .stability.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    from flashcheck.cli.main import main as flashcheck

    raise SystemExit(flashcheck(["report", *sys.argv[1:]]))
