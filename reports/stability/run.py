"""Run kernels and baselines on shared adversarial inputs: rows of statistics per kernel, dtype, class.

Every kernel of a family (and every baseline) gets the same drawn inputs, so their figures
compare like with like and the oracle runs once per input. Work goes round by round (example r
of every family, dtype and class before example r + 1 of any), so a time budget that ends the run
early leaves every cell with the same number of examples, and the ETA is right after one round.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from flashcheck.kernels.registry import KernelSpec
from flashcheck.isolation import hooks as kernel_hooks

kernel_hooks.attach()
from flashcheck.oracles.formats import format_of
from flashcheck.strategies.sample import draw_examples

from ._stats import Accumulator
from .capture import KernelOutput

#: Inputs a kernel may crash or hang on before the rest of its inputs are not run: each crash costs
#: a fresh process that measures everything again, each hang the whole --timeout (a kernel that
#: always hangs cost 72 inputs x 300 s by default, and then no report).
CRASH_LIMIT = 2


def family_module(family: str):
    """The family's report module, as its record (flashcheck/families.py) names it."""
    from flashcheck import families

    return families.get(family).module("report")


class Progress:
    """One progress bar with ETA on stderr; on a terminal it redraws in place, else one line
    every 10% (CI logs)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 28) -> None:
        self.total, self.done, self.t0 = max(total, 1), 0, time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.width, self.last_decile = width, -1

    @staticmethod
    def _clock(s: float) -> str:
        s = int(round(s))
        return f"{s // 60}:{s % 60:02d}"

    def update(self, label: str = "", step: int = 1, eta: float | None = None) -> None:
        """One more input done; `eta` (seconds) replaces the average-rate estimate when given."""
        self.done += step
        frac = min(self.done / self.total, 1.0)
        el = time.perf_counter() - self.t0
        if eta is None:
            eta = el / self.done * (self.total - self.done) if self.done else 0.0
        fill = int(frac * self.width)
        line = (f"[{'#' * fill}{'.' * (self.width - fill)}] {frac:4.0%} {self.done}/{self.total} inputs  "
                f"{self._clock(el)} elapsed, ETA {self._clock(eta)}  {label}")
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            self.stream.flush()
        elif int(frac * 10) > self.last_decile or self.done == self.total:
            self.last_decile = int(frac * 10)
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class Cell:
    spec: KernelSpec
    dtype: str
    cls: str
    acc: Accumulator = field(default_factory=Accumulator)
    skipped: int = 0  # inputs the kernel does not declare it takes
    refused: int = 0  # baselines: inputs the backend refused
    hung: int = 0  # inputs it hung on (in an earlier process of this report)
    crashed: int = 0  # inputs it took its process down on otherwise (exit, signal, GPU fault)
    not_run: int = 0  # inputs left after it crashed or hung CRASH_LIMIT times
    seconds: float = 0.0  # in the kernel and in judging its output

    def row(self) -> dict[str, Any]:
        base = bool(self.spec.extra.get("baseline"))
        return {"kernel": self.spec.name, "family": self.spec.family, "dtype": self.dtype, "strategy": self.cls,
                "baseline": base, "skipped": self.skipped, "refused": self.refused, "hung": self.hung,
                "crashed": self.crashed, "not_run": self.not_run, "seconds": round(self.seconds, 3),
                **self.acc.summary()}


@dataclass
class RunResult:
    rows: list[dict[str, Any]]
    inputs_done: int
    inputs_total: int
    seconds: float
    budget_hit: bool
    oracle_seconds: float = 0.0


def collect(specs: list[KernelSpec], *, examples: int, baselines: bool = True, budget: float | None = None,
            progress: Progress | None | bool = True, log: Callable[[str], None] | None = None,
            dtypes: list[str] | None = None, classes: list[str] | None = None) -> RunResult:
    """Statistics of `specs` (and the family baselines) on `examples` shared inputs per family,
    dtype and class (all, or those named); once every class has had one input, stops early,
    after a whole input, when `budget` seconds are spent."""
    t0 = time.perf_counter()
    plan = []  # (family module, fmt, class, cases, cells)
    cells: list[Cell] = []
    for family in dict.fromkeys(s.family for s in specs):
        mod = family_module(family)
        fam_specs = [s for s in specs if s.family == family]
        extra = mod.baselines() if baselines else []
        fam_dtypes = list(dict.fromkeys(d for s in fam_specs for d in s.dtypes))
        for dtype in fam_dtypes:
            fmt = format_of(dtype)
            if dtypes and fmt.name not in dtypes:
                continue
            users = [s for s in fam_specs if dtype in s.dtypes]
            for cls, strategy in mod.strategies(users, fmt).items():
                if classes and cls not in classes:
                    continue
                cases = draw_examples(strategy, examples)
                mine = [Cell(s, fmt.name, cls) for s in users + extra]
                cells.extend(mine)
                plan.append((mod, fmt, cls, cases, mine))
    total = sum(len(p[3]) for p in plan)
    bar = (Progress(total) if progress is True else progress) or None
    done, hit, oracle_s = 0, False, 0.0
    rounds = max((len(p[3]) for p in plan), default=0)
    # Hypothesis draws the simplest input first, so later rounds cost more: the ETA charges each
    # remaining input what the same class's latest input cost (the average before it ran once).
    cost: dict[int, float] = {}
    down: dict[str, int] = {}  # inputs each kernel crashed or hung on so far
    printed = KernelOutput()
    for r in range(rounds):
        for i, (mod, fmt, cls, cases, mine) in enumerate(plan):
            if r >= len(cases):
                continue
            if budget is not None and r > 0 and time.perf_counter() - t0 > budget:
                hit = True
                break
            t1 = time.perf_counter()
            prepared = mod.prepare(cases[r], fmt)
            oracle_s += time.perf_counter() - t1
            for cell in mine:
                name = cell.spec.name
                before = cell.hung + cell.crashed
                run_one(mod, cell, prepared, key=f"{name} {fmt.name} {cls} #{r}",
                        stopped=down.get(name, 0) >= CRASH_LIMIT, printed=printed)
                if before < cell.hung + cell.crashed:
                    down[name] = down.get(name, 0) + 1
                    if down[name] == CRASH_LIMIT and log:
                        log(f"{name} crashed or hung on {CRASH_LIMIT} inputs: its remaining inputs are not run")
            done += 1
            cost[i] = time.perf_counter() - t1
            if bar:
                avg = sum(cost.values()) / len(cost)
                left = sum(cost.get(j, avg) * max(0, len(p[3]) - (r + 1 if j <= i else r))
                           for j, p in enumerate(plan))
                bar.update(f"{mod.FAMILY} {fmt.name} {cls}", eta=left)
        if hit:
            break
    if bar:
        bar.close()
    printed.close()
    if hit and log:
        log(f"time budget of {budget:.0f}s reached after {done} of {total} inputs "
            f"({done / max(len(plan), 1):.1f} per class)")
    return RunResult([c.row() for c in cells], done, total, time.perf_counter() - t0, hit, oracle_s)


def run_one(mod, cell: Cell, prepared, key: str = "", stopped: bool = False,
            printed: KernelOutput | None = None) -> None:
    """One kernel on one prepared input, folded into its cell: a kernel that raises on an input it
    declares it takes fails; a baseline backend that refuses the input is counted as refused.
    `key` names the call for `flashcheck.isolation.journal` (a crash or hang in it is that kernel's error);
    a `stopped` kernel (crashed or hung too often) is not called. What it prints goes through
    `printed` (capped)."""
    t0 = time.perf_counter()
    try:
        _run_one(mod, cell, prepared, key, stopped, printed)
    finally:
        cell.seconds += time.perf_counter() - t0


def _run_one(mod, cell: Cell, prepared, key: str, stopped: bool, printed: KernelOutput | None) -> None:
    import os
    from contextlib import nullcontext

    from flashcheck.isolation import journal as isolation, supervisor
    from flashcheck.isolation.faults import GpuFault

    spec = cell.spec
    if not mod.supports(spec, prepared):
        cell.skipped += 1
        return
    crashed = isolation.excluded().get(key) if key else None
    if crashed:  # it crashed or hung on this input in an earlier run of this report
        cell.acc.add_error(isolation.KernelCrashed(crashed.removeprefix(key + ": ")))
        if supervisor.hung(crashed):
            cell.hung += 1
        else:
            cell.crashed += 1
        return
    if stopped:
        cell.not_run += 1
        isolation.record("plan", tasks=[key])  # planned, never started: the run's tally counts it not run
        return
    timeout = float(os.environ.get(isolation.TIMEOUT_ENV) or 0) or None
    try:
        with isolation.task(key, timeout) if key else nullcontext(), \
                printed.capture() if printed else nullcontext():
            out = mod.call(spec, prepared)
    except GpuFault as e:  # the context is dead: with a parent, a fresh child makes the report
        isolation.fault_exit(f"{key}: {e}")
        cell.acc.add_error(e)
        return
    except (Exception, SystemExit) as e:  # the kernel's failure, whatever it raised (sys.exit too)
        if spec.extra.get("baseline"):
            cell.refused += 1
        else:
            cell.acc.add_error(e)
        return
    cell.acc.add(mod.measure(spec, prepared, out))


__all__ = ["collect", "Progress", "Cell", "RunResult", "family_module"]
