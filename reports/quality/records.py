"""The committed records under reports/records/ and their index, reports/records/README.md.

    python -m flashcheck.reports.quality.records            # print the index
    python -m flashcheck.reports.quality.records --write    # write reports/records/README.md
    python -m flashcheck.reports.quality.records --check    # exit 1 where the index or a record is wrong

A record is for a reader: a header, then the current result only (history is `git log`). The
header is one bullet per field of FIELDS, right below the title, e.g.

    - kernels digest: `f42c093efa929d98`

The kernels digest says which kernels the numbers were measured at; the index calls a record
*current* when every digest its header names is the digest of kernels/ at HEAD, and *stale*
otherwise. A record that runs no kernel says `none` and cannot go stale through kernels/.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from flashcheck import HOME
from flashcheck.reports import RECORDS
from flashcheck.records import (  # noqa: F401  (the index reads records through these names too)
    FIELDS, MAX_LINES, _digest, _git, head_digest, header, kernels_digest, short_commit,
)

INDEX = RECORDS / "README.md"
_DIGEST = re.compile(r"`([0-9a-f]{16})`")
_SECTIONS = re.compile(r"`([0-9a-f]{16})`(?: \(([^)]*)\))?")
_FIELD = re.compile(r"^- (?P<k>[a-z ]+): (?P<v>.*)$")


# ---- records made of sections (the bench records) ---------------------------------------------------

#: How a section of a bench record says where it was measured (bench/attention.py's run_info writes it).
STAMP = re.compile(r"(?P<device>[^\n;`]+?), (?P<date>\d{4}-\d{2}-\d{2}); torch (?P<torch>[^,;\s]+), "
                   r"triton (?P<triton>[^;\s]+); commit (?P<commit>\w+), kernels `(?P<digest>[0-9a-f]{16})`")
_BLOCK = re.compile(r"<!-- (?:bench:)?(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /(?:bench:)?(?P=name) -->", re.S)


def stamp() -> str:
    """`commit C, kernels `D`` for a section's first line."""
    return f"commit {short_commit()}, kernels `{kernels_digest()}`"


def sectioned_header(text: str, title: str, what: str, command: str) -> str:
    """`text` (sections between `<!-- NAME -->` markers) with its header rebuilt from the sections'
    stamps: a section rewritten at other kernels than the rest shows as its own digest."""
    found = [(b["name"], m) for b in _BLOCK.finditer(text) for m in [STAMP.search(b["body"])] if m]

    def by(value) -> str:  # one value, or each with the sections it holds for
        groups: dict[str, list[str]] = {}
        for name, m in found:
            groups.setdefault(value(m), []).append(name)
        if len(groups) == 1:
            return next(iter(groups))
        return "; ".join(f"{v} ({', '.join(ns)})" for v, ns in groups.items()) or "?"

    dates = sorted({m["date"] for _, m in found})
    head = header(title, what=what, device=by(lambda m: f"{m['device']}, torch {m['torch']}, triton {m['triton']}"),
                  date=" to ".join(dict.fromkeys([dates[0], dates[-1]])) if dates else "?",
                  commit=by(lambda m: m["commit"]), digest=by(lambda m: f"`{m['digest']}`"), command=command)
    start = text.find("<!-- ")
    return "\n".join(head) + "\n" + (text[start:] if start >= 0 else text)


def read_header(text: str) -> dict[str, str]:
    """The header's fields (those of FIELDS found in the bullets right after the title)."""
    out: dict[str, str] = {}
    for line in text.splitlines()[1:20]:
        m = _FIELD.match(line)
        if m and m["k"] in FIELDS:
            out[m["k"]] = m["v"]
    return out


def digests(fields: dict[str, str]) -> list[str]:
    return _DIGEST.findall(fields.get("kernels digest", ""))


def status(fields: dict[str, str], current: str) -> str:
    """current, stale, or stale with the sections that are current named (a record of sections)."""
    ds = digests(fields)
    if not ds:
        return "current (runs no kernel)"
    if all(d == current for d in ds):
        return "current"
    fresh = [names for d, names in _SECTIONS.findall(fields["kernels digest"]) if d == current and names]
    return f"stale (current: {', '.join(fresh)})" if fresh else "stale"


#: The GPU lane's record keeps the path the project's definition of done names, beside the folder.
LANE = RECORDS.parent / "gpu_run.md"


def records() -> list[Path]:
    """Every committed record: the Markdown under reports/records/ but this index, and the lane's."""
    found = [*RECORDS.glob("*.md"), *RECORDS.glob("*/*.md"), *([LANE] if LANE.exists() else [])]
    return sorted(p for p in found if p != INDEX)


def _name(p: Path) -> str:
    """A record's path relative to the index (the lane's is ../gpu_run.md)."""
    return p.relative_to(RECORDS).as_posix() if RECORDS in p.parents else f"../{p.name}"


def _title(text: str) -> str:
    return next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), "?")


def problems() -> list[str]:
    """What makes a record unfit: a field of the header missing, a header before the title, too long."""
    bad = []
    for p in records():
        text = p.read_text()
        name = _name(p)
        if not text.startswith("# "):
            bad.append(f"{name}: does not open with its title")
        missing = [k for k in FIELDS if k not in read_header(text)]
        if missing:
            bad.append(f"{name}: header lacks {', '.join(missing)}")
        elif not digests(read_header(text)) and not read_header(text)["kernels digest"].startswith("none"):
            bad.append(f"{name}: kernels digest is neither `<16 hex digits>` nor none")
        n = len(text.splitlines())
        if n > MAX_LINES:
            bad.append(f"{name}: {n} lines (at most {MAX_LINES})")
    return bad


def index(current: str | None = None) -> str:
    current = current or head_digest()
    lines = ["# The records under reports/records/ (and the GPU lane's, reports/gpu_run.md)", "",
             f"Each record states what it measures, the device, the date, the commit, the kernels digest and the "
             f"command that regenerates it, then its current result; its history is `git log`. **current**: "
             f"measured at the kernels of HEAD (digest `{current}`, sha256 over `kernels/*.py`); **stale**: "
             f"measured at other kernels, which the record names. Regenerate this index with "
             f"`python -m flashcheck.reports.quality.records --write` (tests/test_records.py holds it to the records).", "",
             "| record | what it measures | kernels digest | status | command |", "|---|---|---|---|---|"]
    for p in records():
        f = read_header(p.read_text())
        what = f.get("what", "?").replace("|", "/")
        lines.append(f"| [{_name(p)}]({_name(p)}) | {what} | "
                     f"{f.get('kernels digest', '?').replace('|', '/')} | {status(f, current)} | "
                     f"{f.get('command', '?').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashcheck.reports.quality.records", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {INDEX.relative_to(HOME)}")
    g.add_argument("--check", action="store_true", help="exit 1 if the index is out of date or a record is unfit")
    a = ap.parse_args(argv)
    text = index()
    if a.write:
        INDEX.write_text(text)
        print(f"wrote {INDEX.relative_to(HOME)}")
    elif a.check:
        bad = problems() + ([] if INDEX.exists() and INDEX.read_text() == text else
                            [f"{INDEX.relative_to(HOME)} is not the index of today's records: run with --write"])
        print("\n".join(bad) or "ok", file=sys.stderr if bad else sys.stdout)
        return 1 if bad else 0
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
