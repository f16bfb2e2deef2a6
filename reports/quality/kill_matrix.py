"""The kill matrix: the default (ci) suite run against every kernel of the known-bad zoo.

`python -m flashcheck.reports --kill-matrix` (or `python -m flashcheck.reports.quality.kill_matrix`) runs, for each zoo kernel,

    CI=true pytest flashcheck/suite --kernel flashcheck/suite/zoo/<family>_bugs.py:NAME --family <family> -x
           -p no:xdist -p no:cacheprovider --fixture-dir <out>/kill_fixtures/NAME -p flashcheck.plugin.killrun

in a subprocess (the suite exactly as CI runs it against an external kernel, stopping at the first
failure), and writes `kill_matrix.md` and `kill_matrix.json`: bug class x the test and property
that caught it, how many examples (distinct cases checked, over every test run so far), kernel
calls and seconds it took until the first failing check, and the shrunk counterexample (the
exact-bit fixture the harness saved, and the failure message).

The numbers are measured inside the subprocess by the engine's plugin, `flashcheck.plugin.killrun`.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flashcheck import HOME, SUITE, atomic
from flashcheck.plugin.killrun import run_pytest
from flashcheck.reports import RECORDS

DEFAULT_OUT = HOME / "reports" / "out"
#: The tracked kill matrix (committed): per zoo entry, whether the ci profile on the CPU catches it,
#: with which test and property, and after how many examples and seconds. tests/test_zoo.py holds
#: the suite to it; `python -m flashcheck.reports --kill-matrix --no-shrink --record` rewrites it.
MATRIX = RECORDS / "kill_matrix.json"

# ---- the runner ------------------------------------------------------------------------------------

def _fixture_summary(directory: Path) -> dict[str, Any] | None:
    paths = sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))
    if not paths:
        return None
    payload = json.loads(paths[0].read_text())
    tensors = {k: {"dtype": t["dtype"], "shape": t["shape"], "stride": t["stride"],
                   "storage_offset": t["storage_offset"], "values": t["values"][:12]}
               for k, t in payload["tensors"].items()}
    return {"file": str(paths[0]), "property": payload["property"], "label": payload["label"],
            "kwargs": payload["kwargs"], "tensors": tensors, "message": payload["message"]}


def run_zoo_kernel(z, *, out_dir: Path | None = None, first_only: bool = True, shrink: bool = True,
                   save_fixtures: bool = True, timeout: float = 900,
                   extra_args: list[str] | None = None, first: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the default ci suite against one zoo kernel (a `flashcheck.suite.zoo.ZooKernel`) in a subprocess.
    shrink=False skips Hypothesis's shrink phase (same examples, same first failure, faster).

    `first`: tests (node ids, or prefixes such as `FILE::test_name`) to run alone before the whole
    suite. Where they catch the kernel, the whole suite is not run: a kill by one of its tests is a
    kill by the suite. On a GPU this turns a run that compiles every production-kernel variant before
    its late catching test into one test. Hypothesis derandomizes per test, so a test run alone draws
    the examples it draws inside the suite. Where they do not catch it, the whole suite runs."""
    if first:
        r = _run_once(z, list(first), out_dir=out_dir, first_only=first_only, shrink=shrink,
                      save_fixtures=save_fixtures, timeout=timeout, extra_args=extra_args)
        if r["caught"]:
            return {**r, "ran": "first"}
    r = _run_once(z, [str(SUITE.relative_to(HOME))], out_dir=out_dir, first_only=first_only, shrink=shrink,
                  save_fixtures=save_fixtures, timeout=timeout, extra_args=extra_args)
    return {**r, "ran": "suite"}


def nodeid_of(short: str) -> str:
    """The pytest node id of a matrix's `test` cell (`test_softmax::test_x[...]`)."""
    file, _, rest = short.partition("::")
    return f"{SUITE.relative_to(HOME).as_posix()}/{file}.py::{rest}"


