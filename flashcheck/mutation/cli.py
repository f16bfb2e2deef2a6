"""`python -m flashcheck.mutants`: select mutants, run them, write the report."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from flashcheck import HOME, mutation
from flashcheck.mutation import runner, sanitizer
from flashcheck.mutation import between_launches
from flashcheck.mutation.generate import ALL_TARGETS, all_mutants, select
from flashcheck.mutation.operators import GPU_ONLY_OPERATORS, OPERATORS
from flashcheck.mutation.report import TRIAGE_FILE, to_markdown
from flashcheck.mutation.runner import decided, load_runs, load_store, log_run, run, runs_file

DEFAULT_STORE = HOME / "reports" / "records" / "mutants_store.json"  # tracked: runs on any machine and session add up
DEFAULT_REPORT = HOME / "reports" / "records" / "mutants.md"
ON = "Triton interpreter (CPU)"


def _interpreter() -> bool:
    from flashcheck.kernels import INTERPRET

    return INTERPRET


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.mutants", description=mutation.__doc__.splitlines()[0])
    p.add_argument("--module", action="append", choices=sorted({t.module for t in ALL_TARGETS}),
                   help="only this kernels/ module (repeatable)")
    p.add_argument("--function", action="append", help="only mutants of this @triton.jit function (repeatable)")
    p.add_argument("--operator", action="append", choices=[*OPERATORS, between_launches.OPERATOR],
                   help="only this operator (repeatable)")
    p.add_argument("--gpu-only-operators", action="store_true",
                   help=f"also run {', '.join(GPU_ONLY_OPERATORS)} mutants (only a GPU can kill them)")
    p.add_argument("--sample", type=int, default=None, help="a deterministic random sample of this many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-j", "--jobs", type=int, default=1, help="mutants run in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per mutant (default 600)")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE, help="JSON results, accumulated over runs")
    p.add_argument("--resume", action="store_true", help="skip mutants the store has decided (errors and timeouts run again)")
    p.add_argument("--probe-first", action="store_true",
                   help="probe before the suite; skip the suite for mutants bit-identical on every probe")
    p.add_argument("--spec", action="append", help="run only this kernel's tests (repeatable; of the kernels "
                   "a mutant changes)")
    p.add_argument("--id", action="append", help="only this mutant (repeatable)")
    p.add_argument("--only-tests", metavar="EXPR", default="",
                   help="a pytest -k expression: only these tests run (confirms a kill faster; a mutant "
                        "passing them is recorded as undecided, not a survivor)")
    p.add_argument("--first-test-from", type=Path, metavar="STORE",
                   help="run first, alone, the test that killed the same mutant in STORE (e.g. the "
                        "interpreter's store, for a compiled run: one test compiles a few binaries, a "
                        "suite hundreds); the whole suite runs only where that test does not catch it")
    p.add_argument("--first-test-only", action="store_true",
                   help="with --first-test-from: a mutant its first test does not catch is recorded as "
                        "undecided instead of running the whole suite")
    p.add_argument("--first-spec-only", action="store_true",
                   help="a shared helper's mutant runs only its first kernel's tests (faster; says so in the report)")
    p.add_argument("--sanitizer", metavar="CASES", default="",
                   help="instead of the suite, run the memcheck sweep's cases whose names contain CASES "
                        "(reports/quality/memcheck_sweep.py --only) against each mutant under compute-sanitizer, every "
                        "tensor its own allocation: kills out-of-bounds accesses no value shows (GPU only; a "
                        "clean run leaves the mutant undecided)")
    p.add_argument("--merge", nargs="+", metavar="FILE",
                   help="BASE COPY...: fold into --store the stores of runs made elsewhere from copies of BASE "
                        "(a device call's parallel groups): only the entries a run changed, never a decided "
                        "verdict replaced by an undecided one; their baselines and run logs too; then exit")
    p.add_argument("--list", action="store_true", help="list the selected mutants and exit")
    p.add_argument("--diff", metavar="ID", help="print one mutant's diff and exit")
    p.add_argument("--report", type=Path, nargs="?", const=DEFAULT_REPORT, default=None,
                   help=f"write the markdown report (default {DEFAULT_REPORT.relative_to(HOME)}) from the store")
    p.add_argument("--no-run", action="store_true", help="only write the report from the store")
    p.add_argument("--compiled", action="store_true",
                   help="the store's mutants ran compiled on a GPU (the default on a machine with one): "
                        "GPU-only mutants are selected, interpreter-only ones are not")
    p.add_argument("--on", default=ON,
                   help="where the store's mutants ran, for the report's heading (e.g. \"NVIDIA H200, compiled\")")
    args = p.parse_args(argv)
    if args.merge:
        return _merge(p, args.store, [Path(f) for f in args.merge])
    runner.FIRST_SPEC_ONLY = args.first_spec_only
    runner.ONLY_SPECS = tuple(args.spec or ())
    runner.ONLY_TESTS = args.only_tests
    if args.first_test_only and not args.first_test_from:
        p.error("--first-test-only needs --first-test-from")
    if args.first_test_from:
        if not args.first_test_from.is_file():
            p.error(f"--first-test-from: no such store {args.first_test_from}")
        try:
            runner.FIRST_TESTS = runner.first_tests_from(load_store(args.first_test_from))
        except (ValueError, AttributeError, TypeError) as exc:
            p.error(f"--first-test-from: {args.first_test_from} is not a mutation store ({exc})")
        runner.FIRST_TEST_ONLY = args.first_test_only
    if args.sanitizer:
        if _interpreter() or not sanitizer.available():
            p.error("--sanitizer needs a GPU and compute-sanitizer on PATH")
        sanitizer.CASES = args.sanitizer
    compiled = args.compiled or not _interpreter()
    every = all_mutants(modules=args.module)
    if args.id:
        every_ids = {m.id for m in every}
        missing = [i for i in args.id if i not in every_ids]
        if missing:
            p.error(f"no mutant {missing}")
    chosen = select([m for m in every if not args.id or m.id in args.id], functions=args.function, operators=args.operator, sample=args.sample, seed=args.seed,
                    gpu_only=args.gpu_only_operators or compiled, interpreted=not compiled)
    if args.diff:
        m = next((m for m in every if m.id == args.diff), None)
        if m is None:
            print(f"no mutant {args.diff!r}", file=sys.stderr)
            return 2
        print(m.description)
        print(m.diff())
        return 0
    if args.list:
        for m in chosen:
            print(f"{m.id:<60} {m.description}")
        print(f"{len(chosen)} mutants")
        return 0
    results = load_store(args.store)
    if not args.no_run:
        t0 = time.perf_counter()
        todo = sum(not (args.resume and decided(results, m.key)) for m in chosen)
        results = run(chosen, jobs=args.jobs, timeout=args.timeout, store=args.store, resume=args.resume,
                      probe_first=args.probe_first)
        wall = time.perf_counter() - t0
        log_run(args.store, "python -m flashcheck.mutants " + " ".join(argv if argv is not None else sys.argv[1:]),
                len(chosen), todo, wall)
        print(f"ran in {wall:.0f}s wall")
    if args.report:
        triage = json.loads(TRIAGE_FILE.read_text()) if TRIAGE_FILE.exists() else {}
        runs = load_runs(args.store)
        args.report.write_text(to_markdown(every, results, triage, runs, args.on, compiled=compiled,
                                           command=_report_command(args, compiled), store=_rel(args.store)))
        print(f"wrote {args.report}")
    rs = [results[m.key] for m in chosen if m.key in results]
    return 1 if any(r["status"] == "survived" for r in rs) else 0


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(HOME)) if path.is_relative_to(HOME) else str(path)


def _report_command(args: argparse.Namespace, compiled: bool) -> str:
    """The one command that regenerates the report: every mutant not yet decided runs, then the report."""
    cmd = "python -m flashcheck.mutants --probe-first --resume"
    if args.store.resolve() != DEFAULT_STORE:
        cmd += f" --store {_rel(args.store)}"
    if compiled:
        cmd += " --compiled"
    cmd += " --report" + ("" if args.report.resolve() == DEFAULT_REPORT else f" {_rel(args.report)}")
    if args.on != ON:
        cmd += f" --on {shlex.quote(args.on)}"
    return cmd


def _merge(p: argparse.ArgumentParser, store_path: Path, files: list[Path]) -> int:
    from flashcheck import atomic

    if len(files) < 2:
        p.error("--merge needs BASE and at least one COPY")
    try:
        base, *copies = (load_store(f) if f.is_file() else p.error(f"--merge: no such store {f}") for f in files)
        store = load_store(store_path)
    except ValueError as exc:
        p.error(f"--merge: not a mutation store ({exc})")
    n = runner.merge_stores(store, base, copies)
    baselines = runner.baselines_file(store_path)
    saved = load_store(baselines)
    runs = load_runs(store_path)
    for f in files[1:]:
        saved.update(load_store(runner.baselines_file(f)))
        runs += [r for r in load_runs(f) if r not in runs]
    atomic.write_text(store_path, json.dumps(store, indent=1))
    atomic.write_text(baselines, json.dumps(saved, indent=1))
    atomic.write_text(runs_file(store_path), json.dumps(runs, indent=1))
    print(f"merged {n} entries from {len(copies)} stores into {store_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
