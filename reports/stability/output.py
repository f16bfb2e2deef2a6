"""A report's output folder, replaced whole or not at all.

The report is written into a fresh sibling folder (`.NAME.new-XXXX`, same filesystem) and swapped
into place by renames at the end: a crash while plotting or writing leaves the previous report
byte-identical, and the new one never mixes with an earlier run's files (`--no-plots` leaves no stale
pictures). Because the whole folder is replaced, `--out` must be new, empty, or an earlier report:
a folder holding anything else (`--out .`) is refused before any measuring, as is a regular file,
a folder that cannot be created and one inside flashcheck's own package (its committed records).
Anything that appears in `--out` while the report runs and is not a report's file is carried into
the new folder at the swap: nothing the tool did not write is ever deleted.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: What a report writes (reports/stability/cli.py): stability.{md,html,json} and stability_*.png.
REPORT_FILE = re.compile(r"stability(\.(md|html|json)|_[\w.-]+\.png)")


#: What mkdtemp adds to a name for the staging folders (`.NAME.new-` and 8 random characters).
STAGING_EXTRA = len("..new-") + 8


def problem(out: Path) -> str | None:
    """Why the folder `out` (resolved) cannot take a report, in words (None: it can)."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is a file, not a folder"
    own = _inside_flashcheck(out)
    if own:
        return (f"--out {out}: is inside flashcheck's own package ({own}), beside its committed records: "
                "name a folder outside it")
    parent = out.parent
    while not parent.exists():  # created with the report: the first existing ancestor decides
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: {parent} is not writable"
    made = _probe(out, parent)
    if made:
        return made
    if out.is_dir():
        try:
            foreign = foreign_names(out)
        except OSError as e:
            return f"--out {out}: cannot be read ({e.strerror})"
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            return (f"--out {out}: holds files that are not a flashcheck report ({', '.join(foreign[:3])}{more}); "
                    "the report replaces the whole folder: name a new or empty one")
    return None


def foreign_names(out: Path) -> list[str]:
    """What in the folder `out` a report did not write (a folder named like a report file included)."""
    return sorted(p.name for p in out.iterdir()
                  if not REPORT_FILE.fullmatch(p.name) or (p.is_dir() and not p.is_symlink()))


def _inside_flashcheck(out: Path) -> Path | None:
    """The flashcheck package folder `out` is in, if any (a report there would land among the
    tool's sources and replace a committed record such as reports/records/stability_gpu/)."""
    import flashcheck

    here = Path(flashcheck.__file__).resolve().parent
    for d in (here, *(flashcheck.HOME.resolve() / n for n in ("kernels", "oracles", "strategies", "reports"))):
        if out == d or d in out.parents:
            return d
    return None


def _probe(out: Path, parent: Path) -> str | None:
    """Create and remove a folder where the report will create its own, and check the names it will
    make: os.access says yes to root on /proc or a read-only mount, and a name too long passed,
    both found only after every kernel had been measured."""
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    names = [(n, limit) for n in out.parent.relative_to(parent).parts] + [(out.name, limit - STAGING_EXTRA)]
    for name, most in names:
        if len(os.fsencode(name)) > most:
            return f"--out {out}: the name {name[:24]}... is too long ({len(os.fsencode(name))} bytes, at most {most})"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".flashcheck-probe-", dir=parent))
    except OSError as e:
        return f"--out {out}: cannot create a folder in {parent} ({e.strerror or e})"
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
    renamed aside first and put back if the second rename fails, then emptied of the report's files.
    Whatever `out` holds that a report did not write (checked before measuring, but a user or
    another program may have written since) is moved into `new` first, so it stays at its path (a
    rename keeps an open file's writes going to it), and back if the swap fails."""
    if not out.exists():
        try:
            os.rename(new, out)
            return
        except OSError:
            if not out.is_dir():  # (it appeared meanwhile: carried over below)
                raise
    _carry(out, new)
    try:
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rename(out, old / out.name)
    except BaseException:
        _carry(new, out)
        raise
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old / out.name, out)
        os.rmdir(old)
        _carry(new, out)
        raise
    _carry(old / out.name, out)  # written between the first carry and the rename
    _remove_report(old / out.name)


def _carry(src: Path, dst: Path) -> None:
    for name in foreign_names(src):
        if not os.path.lexists(dst / name):  # (a clash stays where it is, never replaced)
            os.rename(src / name, dst / name)


def _remove_report(folder: Path) -> None:
    """Delete an earlier report's files and its folder; anything else keeps the folder (hidden
    beside `--out` as .NAME.old-*), never deleted."""
    for p in folder.iterdir():
        if REPORT_FILE.fullmatch(p.name) and (p.is_symlink() or not p.is_dir()):
            p.unlink()
    try:
        folder.rmdir()
        folder.parent.rmdir()
    except OSError:
        pass


__all__ = ["problem", "staged", "swap", "foreign_names", "REPORT_FILE"]