def _run_once(z, targets: list[str], *, out_dir: Path | None, first_only: bool, shrink: bool,
              save_fixtures: bool, timeout: float, extra_args: list[str] | None) -> dict[str, Any]:
    from flashcheck.suite.zoo import module_path

    tmp = Path(tempfile.mkdtemp(prefix=f"kill-{z.name}-"))
    fixtures = (out_dir / "kill_fixtures" / z.name) if out_dir else tmp / "fixtures"
    shutil.rmtree(fixtures, ignore_errors=True)
    fixtures.mkdir(parents=True, exist_ok=True)
    args = [*targets, f"--kernel={module_path(z)}:{z.name}", f"--family={z.family}",
            f"--fixture-dir={fixtures}",
            *(["-x"] if first_only else []), *([] if save_fixtures else ["--no-save-fixtures"]), *(extra_args or [])]
    run = run_pytest(args, shrink=shrink, timeout=timeout)
    rc, tail, wall, data = run["returncode"], run["tail"], run["wall_seconds"], run["data"]
    fixture = _fixture_summary(fixtures)
    shutil.rmtree(tmp, ignore_errors=True)
    first = data.get("first")
    failed = data.get("tests_failed") or []
    # Caught: the run failed (exit 1) and the first failure is a check the suite made
    # (a property's AssertionError, the interpreter's OutOfBoundsAccess, or a test's own assertion), not a
    # crash of the zoo kernel.
    caught = rc == 1 and bool(failed) and (first is None or first.get("check", first["exception"] == "AssertionError"))
    return {
        "name": z.name, "family": z.family, "bug_class": z.bug_class, "references": z.references,
        "expected_property": z.property_hint,
        "caught": caught, "returncode": rc, "wall_seconds": round(wall, 1),
        "caught_by_test": failed[0]["nodeid"] if failed else None,
        "caught_by_property": first["property"] if first else None,
        "seconds_to_first_failure": first["seconds"] if first else None,
        "examples_to_first_failure": first["examples"] if first else None,
        "kernel_calls_to_first_failure": first["kernel_calls"] if first else None,
        "tests_passed_before": first["tests_passed_before"] if first else data.get("tests_passed"),
        "first_message": first["message"] if first else (failed[0]["summary"] if failed else None),
        "shrunk_case": (data.get("last_fail") or {}).get("case"),
        "shrunk_message": (data.get("last_fail") or {}).get("message"),
        "fixture": fixture,
        "all_failures": failed,
        "output_tail": None if caught else tail,
    }


def run_all(names: list[str] | None = None, *, jobs: int = 2, out_dir: Path | None = None,
            first_only: bool = True, shrink: bool = True, extra_args: list[str] | None = None,
            log=print) -> list[dict[str, Any]]:
    from flashcheck.suite.zoo import zoo

    chosen = [z for z in zoo(runnable=True) if not names or z.name in names]

    def one(z):
        r = run_zoo_kernel(z, out_dir=out_dir, first_only=first_only, shrink=shrink, extra_args=extra_args)
        log(f"  {z.name:<24} {'caught' if r['caught'] else 'SURVIVED'} by {r['caught_by_test']} "
            f"[{r['caught_by_property']}] in {r['seconds_to_first_failure']}s ({r['wall_seconds']}s wall)")
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, chosen))


# ---- the tracked matrix ----------------------------------------------------------------------------

def matrix_row(r: dict[str, Any]) -> dict[str, Any]:
    """The tracked fields of a `run_zoo_kernel` result (no paths, no output)."""
    return {"family": r["family"], "bug_class": r["bug_class"], "caught": bool(r["caught"]),
            "test": _short_test(r["caught_by_test"]) if r["caught_by_test"] else None,
            "property": r["caught_by_property"], "examples": r["examples_to_first_failure"],
            "kernel_calls": r["kernel_calls_to_first_failure"], "seconds": r["seconds_to_first_failure"],
            "wall_seconds": r["wall_seconds"]}


def load_matrix(path: Path = MATRIX) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"environment": {}, "entries": {}}


def record_matrix(rows: list[dict[str, Any]], env: dict[str, str], path: Path = MATRIX) -> dict[str, Any]:
    """Write the rows run into the tracked matrix; entries not run keep their rows, GPU-only entries
    get their reason, entries no longer in the zoo are dropped."""
    from flashcheck.suite.zoo import zoo

    old = load_matrix(path)["entries"]
    new = {r["name"]: matrix_row(r) for r in rows}
    entries = {}
    for z in sorted(zoo(), key=lambda z: (z.family, z.name)):
        if z.name in new:
            entries[z.name] = new[z.name]
        elif z.gpu_only:
            entries[z.name] = {"family": z.family, "bug_class": z.bug_class, "caught": None, "gpu_only": z.gpu_only}
        elif z.name in old:
            entries[z.name] = old[z.name]
    out = {"about": "The ci profile (derandomized) on the CPU against each known-bad zoo kernel, -x, Hypothesis "
                    "shrinking skipped: caught, the first failing test and property, examples (distinct cases "
                    "checked) and kernel calls until the first failing check, seconds from the session's start "
                    "to it (CPU-load dependent), the subprocess's wall seconds. caught null: GPU only.",
           "environment": {**env, "profile": "ci", "shrink": False}, "entries": entries}
    atomic.write_text(path, json.dumps(out, indent=1, sort_keys=False) + "\n")
    return out


# ---- the report -----------------------------------------------------------------------------------

def _short_test(nodeid: str | None) -> str:
    if not nodeid:
        return "-"
    file, _, rest = nodeid.partition("::")
    return f"{Path(file).stem}::{rest}"


def _case_cell(r: dict[str, Any]) -> str:
    fx = r.get("fixture")
    if fx:
        parts = []
        for k, t in fx["tensors"].items():
            vals = ", ".join(str(v) for v in t["values"][:6])
            parts.append(f"{k} {tuple(t['shape'])} {t['dtype']} stride={tuple(t['stride'])} "
                         f"off={t['storage_offset']}: [{vals}{', ...' if len(t['values']) > 6 else ''}]")
        kw = {k: v for k, v in fx["kwargs"].items() if v not in (None, False)}
        return f"`{fx['label']}` " + "; ".join(parts) + (f"; {kw}" if kw else "")
    return (r.get("shrunk_case") or "-").replace("|", "/")


