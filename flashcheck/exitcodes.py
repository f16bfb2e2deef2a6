"""One exit-status contract for every flashcheck command (`flashcheck check|replay|report|kernels`,
`python -m flashcheck.reports`), so a CI job can tell a wrong kernel from a broken tool:

    0  every kernel checked passes
    1  a kernel fails: a real verdict (wrong output, raised, crashed, hung, or tests never run)
    2  bad usage or bad input: a bad option, a missing kernel file, an --out that cannot take the
       report, a malformed kernel spec or fixture; one line says what
    3  flashcheck itself failed (a bug in the tool, not a verdict on the kernel): one line names the
       error and the file its traceback was written to ($FLASHCHECK_TRACEBACK=1 prints it instead)
    5  nothing was checked: every test was skipped or deselected, no input was drawn, no fixture
       was for the kernel (never green; 5 as pytest's "no tests collected")
  130  interrupted (Ctrl-C; SIGTERM for `check`, which first prints the partial summary) with no
       failure so far (a failure so far: 1)

When several apply, the worst wins: 3, then 1, then 2, then 5, then 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from typing import Callable, NoReturn, Sequence

OK = 0
FAILED = 1
USAGE = 2
INTERNAL = 3
NOTHING_CHECKED = 5
#: Ctrl-C, as a shell reports it.
INTERRUPTED = 130
TRACEBACK_ENV = "FLASHCHECK_TRACEBACK"

#: The table as --help shows it (the module docstring's, without its preamble).
TABLE = "Exit status:\n" + __doc__.split("\n\n", 1)[1].replace("\n\nWhen", "\n    When").strip("\n")

_RANK = {INTERNAL: 4, FAILED: 3, USAGE: 2, NOTHING_CHECKED: 1, OK: 0}


def worst(*codes: int) -> int:
    """The status of a run that would exit with each of `codes` (unknown codes count as INTERNAL)."""
    return max(codes, key=lambda c: _RANK.get(c, _RANK[INTERNAL]), default=OK)


def from_pytest(code: int) -> int:
    """pytest's exit status in this contract. pytest's 2 (interrupted, or the suite could not be
    collected) and 3 (INTERNALERROR) are the tool's failures: the suite is flashcheck's own."""
    return {0: OK, 1: FAILED, 2: INTERNAL, 3: INTERNAL, 4: USAGE, 5: NOTHING_CHECKED}.get(int(code), INTERNAL)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a usage error in ONE line (argparse prints the whole usage first), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def seconds(value: str) -> float:
    """A positive, finite number of seconds (an argparse type: a bad one is a usage error)."""
    try:
        t = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected seconds") from None
    if not t > 0 or t == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive number of seconds")
    return t


def internal_error(prog: str, exc: BaseException) -> int:
    """One line naming a bug of the tool and where its traceback went; INTERNAL."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    frames = traceback.extract_tb(exc.__traceback__)
    where = f", at {_short(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    if os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0"):
        sys.stderr.write(text)
        saved = "traceback above"
    else:
        try:
            fd, path = tempfile.mkstemp(prefix=f"flashcheck-crash-{time.strftime('%Y%m%d-%H%M%S')}-",
                                        suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write(f"{prog} {' '.join(sys.argv[1:])}\n\n{text}")
            saved = f"traceback in {path} ({TRACEBACK_ENV}=1 prints it)"
        except OSError:  # no temporary folder either: the traceback itself, rather than nothing
            sys.stderr.write(text)
            saved = "traceback above"
    print(f"{prog}: internal error (a bug in flashcheck, not a verdict on the kernel): {what}{where}; {saved}",
          file=sys.stderr, flush=True)
    return INTERNAL


def _short(filename: str) -> str:
    """A frame's file relative to flashcheck's checkout or site-packages, as a bug report names it."""
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("flashcheck", "reports", "oracles", "strategies", "kernels", "tests"):
        if anchor in parts[:-1]:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return filename


def guarded(prog: str, main: Callable[[Sequence[str]], int | None], argv: Sequence[str]) -> int:
    """Run a command's `main(argv)` under this contract: an escaped exception is INTERNAL (one
    line), a SystemExit keeps its code (argparse: 2, --help: 0), Ctrl-C is 130."""
    try:
        return int(main(argv) or 0)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)  # SystemExit("message"): a usage error in words
        return USAGE
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        return internal_error(prog, e)


__all__ = ["OK", "FAILED", "USAGE", "INTERNAL", "NOTHING_CHECKED", "INTERRUPTED", "TABLE", "worst",
           "from_pytest", "ArgumentParser", "seconds", "internal_error", "guarded"]
