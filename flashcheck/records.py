"""What a committed record is made of: its header fields and the digest of the kernels it was
measured at. The engine's writers (the mutation report) and reports/'s write records in this shape;
reports/quality/records.py indexes them (reports/records/README.md).
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from flashcheck import HOME

FIELDS = ("what", "device", "date", "commit", "kernels digest", "command")
MAX_LINES = 200


def _digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(files):
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def kernels_digest(commit: str | None = None) -> str:
    """sha256 over kernels/*.py (names and bytes): which kernels a record was made at. `commit`:
    git's copy at that commit instead of the working tree."""
    if commit is None:
        return _digest([(p.name, p.read_bytes()) for p in (HOME / "kernels").glob("*.py")])
    names = _git("ls-tree", "--name-only", commit, "kernels/").decode().split()
    return _digest([(Path(n).name, _git("show", f"{commit}:{n}")) for n in names if n.endswith(".py")])


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=HOME, capture_output=True, check=True).stdout


def head_digest() -> str:
    """The digest of kernels/ as committed (what the index is about), or the working tree's where
    there is no git checkout (an installed copy)."""
    try:
        return kernels_digest("HEAD")
    except (OSError, subprocess.CalledProcessError):
        return kernels_digest()


def short_commit() -> str:
    try:
        return _git("rev-parse", "--short", "HEAD").decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def header(title: str, *, what: str, device: str, date: str, commit: str, digest: str, command: str,
           note: str = "") -> list[str]:
    """A record's first lines. `digest`: the kernels digest as Markdown (backticked), or `none`."""
    vals = dict(zip(FIELDS, (what, device, date, commit, digest, f"`{command}`")))
    return [f"# {title}", "", *[f"- {k}: {vals[k]}" for k in FIELDS], *(["", note] if note else []), ""]
