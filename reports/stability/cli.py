"""`flashcheck report` / `python -m flashcheck.reports`: the stability report of any kernel.

    flashcheck report [TARGET ...] [--family F] [--compare A B] [--out DIR] [--examples N]
                      [--budget SECONDS] [--timeout S] [--no-fail] [--no-plots] [--no-baselines]

TARGET is `path/to/file.py:function`, `package.module:function` or a registered kernel's name
(none: every registered kernel). Each kernel, the family's baselines (torch.softmax; SDPA's
backends) run on the same inputs drawn deterministically from every adversarial class; their
outputs are compared with the correctly rounded oracle. The report opens with each kernel's
PASS/FAIL verdict and writes stability.md, stability.json, stability.html (self-contained) and the
PNG plots to DIR (default ./flashcheck-report), replacing the folder whole (reports/stability/output.py: new,
empty or an earlier report; a failed run leaves the earlier report as it was). A kernel failing
exits 1 (--no-fail: 0); the full table follows.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from flashcheck import exitcodes, families

from . import output
from .document import Block, Bullets, Heading, Image, Para, to_html, to_markdown
from .tables import _biased, _g, _pct, _signed, class_table, compare_table

PROG = "flashcheck report"
DEFAULT_OUT = "flashcheck-report"  # relative to the working directory; the GPU workflow uploads it
MAX_EXAMPLES = 10_000  # per dtype and class: 36 classes' worth is 360,000 inputs, drawn up front


def anchor(kernel: str) -> str:
    return "kernel-" + "".join(ch if ch.isalnum() else "-" for ch in kernel)


# ---- verdicts ------------------------------------------------------------------------------------

def _cell_name(r: dict[str, Any]) -> str:
    return f"{r['dtype']} {r['strategy']}"


def verdict(kernel: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """PASS/FAIL of one kernel over all its rows, with its worst finding in one line."""
    mine = [r for r in rows if r["kernel"] == kernel and not r["baseline"]]
    over = sum(r["violations"] for r in mine)
    mism = sum(r["mismatch"] for r in mine)
    raised = [r for r in mine if r["errors"]]
    outputs = sum(r["outputs"] for r in mine)
    if not outputs and not raised:
        return {"kernel": kernel, "status": "NO DATA", "finding": "no input it declares it takes was drawn"}
    worst = max(mine, key=lambda r: (bool(r["errors"]), r["mismatch"], r["max_bound_ratio"]))
    hung, crashed = (sum(r.get(k, 0) for r in mine) for k in ("hung", "crashed"))  # (.get: older JSON)
    if hung or crashed:
        r = next(r for r in mine if r.get("hung") or r.get("crashed"))
        not_run = sum(r.get("not_run", 0) for r in mine)
        what = "hung" if not crashed else ("crashed" if not hung else "crashed or hung")
        finding = (f"{what} on {hung + crashed} input(s)" + (f"; the rest not run ({not_run} inputs)" if not_run else "")
                   + f"; first {_cell_name(r)}: {r['errors'][0]}")
        status = "FAIL"
    elif raised:
        r = raised[0]
        finding = f"raised on {len(raised)} class(es), first {_cell_name(r)}: {r['errors'][0]}"
        status = "FAIL"
    elif over:
        status = "FAIL"
        what = (f"{over} outputs over their bound ({mism} NaN/inf mismatches)" if mism
                else f"{over} outputs over their bound")
        if worst["mismatch"]:
            finding = f"{what}; worst: {_cell_name(worst)}, NaN/inf where the oracle differs ({worst['mismatch']})"
        else:
            finding = (f"{what}; worst: {_cell_name(worst)} at {_g(worst['max_bound_ratio'])}x its bound "
                       f"({_g(worst['max_ulp'])} ULP)")
    else:
        status = "PASS"
        # At a 1-ULP bound, 1x is the ordinary faithful rounding: name the closest call among
        # the wider bounds, and let the 16-bit shares below speak for the rest.
        wide = [r for r in mine if r["max_bound_ratio_wide"] is not None]
        if wide:
            w = max(wide, key=lambda r: r["max_bound_ratio_wide"])
            finding = f"worst {_cell_name(w)} at {_g(w['max_bound_ratio_wide'])}x its bound (bounds over 1 ULP)"
        else:
            finding = f"worst {_cell_name(worst)} at {_g(worst['max_bound_ratio'])}x its bound"
    sixteen = [r for r in mine if r["dtype"] in ("fp16", "bf16") and r["outputs"]]
    if sixteen:
        n = sum(r["outputs"] for r in sixteen)
        cr = sum(r["exact_share"] * r["outputs"] for r in sixteen) / n
        one = sum(r["one_ulp_share"] * r["outputs"] for r in sixteen) / n
        finding += f"; 16-bit outputs {_pct(cr)} correctly rounded, {_pct(one)} 1 ULP off"
    bias = [r for r in mine if _biased(r["signed_ulp"])]
    if not outputs:  # nothing measured: no bias to speak of
        pass
    elif bias:
        b = max(bias, key=lambda r: abs(r["signed_ulp"]["mean"]))
        finding += f"; largest bias {_signed(b['signed_ulp'])} in {_cell_name(b)} ({len(bias)} cells biased)"
    else:
        finding += "; no signed bias detected"
    return {"kernel": kernel, "status": status, "finding": finding}


def failed(verdicts: list[dict[str, Any]]) -> bool:
    return any(v["status"] != "PASS" for v in verdicts)


# ---- the document --------------------------------------------------------------------------------

def build(rows: list[dict[str, Any]], env: dict[str, Any], images: dict[str, list[Path]],
          descriptions: dict[str, str], compare: tuple[str, str] | None = None) -> tuple[list[Block], list[dict]]:
    from .run import family_module

    kernels = list(dict.fromkeys(r["kernel"] for r in rows if not r["baseline"]))
    verdicts = [verdict(k, rows) for k in kernels]
    blocks: list[Block] = [Heading(1, "flashcheck stability report"), Heading(2, "Verdict", "verdict")]
    blocks.append(Bullets([f"**{v['status']}** [{v['kernel']}](#{anchor(v['kernel'])}): {v['finding']}"
                           for v in verdicts]))
    n_fail = sum(v["status"] != "PASS" for v in verdicts)
    blocks.append(Para(f"{len(verdicts) - n_fail} of {len(verdicts)} kernels pass. " + (
        "Exit status 1: at least one output exceeds its derived bound (or a kernel raised, or had no input)."
        if n_fail else "Exit status 0.")))
    budget = (f" The time budget ended the run after {env['inputs_done']} of {env['inputs_total']} inputs."
              if env.get("budget_hit") else "")
    blocks.append(Para(
        f"{env['date']} on {env['device']}; torch {env['torch']}, triton {env['triton']}; {env['seconds']:.0f} s. "
        f"Up to {env['examples']} inputs per dtype and adversarial class, drawn deterministically from the class's "
        f"strategy; every kernel and baseline gets the same inputs.{budget} Errors are measured against the "
        "correctly rounded oracle: *correctly rounded* and *1 ULP off* are shares of all outputs; *over bound* "
        "counts outputs past their derived bound (NUMERICS.md s.3), NaN/inf mismatches included (they are "
        "failures everywhere); *flushed* counts fp32 subnormal results flushed to zero (allowed). The signed "
        "error (ULPs from the correctly rounded value; relative to the exact value where it is a normal number) "
        "has a 95% CI over rows: a CI clear of 0 (highlighted) is a rounding bias. Attention errors (max err, signed) are in "
        "units of the bound's scale, the derived bound with worst-case blocking, the same for every kernel and "
        "baseline (raw ULPs near 0 only measure cancellation); the relative one is relative to sum_j p_j |v_j|. Baselines are measured on the same "
        "inputs and never judged; *max err / baseline's* below 1 means more accurate than it."))
    for fam in dict.fromkeys(r["family"] for r in rows):
        for p in images.get(fam, []):
            if "heatmap" in p.name:
                blocks.append(Image(p, f"{fam}: err/bound heat map"))
    if compare:
        a, b = compare
        fam = next(r["family"] for r in rows if r["kernel"] == a)
        blocks += [Heading(2, f"{a} vs {b}", "compare"),
                   Para(f"Both kernels on the same inputs; the last column is {b}'s max error over {a}'s."),
                   compare_table(a, b, rows, family_module(fam).UNITS)]
    for k in kernels + list(dict.fromkeys(r["kernel"] for r in rows if r["baseline"])):
        krows = [r for r in rows if r["kernel"] == k]
        fam = krows[0]["family"]
        base = krows[0]["baseline"]
        v = next((v for v in verdicts if v["kernel"] == k), None)
        title = f"{k} ({fam}" + (", baseline)" if base else f"): {v['status']}")
        blocks.append(Heading(2, title, anchor(k)))
        if descriptions.get(k):
            blocks.append(Para(descriptions[k]))
        if v:
            blocks.append(Para(v["finding"]))
        blocks.append(class_table(k, rows, family_module(fam).UNITS))
    for fam in dict.fromkeys(r["family"] for r in rows):
        rest = [p for p in images.get(fam, []) if "heatmap" not in p.name]
        if rest:
            blocks.append(Heading(2, f"{fam}: plots", f"plots-{fam}"))
            blocks += [Image(p, p.stem) for p in rest]
    return blocks, verdicts


def make_plots(rows: list[dict[str, Any]], out: Path) -> dict[str, list[Path]]:
    from . import plots
    from .run import family_module

    written: dict[str, list[Path]] = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        mod = family_module(fam)
        got = [plots.heatmap(rows, fam, out / f"stability_{fam}_heatmap.png"),
               plots.signed_errors(rows, fam, out / f"stability_{fam}_signed.png", mod.UNITS)]
        for feat, label in mod.FEATURES.items():
            got.append(plots.profiles(rows, fam, feat, label, mod.UNITS, out / f"stability_{fam}_vs_{feat}.png"))
        written[fam] = [p for p in got if p is not None]
    return written


# ---- command line --------------------------------------------------------------------------------

def _environment() -> dict[str, Any]:
    import torch
    import triton

    from flashcheck.kernels import INTERPRET

    return {"date": dt.date.today().isoformat(),
            "device": "Triton interpreter (CPU)" if INTERPRET else torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def parser() -> argparse.ArgumentParser:
    from flashcheck.isolation.journal import DEFAULT_TASK_TIMEOUT

    p = exitcodes.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join([*__doc__.split("\n\n")[2:], exitcodes.TABLE]))
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="FILE.py:FUNCTION, package.module:FUNCTION or a registered kernel (default: all registered)")
    p.add_argument("--kernel", action="append", default=[], metavar="TARGET", help="same as a TARGET (repeatable)")
    p.add_argument("--family", choices=[n for n in families.names() if families.get(n).report],
                   help="the family of FILE.py/module targets; with no target, only this family's kernels "
                        "(the families with a stability report)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two kernels side by side on the same inputs")
    p.add_argument("--out", type=Path, default=None, help="output folder (default ./flashcheck-report)")
    p.add_argument("--examples", type=int, default=None,
                   help="inputs per dtype and class (default $FLASHCHECK_REPORT_EXAMPLES, else 2 on CPU, 20 on GPU)")
    p.add_argument("--dtypes", type=_names, default=None,
                   metavar="LIST", help="only these output dtypes, e.g. fp16,bf16 (default: all a kernel takes)")
    p.add_argument("--classes", type=_names, default=None,
                   metavar="LIST", help="only these adversarial classes (comma-separated names)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (every class gets at least one input, and the same count +-1; "
                        "default $FLASHCHECK_REPORT_BUDGET, else none)")
    p.add_argument("--timeout", type=exitcodes.seconds, default=None, metavar="S",
                   help="seconds one kernel call may take before it counts as hung: that kernel's error on that "
                        f"input, and the report goes on (default {DEFAULT_TASK_TIMEOUT:g})")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when a kernel fails")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-baselines", action="store_true", help="skip torch.softmax and SDPA")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--kill-matrix", action="store_true",
                   help="instead: run the ci suite against every known-bad zoo kernel (reports/quality/kill_matrix.py; "
                        "its own options follow, e.g. --kill-matrix --zoo NAME --jobs 2)")
    return p


def _names(value: str) -> list[str]:
    """A comma-separated list of names: an empty one (`--classes ""`) once meant every class."""
    names = [x.strip() for x in value.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{value!r}: expected one or more comma-separated names")
    return names


def _error(msg: str) -> int:
    print(f"{PROG}: {msg}", file=sys.stderr)
    return exitcodes.USAGE


def _options(argv: Sequence[str]) -> argparse.Namespace | int:
    """The parsed options, checked (nothing loaded, nothing measured), or the exit status of a
    usage error already reported in one line."""
    args = parser().parse_args(argv)
    # Defaults a CI job can shorten without changing the command line (the README's commands run
    # as written in tests/test_report.py): an explicit option wins.
    given = {"examples": "--examples ", "budget": "--budget "}  # where a bad value came from
    for name, env in (("examples", "FLASHCHECK_REPORT_EXAMPLES"), ("budget", "FLASHCHECK_REPORT_BUDGET")):
        raw = os.environ.get(env, "").strip()
        if getattr(args, name) is None and raw:
            given[name] = f"{env}="
            try:
                setattr(args, name, (int if name == "examples" else float)(raw))
            except ValueError:
                return _error(f"{env}={raw!r}: expected a positive {'integer' if name == 'examples' else 'number'}")
    if args.examples is not None and not 1 <= args.examples <= MAX_EXAMPLES:
        return _error(f"{given['examples']}{args.examples}: expected a whole number from 1 to {MAX_EXAMPLES} "
                      "(every input is drawn before the first is measured; --budget bounds the time)")
    if args.budget is not None and not args.budget > 0:
        return _error(f"{given['budget']}{args.budget}: expected a positive number of seconds")
    try:
        args.out = (args.out if args.out is not None else Path.cwd() / DEFAULT_OUT).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before Python 3.13), a vanished cwd
        return _error(f"--out {args.out}: cannot be resolved ({getattr(e, 'strerror', None) or e})")
    problem = output.problem(args.out)
    if problem:
        return _error(problem)
    return args


def preflight(argv: Sequence[str]) -> int | None:
    """Check the options and the output folder before a supervised report starts measuring: the
    exit status of the one-line error, or None when they are fine."""
    try:
        args = _options(argv)
    except SystemExit as e:  # argparse said it already
        return int(e.code or 0)
    return args if isinstance(args, int) else None


def main(argv: Sequence[str] | None = None) -> int:
    """The report in this process (`flashcheck report` supervises it); exit status per exitcodes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--kill-matrix" in argv:
        from ..quality import kill_matrix

        return int(kill_matrix.main([a for a in argv if a != "--kill-matrix"]) or 0)
    args = _options(argv)
    if isinstance(args, int):
        return args
    if args.timeout is not None:  # for reports/stability/run.py's kernel calls (the supervisor kills past it)
        from flashcheck.isolation.journal import TIMEOUT_ENV

        os.environ[TIMEOUT_ENV] = str(args.timeout)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # The interpreter evaluates -inf - -inf and friends in NumPy on purpose (NUMERICS.md s. 2):
    # its RuntimeWarnings are expected noise here, not findings.
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from flashcheck.targets.external import KernelLoadError, load_kernel
    from flashcheck.kernels import INTERPRET
    from flashcheck.kernels.registry import REGISTRY

    targets = list(args.targets) + list(args.kernel) + list(args.compare or [])
    try:
        specs = [load_kernel(t, args.family) for t in targets]
    except KernelLoadError as e:
        return _error(str(e))
    if not targets:  # every registered kernel of a family that has a report (its record's `report`)
        specs = [s for s in REGISTRY if (args.family is None or s.family == args.family) and families.get(s.family).report]
    specs = list({s.name: s for s in specs}.values())
    without = sorted({s.family for s in specs if not families.get(s.family).report})
    if without:
        return _error(f"no stability report for the {', '.join(without)} family (its kernels are checked by "
                      f"`flashcheck check`)")
    if args.compare:
        a, b = (load_kernel(t, args.family) for t in args.compare)
        if a.family != b.family:
            return _error(f"--compare {a.name} {b.name}: a {a.family} and a {b.family} kernel")
        if a.name == b.name:
            return _error(f"--compare {a.name} {b.name}: the same kernel twice")
    if not specs:
        return _error("no kernel to report on")
    from flashcheck.oracles.formats import FLOAT_NAMES

    bad = [d for d in args.dtypes or [] if d not in FLOAT_NAMES]
    if bad:
        return _error(f"--dtypes: unknown dtype {bad[0]!r} ({', '.join(FLOAT_NAMES)})")
    from .run import family_module

    known = {c for fam in {s.family for s in specs} for c in family_module(fam).class_names()}
    bad = [c for c in args.classes or [] if c not in known]
    if bad:
        return _error(f"--classes: unknown class {bad[0]!r} (known: {', '.join(sorted(known))})")
    out = args.out
    examples = args.examples or (2 if INTERPRET else 20)
    env = _environment()
    from .run import collect

    if not args.quiet:
        print(f"{PROG}: {', '.join(s.name for s in specs)} on {env['device']}, up to {examples} inputs per class",
              file=sys.stderr)
    result = collect(specs, examples=examples, baselines=not args.no_baselines, budget=args.budget,
                     progress=not args.quiet, log=lambda m: print(m, file=sys.stderr), dtypes=args.dtypes,
                     classes=args.classes)
    rows = result.rows
    if not any(r["outputs"] or r["errors"] for r in rows if not r["baseline"]):
        print(f"{PROG}: nothing was checked: no kernel took any drawn input; {out} left as it was", file=sys.stderr)
        return exitcodes.NOTHING_CHECKED
    per_kernel: dict[str, float] = {}
    for r in rows:
        per_kernel[r["kernel"]] = per_kernel.get(r["kernel"], 0.0) + r["seconds"]
    env.update(examples=examples, seconds=result.seconds, oracle_seconds=round(result.oracle_seconds, 1),
               kernel_seconds={k: round(v, 1) for k, v in per_kernel.items()}, inputs_done=result.inputs_done,
               inputs_total=result.inputs_total, budget_hit=result.budget_hit)
    compare = (load_kernel(args.compare[0], args.family).name, load_kernel(args.compare[1], args.family).name) \
        if args.compare else None
    with output.staged(out) as new:  # the earlier report stays whole until every file is written
        images = {} if args.no_plots else make_plots(rows, new)
        blocks, verdicts = build(rows, env, images, {s.name: s.description for s in specs}, compare)
        (new / "stability.md").write_text(to_markdown(blocks))
        (new / "stability.html").write_text(to_html(blocks, "flashcheck stability report"))
        (new / "stability.json").write_text(json.dumps(_jsonable({"environment": env, "verdicts": verdicts,
                                                                  "rows": rows}), indent=1))
    for v in verdicts:
        print(f"{v['status']:7s} {v['kernel']}: {v['finding']}")
    print("seconds: oracle " + f"{result.oracle_seconds:.0f}, "
          + ", ".join(f"{k} {v:.0f}" for k, v in per_kernel.items()), file=sys.stderr)
    print(f"wrote {out}/stability.{{md,html,json}}" + "".join(f", {p.name}" for ps in images.values() for p in ps)
          + f" in {result.seconds:.0f}s")
    if failed(verdicts):
        print("at least one kernel fails: see the Verdict section" + (" (--no-fail: exit 0)" if args.no_fail else ""),
              file=sys.stderr)
        return exitcodes.OK if args.no_fail else exitcodes.FAILED
    return exitcodes.OK


__all__ = ["main", "verdict", "build", "parser", "anchor"]
