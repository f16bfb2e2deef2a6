"""`python -m flashcheck.reports`: the stability report (see reports/cli.py; `flashcheck report`
calls the same `main(argv)`)."""
from __future__ import annotations

from .cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
