"""The `flashcheck` command.

    flashcheck check TARGET [--family F] [capability flags] [any pytest option ...]
    flashcheck replay FIXTURE.json ... [--kernel TARGET]
    flashcheck report ...            (the stability report: flashcheck report --help)
    flashcheck kernels               (the registered kernels and their declared capabilities)

TARGET is `path/to/file.py:function`, `package.module:function` or a registered kernel's name.
`check` runs the family's suite on the kernel through pytest (every option it does not know is
passed on: `-n auto`, `-k`, `-x`, `--hypothesis-profile`), writes fixtures of shrunk failures to
./flashcheck-regressions/ (`--fixture-dir` to change it) and replays the ones already there.
`check`, `replay` and `report` run kernels in a supervised child (`flashcheck.isolation.journal`): a kernel
that exits, crashes, hangs or kills the CUDA context is one named failure, and the run goes on.
A kernel that cleanly refuses a feature it never declared (ValueError & co. from its own code,
before launching) has those examples skipped, with one summary line per feature naming the
declaration that skips it (flashcheck.properties.refusals). Writing to a file or pipe, `check` prints
progress as tests end and each failure at once; SIGTERM or Ctrl-C prints the partial summary
and exits 1 (a test failed) or 130 (flashcheck.plugin.progress).
"""
# The exit-status table (flashcheck.exitcodes) is appended to this docstring below, for --help.
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from flashcheck import exitcodes, families
from flashcheck.isolation.journal import DEFAULT_TASK_TIMEOUT

__doc__ = f"{__doc__.strip()}\n\n{exitcodes.TABLE}"


class _CheckParser(exitcodes.ArgumentParser):
    """Its epilog lists the capability keys, which live beside the kernel loader (and torch): built
    only when help is printed, so a plain `check` never imports them in this process."""

    def format_help(self) -> str:
        from flashcheck.targets.external import CAPABILITIES

        self.epilog = (
            "Options not listed here go to pytest unchanged, among them the capability flags:\n"
            "  --kernel-dtypes fp16,bf16  --kernel-min-n N  --kernel-max-n N  --kernel-sizes N,N\n"
            "  --kernel-cap KEY=VALUE (repeatable), --fixture-dir DIR, --no-save-fixtures,\n"
            "  -n auto, -x, -k EXPR, --hypothesis-profile NAME, --quick-first N (every test first\n"
            "  with N examples: an early first failure; 12 in the gpu tier, 0 turns it off).\n"
            "To a file or pipe (a CI log) it prints progress at most every $FLASHCHECK_PROGRESS s (10; 0: off) and\n"
            "each failure at once; SIGTERM or Ctrl-C prints the partial summary, then exits 1 or 130.\n"
            "A feature the kernel never declared and cleanly refuses (ValueError, NotImplementedError,\n"
            "TypeError, AssertionError from its own code, before launching) is skipped, one line per\n"
            "feature at the end naming the declaration that skips it and the one that fails it.\nCapability keys:\n"
            + "\n".join(f"  {k:16s} {c.help}" for k, c in CAPABILITIES.items()) + "\n\n" + exitcodes.TABLE)
        return super().format_help()


