"""The mutation score as Markdown (reports/records/mutants.md) from the results store and the hand triage."""
from __future__ import annotations

import datetime as _dt
import subprocess
from typing import Any

from flashcheck import HOME
from flashcheck.mutation.generate import INTERPRETER_FLAGS, Mutant
from flashcheck.mutation.operators import GPU_ONLY_OPERATORS, OPERATORS
from flashcheck.mutation.runner import CONFIRMED, HANG_FACTOR, classify

# ---- the report ------------------------------------------------------------------------------------------

# A bare timeout is not counted as a kill: on a shared CPU it may be load. "hung" is one confirmed
# against the unmutated kernels (runner.hang_verdict).
DETECTED = ("killed", "crashed", "hung")
UNDECIDED = ("timed_out",)


#: Why the interpreter cannot kill a GPU-only operator's mutants.
GPU_ONLY_WHY = {"narrow_int64": "int32 offsets only overflow past 2^31 elements",
                "between_launches": "state one launch leaves for the next is never shared by the interpreter's launches"}

HEAD = "| {} | run | killed | hung | timed out | crashed | survived | equivalent | score | wall s (mean) | kill s (median / worst) |"
RULE = "|---|---|---|---|---|---|---|---|---|---|---|"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=HOME, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


#: A triage key with this prefix argues a mutant for compiled (GPU) runs only, where its bits may
#: differ from the interpreter's (another schedule, another rounding): it replaces the plain key's
#: argument in the GPU report and is ignored in the interpreter's.
GPU_TRIAGE = "gpu:"


def for_device(triage: dict[str, str], *, compiled: bool) -> dict[str, str]:
    """The triage arguments that hold for this kind of run (see GPU_TRIAGE)."""
    plain = {k: v for k, v in triage.items() if not k.startswith(GPU_TRIAGE)}
    if compiled:
        plain.update({k[len(GPU_TRIAGE):]: v for k, v in triage.items() if k.startswith(GPU_TRIAGE)})
    return plain