def to_markdown(rows: list[dict[str, Any]], env: dict[str, str]) -> str:
    caught = sum(r["caught"] for r in rows)
    out = ["# flashcheck kill matrix", "",
           f"{env['date']} on {env['device']}; torch {env['torch']}, triton {env['triton']}. The default suite "
           "(`ci` profile: derandomized, 12 examples per Hypothesis test) run against each known-bad zoo kernel "
           "(`flashcheck/suite/zoo/`) with `-x`. **Caught by**: the first failing test and the property that failed; "
           "**examples**: distinct cases checked (over every test run so far) up to and including the first "
           "failing one; **calls**: kernel calls until then; **s**: seconds from the start of the session to the "
           "first failing check; **shrunk counterexample**: the case Hypothesis shrank to (the exact-bit fixture).",
           "", f"**{caught} of {len(rows)} caught.**", "",
           "| zoo kernel | bug class | caught by (test) | property (expected) | examples | calls | s | shrunk counterexample |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = "" if r["caught"] else " **SURVIVED**"
        out.append(f"| {r['family']}/{r['name']}{status} | {r['bug_class']} | {_short_test(r['caught_by_test'])} | "
                   f"{r['caught_by_property'] or '-'} ({r.get('expected_property') or '-'}) | {r['examples_to_first_failure'] or '-'} | "
                   f"{r['kernel_calls_to_first_failure'] or '-'} | {r['seconds_to_first_failure'] or '-'} | "
                   f"{_case_cell(r)} |")
    out += ["", "## Failure messages (after shrinking)", ""]
    for r in rows:
        msg = (r.get("shrunk_message") or r.get("first_message") or "-").strip()
        out += [f"### {r['family']}/{r['name']}", "", f"{r['bug_class']}. {r['references']}", "", "```",
                msg[:1500], "```", ""]
    return "\n".join(out)


def _environment() -> dict[str, str]:
    import datetime as dt

    from flashcheck.kernels import INTERPRET  # first: it switches the interpreter on before triton loads

    import torch
    import triton

    return {"date": dt.date.today().isoformat(), "device": "Triton interpreter (CPU)" if INTERPRET
            else torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}


def main(argv: list[str] | None = None, *, out: Path | None = None) -> int:
    from flashcheck.exitcodes import ArgumentParser

    p = ArgumentParser(prog="python -m flashcheck.reports --kill-matrix", description=__doc__.splitlines()[0])
    p.add_argument("--zoo", action="append", help="only this zoo kernel (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="zoo kernels run in parallel (default 2)")
    p.add_argument("--all-failures", action="store_true",
                   help="run every test instead of stopping at the first failure (slow)")
    p.add_argument("--no-shrink", action="store_true", help="skip Hypothesis's shrink phase (faster)")
    p.add_argument("--pytest-args", default="", help="extra arguments for every pytest run (one string)")
    p.add_argument("--out", type=Path, default=out or DEFAULT_OUT)
    p.add_argument("--record", action="store_true",
                   help=f"also write the rows into the tracked matrix {MATRIX.name} (with --no-shrink, as tests/test_zoo.py runs)")
    args = p.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():  # before hours of runs, not after
        p.error(f"--out {args.out}: is a file, not a folder")
    env = _environment()
    if args.record and (not args.no_shrink or args.all_failures or args.pytest_args
                        or not env["device"].startswith("Triton interpreter")):
        print("--record keeps the CPU's ci matrix: the runs tests/test_zoo.py makes (--no-shrink, without "
              "--all-failures or --pytest-args) under the interpreter", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"flashcheck kill matrix on {env['device']}")
    t0 = time.perf_counter()
    rows = run_all(args.zoo, jobs=args.jobs, out_dir=args.out, first_only=not args.all_failures,
                   shrink=not args.no_shrink, extra_args=args.pytest_args.split() or None)
    # Each file whole or not at all (the folder also holds kill_fixtures/, so it is not swapped).
    atomic.write_text(args.out / "kill_matrix.md", to_markdown(rows, env))
    atomic.write_text(args.out / "kill_matrix.json", json.dumps({"environment": env, "rows": rows}, indent=1))
    if args.record:
        record_matrix(rows, env)
        print(f"recorded {len(rows)} entries in {MATRIX}")
    survivors = [r["name"] for r in rows if not r["caught"]]
    print(f"wrote {args.out / 'kill_matrix.md'}, kill_matrix.json in {time.perf_counter() - t0:.0f}s: "
          f"{len(rows) - len(survivors)} of {len(rows)} caught")
    if survivors:
        print(f"SURVIVED (a strategy or property is missing): {survivors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