def _check(argv: Sequence[str]) -> int:
    p = _CheckParser(prog="flashcheck check", description="Run a family's suite on one kernel.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="FILE.py:FUNCTION, package.module:FUNCTION or a registered kernel name")
    p.add_argument("--family", choices=families.names(), help="which suite (inferred for registered kernels and KernelSpecs)")
    ns, rest = p.parse_known_args(argv)
    family = ns.family
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if family is None:
        # A KernelSpec or a registered name carries its family: load the kernel here to learn it (a
        # bad target is one line now). With --family this process never imports torch or the
        # kernel: the child's plugin loads it and names a bad target in one line of its own
        # (pytest's `ERROR:`, status 2). Loading it here too cost 2.5 of the 8 CPU-seconds of a
        # small check on a 2-core CPU.
        from flashcheck.targets.external import KernelLoadError, load_kernel

        try:
            family = load_kernel(ns.target, family).family
        except KernelLoadError as e:
            print(f"flashcheck check: {e}", file=sys.stderr)
            return exitcodes.USAGE
    problem = _fixture_dir_problem(rest)
    if problem:
        print(f"flashcheck check: --fixture-dir {problem}", file=sys.stderr)
        return exitcodes.USAGE
    import pytest

    from flashcheck.families import suite_paths

    args = [*suite_paths(family), "-p", "flashcheck.plugin", "-p", "no:cacheprovider",
            f"--kernel={ns.target}", f"--family={family}", *rest]
    # A debugger needs the tests in this process; a listing runs no test (nothing to supervise, and
    # its tests are neither "not run" nor "nothing checked").
    if any(a in ("--pdb", "--trace", *LISTINGS) for a in rest):
        return exitcodes.from_pytest(int(pytest.main(args)))
    from flashcheck.isolation import supervisor
    from flashcheck.plugin import progress

    sup = supervisor.Supervisor(_python("-m", "pytest", *args), unit="tests", translate=exitcodes.from_pytest,
                               caller_interrupts=True)
    try:
        with progress.stoppable():
            rc = sup.run()
    except KeyboardInterrupt as e:  # SIGTERM (a CI timeout) or Ctrl-C: the partial summary, then 1 or 130
        return progress.stop(sup, terminated=isinstance(e, progress.Stopped))
    if rc == exitcodes.INTERNAL:
        print("flashcheck check: pytest could not run the suite (see its errors above): a flashcheck "
              "or environment problem, not a verdict on the kernel", file=sys.stderr)
    s = sup.result
    if rc == exitcodes.FAILED and s.get("bad_fixtures") and not (s["failed"] or s["crashed"] or s["not_run"]):
        for reason in s["bad_fixtures"]:  # bad input, as `replay` says it: the kernel failed nothing
            print(f"flashcheck check: {reason}", file=sys.stderr)
        return exitcodes.USAGE
    if rc in (exitcodes.OK, exitcodes.NOTHING_CHECKED) and not (s.get("passed") or s.get("failed") or s.get("crashed")):
        print(f"flashcheck check: {_nothing_checked(s)}", file=sys.stderr)
        return exitcodes.NOTHING_CHECKED
    return rc


#: pytest options that list instead of testing.
LISTINGS = ("--collect-only", "--co", "--fixtures", "--fixtures-per-test", "--markers", "--setup-plan",
            "--version", "-V")


def _nothing_checked(s: dict) -> str:
    """The one line of a run in which no test checked the kernel (never green)."""
    if not s.get("total"):
        return "nothing was checked: no test selected (-k/-m deselected them all, or none was collected)"
    reasons = s.get("skip_reasons") or []
    common = max(set(reasons), key=reasons.count) if reasons else None
    why = f"; most common reason ({reasons.count(common)}x): {common}" if common else ""
    return (f"nothing was checked: all {s['total']} tests were skipped{why}. The kernel's declarations "
            "(or -k) leave no input to check")


def _python(*args: str) -> list[str]:
    """A child running this same flashcheck (a checkout not installed first on its path, as here)."""
    from flashcheck import IMPORT_ROOT

    path = os.environ.get("PYTHONPATH", "")
    if str(IMPORT_ROOT) not in path.split(os.pathsep) and not _installed():
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(IMPORT_ROOT), path) if p)
    return [sys.executable, *args]


def _installed() -> bool:
    """Whether a child finds this flashcheck without its IMPORT_ROOT on the path (site-packages, or
    an editable install's finder). A checkout's root must then stay off it: its kernels/, tests/,
    reports/ would shadow a user's packages of those names (issue 49)."""
    import importlib.machinery

    from flashcheck import IMPORT_ROOT

    path = [p for p in sys.path if p and Path(p).resolve() != IMPORT_ROOT.resolve()]
    for finder in sys.meta_path:
        try:
            spec = (importlib.machinery.PathFinder.find_spec("flashcheck", path)
                    if finder is importlib.machinery.PathFinder else finder.find_spec("flashcheck", None))
        except Exception:  # noqa: BLE001  (a third-party finder's quirk: ask the next)
            continue
        if spec is not None:
            return spec.origin is not None and Path(spec.origin).resolve().parent == Path(__file__).resolve().parents[1]
    return False


def _supervised(command: str, argv: Sequence[str], unit: str, **kw) -> int | None:
    """Run `flashcheck COMMAND ARGV` as a supervised child (None: this is that child, go on)."""
    from flashcheck.isolation import journal as isolation, supervisor

    if isolation.enabled():
        return None
    return supervisor.supervise(_python("-m", "flashcheck.cli.main", command, *argv), unit=unit, grace=0.0, **kw)