def to_markdown(mutants: list[Mutant], results: dict[str, dict[str, Any]], triage: dict[str, str],
                runs: list[dict[str, Any]], where: str = "Triton interpreter (CPU)", *, compiled: bool = False,
                command: str = "python -m flashcheck.mutants --probe-first --resume --report",
                store: str = "reports/records/mutants_store.json", commit: str | None = None) -> str:
    """The record (reports/quality/records.py's shape). The store's results count only for mutants of the
    kernels/ it is given (a mutant's key is its source), so the digest is of today's kernels/."""
    from flashcheck.records import header, kernels_digest

    triage = for_device(triage, compiled=compiled)
    runs_log = store.removesuffix(".json") + "_runs.json"  # runner.runs_file's name

    def status(r: dict[str, Any]) -> str:  # verdicts of the confirmation runs stand as stored
        return r["status"] if r["status"] in CONFIRMED else classify(r["returncode"], r["status"] == "timed_out",
                                                               bool(r["caught_by_test"]), r["probe"])

    def argued(m: Mutant, r: dict[str, Any]) -> bool:  # passed a narrowed run; the triage decides it
        return r["status"] == "error" and bool(r.get("only_tests")) and triage.get(m.id, "").startswith(
            ("equivalent", "not equivalent"))

    rows = [(m, dict(results[m.key], status=status(results[m.key]))) for m in mutants
            if m.key in results and not (compiled and m.interpreter_only)]
    rows = [(m, dict(r, status="survived", argued=True) if argued(m, r) else r) for m, r in rows]
    narrowed = [m.id for m, r in rows if r["status"] == "error" and r.get("only_tests")]
    errors = [m.id for m, r in rows if r["status"] == "error" and not r.get("only_tests")]
    rows = [(m, r) for m, r in rows if r["status"] != "error"]
    dates = sorted(r["date"][:10] for r in runs if r.get("date"))
    out = header(f"Mutation score, {where}", what="the share of one-node mutants of kernels/' `@triton.jit` functions "
                 "that the ci suite detects, per kernel", device=where,
                 date=dates[-1] if dates else _dt.date.today().isoformat(),
                 commit=commit or _git("log", "-1", "--format=%h", "--", "kernels/"),
                 digest=f"`{kernels_digest()}`", command=command)
    out += ["Every `@triton.jit` function of `kernels/` mutated one node at a time "
            "(`flashcheck/mutation/`); each mutant runs the ci suite of the kernels it changes with `-x`, "
            "Hypothesis shrinking skipped (a mutant of the interpreter's bf16 helpers that the suite does not "
            "catch then runs their exactness self-test, `tests/test_bf16_bits.py`). **Score** = detected / (run - equivalent - timed out): detected = "
            "killed (a test failed) + crashed (the test process died of a signal, e.g. an out-of-bounds "
            "access, before a test could fail); equivalent = survivors argued equivalent below (triage); "
            "hung = timed out inside one test that the unmutated kernels pass in under 1/{f:g} of the time the "
            "mutant spent in it (a per-test timeout fails it in CI), counted as detected; other timeouts = "
            "undecided (on a shared CPU a timeout may be load), listed and left out of the score.".format(f=HANG_FACTOR), ""]
    if runs:
        out += [f"Runs: {len(runs)} (`{runs_log}` logs each command, its counts and notes), "
                f"{dates[0] if dates else '?'} to {dates[-1] if dates else '?'}, "
                f"{sum(r.get('wall_seconds', 0) for r in runs) / 3600:.1f} h wall in all; results accumulate in the "
                "store and `--resume` skips mutants already decided.", ""]
    if errors:
        out += [f"Engine errors (pytest could not run; not counted, to be re-run): {', '.join(errors)}", ""]
    if narrowed:
        out += [f"Undecided, not counted ({len(narrowed)}): each passed a narrowed run (`--only-tests`, or "
                f"`--first-test-only`: the test that killed it elsewhere) and awaits the whole suite: "
                f"{', '.join(narrowed)}", ""]
    gen_total = len(mutants)
    if compiled:  # code a GPU never compiles: the interpreter's mutation run is where they die
        left_out = [m for m in mutants if m.interpreter_only]  # not scored here even where run
        left_out_txt = (f"interpreter-only, not compiled on a GPU: {len(left_out)} (inside `if FLAG:` for the "
                        f"constexprs {', '.join(INTERPRETER_FLAGS)}, which launchers set to `bf16_as_bits(...)`, "
                        "False on a GPU, or in helpers only such code calls; the interpreter's report scores them)")
    else:
        left_out = [m for m in mutants if m.operator in GPU_ONLY_OPERATORS and m.key not in results]
        left_out_txt = (f"GPU-only, not run under the interpreter: {len(left_out)} ({', '.join(GPU_ONLY_OPERATORS)}: "
                        + ", and ".join(GPU_ONLY_WHY.get(o, f"{o} needs a GPU") for o in GPU_ONLY_OPERATORS)
                        + "; flashcheck/suite/test_softmax_gpu.py "
                        "and test_attention_gpu.py are where they can die)")
    per_mod: dict[str, list[int]] = {}
    for m in mutants:
        c = per_mod.setdefault(f"{m.module}.{m.function}", [0, 0])
        c[0] += 1
        c[1] += m.key in results and not (compiled and m.interpreter_only)
    left_ids = {m.id for m in left_out}
    never = [m.id for m in mutants if m.key not in results and m.id not in left_ids]
    out += [f"Mutants generated: {gen_total}; run: {len(rows)}; {left_out_txt}"
            + (f"; not run yet ({len(never)}): {', '.join(never)}" if never else "") + ".", "",
            "Generated / run per function: " + "; ".join(f"{k} {v[1]}/{v[0]}" for k, v in sorted(per_mod.items())) + ".",
            ""]
    out += ["## Score per kernel", "",
            HEAD.format("kernel (jit function)"), RULE]
    groups: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        groups.setdefault(f"{m.module}.{m.function}", []).append(r)
    tot: dict[str, float] = {}

    def line(name: str, rs: list[dict[str, Any]]) -> str:
        c = {s: sum(r["status"] == s for r in rs) for s in ("killed", "hung", "timed_out", "crashed", "survived",
                                                                "equivalent_candidate")}
        eq = sum(r["status"] in ("survived", "equivalent_candidate") and triage.get(r["id"], "").startswith("equivalent")
                 for r in rs)
        surv = c["survived"] + c["equivalent_candidate"] - eq
        det = c["killed"] + c["hung"] + c["crashed"]
        denom = len(rs) - eq - c["timed_out"]
        score = f"{100 * det / denom:.1f}% ({det}/{denom})" if denom else "-"
        wall = sum(r["wall_seconds"] for r in rs) / max(1, len(rs))
        for k, v in (("run", len(rs)), ("det", det), ("denom", denom), ("wall", wall * len(rs))):
            tot[k] = tot.get(k, 0) + v
        return (f"| {name} | {len(rs)} | {c['killed']} | {c['hung']} | {c['timed_out']} | {c['crashed']} | {surv} | {eq} | "
                f"{score} | {wall:.1f} | {_kill_seconds(rs)} |")

    for name in sorted(groups):
        out.append(line(name, groups[name]))
    specs: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        for s in m.specs:
            specs.setdefault(s, []).append(r)
    out += ["", "## Score per registered kernel (a mutant of a shared helper counts for each kernel it changes)", "",
            HEAD.format("kernel"), RULE]
    for s in sorted(specs):
        out.append(line(s, specs[s]))
    all_rs = [r for _, r in rows]
    tot.clear()
    out += ["", "## Overall", "", HEAD.format(""), RULE, line("all", all_rs), "",
            "kill s: wall seconds of a killed mutant's run, pytest's start included (the suite stops at the "
            "first failure), median and worst over the kernel's killed mutants.", "",
            f"Total wall time of the mutant runs: {tot.get('wall', 0) / 60:.1f} min (sum over mutants).", ""]
    ops: dict[str, list[dict[str, Any]]] = {}
    for m, r in rows:
        ops.setdefault(m.operator, []).append(r)
    out += ["## By operator", "", "| operator | run | detected | survived or equivalent |", "|---|---|---|---|"]
    for o in OPERATORS:
        rs = ops.get(o, [])
        out.append(f"| {o} | {len(rs)} | {sum(r['status'] in DETECTED for r in rs)} | "
                   f"{sum(r['status'] not in DETECTED + UNDECIDED for r in rs)} |")
    out += ["", "## Survivors", "",
            "Each survivor's diff: `python -m flashcheck.mutants --diff ID`; the triage's whole argument: "
            "`reports/records/mutants_triage.json` (its first sentence below).", ""]
    surv = [(m, r) for m, r in rows if r["status"] not in DETECTED + UNDECIDED]
    undecided = [m.id for m, r in rows if r["status"] in UNDECIDED]
    if undecided:
        out += [f"Timed out (undecided, not in the score): {', '.join(f'`{i}`' for i in undecided)}", ""]
    if not surv:
        out += ["None.", ""]
    else:
        out += ["| mutant | status | change | run | triage |", "|---|---|---|---|---|"]
    for m, r in surv:
        pr = r.get("probe") or {}
        probe_txt = (f"bit-identical on {pr.get('probes')} probe calls" if pr.get("identical") else
                     f"probe differs: {pr.get('witness') or pr.get('error')}")
        ran = (f"suite not run (`--probe-first`), {probe_txt}" if r.get("suite_skipped") else
               f"passed the narrowed run `{r['only_tests']}`, the whole suite not run" if r.get("argued") else
               f"{r['tests_passed']} tests passed in {r['wall_seconds']:.0f}s; {probe_txt}")
        why = triage.get(m.id, "NOT TRIAGED")
        out.append(f"| `{m.id}` | {r['status']} | {_cell(m.description)} | {_cell(ran)} | {_cell(_first_sentence(why))} |")
    killers: dict[str, int] = {}
    for m, r in rows:
        if r["status"] in DETECTED:
            t = f'`{(r["caught_by_test"] or r["status"]).split("::")[-1]}`'
            killers[t] = killers.get(t, 0) + 1
    top = sorted(killers.items(), key=lambda kv: (-kv[1], kv[0]))
    out += ["", "## What killed them", "", f"The first failing test of each detected mutant, {len(top)} tests in "
            f"all (each mutant's own: the store, `{store}`):", "",
            "| test | mutants |", "|---|---|"]
    out += [f"| {t} | {n} |" for t, n in top[:KILLERS]]
    if len(top) > KILLERS:
        out.append(f"| {len(top) - KILLERS} other tests | {sum(n for _, n in top[KILLERS:])} |")
    return "\n".join(out) + "\n"



#: The record shows the tests that killed most mutants; the store names each mutant's.
KILLERS = 12


def _cell(text: str) -> str:
    return " ".join(str(text).replace("|", "/").split())


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


def _kill_seconds(rs: list[dict[str, Any]]) -> str:
    import statistics

    t = sorted(r["wall_seconds"] for r in rs if r["status"] == "killed")
    return f"{statistics.median(t):.0f} / {t[-1]:.0f}" if t else "-"


TRIAGE_FILE = HOME / "reports" / "records" / "mutants_triage.json"
