"""A report's output folder, replaced whole or not at all.

The report is written into a fresh sibling folder (`.NAME.new-XXXX`, same filesystem) and swapped
into place by renames at the end: a crash while plotting or writing leaves the previous report
byte-identical, and the new one never mixes with an earlier run's files (`--no-plots` leaves no stale
pictures). Because the whole folder is replaced, `--out` must be new, empty, or an earlier report:
a folder holding anything else (`--out .`) is refused before any measuring, as is a regular file.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: What a report writes (reports/cli.py): stability.{md,html,json} and stability_*.png.
REPORT_FILE = re.compile(r"stability(\.(md|html|json)|_[\w.-]+\.png)")


def problem(out: Path) -> str | None:
    """Why the folder `out` cannot take a report, in words (None: it can)."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is a file, not a folder"
    parent = out.parent
    while not parent.exists():  # created with the report: the first existing ancestor decides
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: {parent} is not writable"
    if out.is_dir():
        try:
            foreign = sorted(p.name for p in out.iterdir() if not REPORT_FILE.fullmatch(p.name))
        except OSError as e:
            return f"--out {out}: cannot be read ({e.strerror})"
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            return (f"--out {out}: holds files that are not a flashcheck report ({', '.join(foreign[:3])}{more}); "
                    "the report replaces the whole folder: name a new or empty one")
    return None


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh folder to write the report into; on leaving without an error it becomes `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        yield new
        os.chmod(new, 0o755)  # mkdtemp's 0700 would hide the report from a web server or a colleague
        swap(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise


def swap(new: Path, out: Path) -> None:
    """Put the folder `new` at `out`. rename() cannot replace a non-empty folder: the old one is
    renamed aside first and put back if the second rename fails, then deleted."""
    if not out.exists():
        os.rename(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / out.name)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old / out.name, out)
        os.rmdir(old)
        raise
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["problem", "staged", "swap", "REPORT_FILE"]