def _fixture_dir_problem(pytest_args: Sequence[str]) -> str | None:
    """Why the --fixture-dir among pytest's arguments cannot take fixtures (checked before the run,
    so a failure's own message is never replaced by an OSError of the fixture's write)."""
    if "--no-save-fixtures" in pytest_args:
        return None
    d = None
    for i, a in enumerate(pytest_args):
        if a == "--fixture-dir" and i + 1 < len(pytest_args):
            d = pytest_args[i + 1]
        elif a.startswith("--fixture-dir="):
            d = a.split("=", 1)[1]
    if d is None:
        return None
    from flashcheck.fixtures.store import dir_problem

    return dir_problem(Path(d))


def _replay(argv: Sequence[str]) -> int:
    p = exitcodes.ArgumentParser(
        prog="flashcheck replay", description="Re-check saved fixtures, bit for bit. A fixture is data: "
        "the kernel is --kernel, or the registered kernel the fixture names; a folder's fixtures of "
        "other kernels are skipped.", epilog=exitcodes.TABLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fixtures", nargs="+", type=Path, help="fixture files (or folders of them)")
    p.add_argument("--kernel", help="the kernel to check (FILE.py:FUNCTION, package.module:FUNCTION or a "
                                     "registered name); a fixture file named here is replayed against it "
                                     "even if it was recorded for another")
    p.add_argument("--family", choices=families.names(), help="the family of a plain --kernel function "
                                                      "(default: the fixtures')")
    p.add_argument("--timeout", type=exitcodes.seconds, default=DEFAULT_TASK_TIMEOUT, metavar="S",
                   help=f"seconds per fixture before its kernel counts as hung (default {DEFAULT_TASK_TIMEOUT:g})")
    ns = p.parse_args(argv)
    supervised = _supervised("replay", argv, "fixtures")
    if supervised is not None:
        return supervised
    from flashcheck.fixtures import store as fx
    from flashcheck.isolation import journal as isolation
    from flashcheck.properties import runner as properties
    from flashcheck.isolation.faults import GpuFault
    from flashcheck.targets.external import KernelLoadError, load_kernel
    from flashcheck.kernels import DEVICE
    from flashcheck.kernels.registry import PRODUCTION

    fx.configure(save=False)
    explicit: list[Path] = []
    found: list[Path] = []
    for f in ns.fixtures:
        if f.is_dir():
            found.extend(fx.fixture_paths(f))
        elif f.is_file():
            explicit.append(f)
        else:
            print(f"flashcheck replay: {f}: no such file or folder", file=sys.stderr)
            return exitcodes.USAGE
    specs = list(PRODUCTION)
    if ns.kernel:
        family = ns.family or _family_of(explicit + found)
        try:
            specs = [load_kernel(ns.kernel, family)]
        except KernelLoadError as e:
            print(f"flashcheck replay: {e}", file=sys.stderr)
            return exitcodes.USAGE
    plan = fx.plan_replays(explicit, specs, force=bool(ns.kernel)) + fx.plan_replays(found, specs)
    for r in plan:
        if r.status == "skip" and r.path in explicit:
            r.status, r.reason = "bad", f"{r.path}: {r.reason}; name its kernel with --kernel TARGET"
    # The supervisor's tasks: the fixtures to replay (one never planned is never "not run").
    isolation.record("plan", tasks=[str(r.path) for r in plan if r.status not in ("skip", "bad")])
    done = isolation.excluded()  # replayed (or crashed) in an earlier child of this run
    plan = [r for r in plan if str(r.path) not in done]
    counts = {"passed": 0, "failed": 0, "bad fixtures": 0, "not for this kernel": 0}
    for r in plan:
        if r.status == "skip":
            counts["not for this kernel"] += 1
            print(f"skip {r.path}: {r.reason}")
            continue
        if r.status == "bad":
            counts["bad fixtures"] += 1
            print(f"ERROR {r.reason}")
            continue
        try:
            case = fx.case_of(r.payload, DEVICE, r.path)
        except fx.FixtureError as e:
            counts["bad fixtures"] += 1
            print(f"ERROR {e}")
            isolation.end(str(r.path), isolation.BAD_FIXTURE)  # planned, and done: not "not run"
            continue
        what = f"{r.path} ({r.spec.name}, {r.payload['property']}{'; ' + r.reason if r.reason else ''})"
        with isolation.task(str(r.path), ns.timeout) as verdict:
            isolation.note_fixture(r.path)
            try:
                properties.check(r.spec, r.payload["property"], case)
            except GpuFault as e:  # the context is dead: with a parent, a fresh child replays the rest
                isolation.fault_exit(f"{r.path}: {e}")
                counts["failed"] += 1
                verdict.outcome = "failed"
                print(f"FAIL {what}\nGpuFault: {e}\n")
            except (Exception, SystemExit) as e:  # the property's verdict, whatever the kernel raised
                counts["failed"] += 1
                verdict.outcome = "failed"
                why = f"the kernel called sys.exit({e.code!r})" if isinstance(e, SystemExit) else \
                    f"{type(e).__name__}: {e}"
                print(f"FAIL {what}\n{why}\n")
            else:
                counts["passed"] += 1
                print(f"pass {what}")
    if plan or not done:  # (a child left nothing to replay: the parent's summary says it all)
        print(", ".join(f"{n} {k}" for k, n in counts.items() if n or k in ("passed", "failed")))
    if counts["failed"]:
        return exitcodes.FAILED
    if counts["bad fixtures"]:  # bad input, never blamed on the kernel
        return exitcodes.USAGE
    if not counts["passed"] and not done:  # (done: an earlier child of this run replayed or crashed)
        print("flashcheck replay: nothing was checked: " + (
            f"no fixture named is for {ns.kernel} (a folder's fixtures of other kernels are skipped; name a "
            "fixture file to replay it against this kernel)" if ns.kernel else
            "no fixture named is for a registered kernel (name its kernel with --kernel TARGET)"), file=sys.stderr)
        return exitcodes.NOTHING_CHECKED
    return exitcodes.OK


def _family_of(paths: list[Path]) -> str | None:
    """The family the fixtures record, when they agree (a plain --kernel function needs one)."""
    from flashcheck.fixtures.store import FixtureError, read_fixture

    families = set()
    for path in paths:
        try:
            families.add(read_fixture(path)["family"])
        except FixtureError:
            continue  # reported as a bad fixture when it is replayed
    return families.pop() if len(families) == 1 else None


def _kernels(argv: Sequence[str]) -> int:
    exitcodes.ArgumentParser(prog="flashcheck kernels", description="List the registered kernels.").parse_args(argv)
    from flashcheck.kernels.registry import PRODUCTION
    from flashcheck.plugin import describe_capabilities

    name_w, family_w = (max(len(getattr(s, k)) for s in PRODUCTION) for k in ("name", "family"))
    for s in PRODUCTION:
        print(f"{s.name:{name_w}s} {s.family:{family_w}s} {describe_capabilities(s)}")
    return 0


def _report(argv: Sequence[str]) -> int:
    """The stability report, supervised: a kernel call that crashes or hangs (`--timeout S` per
    call) is counted as that kernel's error on that input, and the report is made again without it.
    Options and the output folder are checked here first: a bad one costs no measuring."""
    from flashcheck.isolation import journal as isolation
    from flashcheck.reports.stability import cli as report

    argv = list(argv)
    if any(a in ("-h", "--help", "--kill-matrix") for a in argv):
        return report.main(argv)
    if not isolation.enabled():  # the parent (its child checks again, cheaply)
        problem = report.preflight(argv)
        if problem is not None:
            return problem
    supervised = _supervised("report", argv, "kernel calls", rerun_all=True, words=("returned", "raised"))
    if supervised is not None:
        return supervised
    return report.main(argv)


COMMANDS = {
    "check": _check,
    "replay": _replay,
    "kernels": _kernels,
    "report": _report,
}


def main(argv: Sequence[str] | None = None) -> int:
    """`flashcheck ARGS`: its exit status under `flashcheck.exitcodes` (an escaped exception: 3)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return exitcodes.OK if argv else exitcodes.USAGE
    if argv[0] in ("-V", "--version"):
        from flashcheck import __version__

        print(f"flashcheck {__version__}")
        return exitcodes.OK
    cmd = COMMANDS.get(argv[0])
    if cmd is None:
        print(f"flashcheck: unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return exitcodes.USAGE
    from flashcheck.plugin.devices import interpreter_off_without_gpu

    problem = interpreter_off_without_gpu()
    if problem:
        print(f"flashcheck {argv[0]}: {problem}", file=sys.stderr)
        return exitcodes.USAGE
    rc = exitcodes.guarded(f"flashcheck {argv[0]}", cmd, argv[1:])
    from flashcheck.isolation import journal as isolation

    isolation.finished()  # (a supervised child: its status is its own, not a hard exit's)
    return rc


if __name__ == "__main__":
    sys.exit(main())
