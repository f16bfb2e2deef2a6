"""A compiled mutant's memory-safety verdict: the GPU lane's memcheck sweep (`reports/quality/memcheck_sweep.py`)
run against the mutant under `compute-sanitizer --tool memcheck` (`python -m flashcheck.mutants
--sanitizer CASES`).

On a GPU an unmasked load past a buffer's end usually reads whatever lies behind it without
faulting: PyTorch's caching allocator carves small tensors out of 2 MiB segments, so the address is
mapped, the garbage lands in rows that are never stored, and no test can see it. The lane's sweep
catches such a kernel, and so does this verdict, with every tensor in its own `cudaMalloc`
(`PYTORCH_NO_CUDA_MEMORY_CACHING=1`): memcheck then checks each access against the tensor's own
extent. A kill counts only where the same cases are clean on the unmutated kernels (a baseline,
once per case selection and code digest)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from typing import Any

from flashcheck import HOME

#: --sanitizer: the memcheck_sweep cases run (a substring of their names, as its --only); "" = off.
CASES = ""
#: compute-sanitizer's exit code when it found an error (any code the sweep itself never returns).
ERROR_EXIT = 86
SWEEP = "reports/quality/memcheck_sweep.py"

_BASELINE_LOCK = threading.Lock()


def command(cases: str) -> list[str]:
    # The probe module installs the mutant (FLASHCHECK_MUTANT) when imported, before the sweep
    # imports the kernels.
    code = ("import flashcheck.mutation.probe; from flashcheck.reports.quality.memcheck_sweep import main; "
            f"raise SystemExit(main(['--small', '--only', {cases!r}]))")
    return ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "5", "--error-exitcode", str(ERROR_EXIT),
            sys.executable, "-c", code]


# compute-sanitizer's report lines, for this verdict and the lane's sweep (reports/quality/gpu_lane.py).
ERROR_LINE = re.compile(r"^========= (Invalid .*|.*[Oo]ut of bounds.*|Address .*|.*[Mm]isaligned.*|.*access.*)$", re.M)
KERNEL_LINE = re.compile(r"^=========\s+(?:in|at) (\S+)", re.M)
SUMMARY_LINE = re.compile(r"^========= ERROR SUMMARY: (\d+) error", re.M)


def parse(text: str) -> dict[str, Any]:
    """The sweep's output under memcheck: errors found, the case running at the first, the first
    error line and the kernel it names."""
    first_err = ERROR_LINE.search(text)
    summary = SUMMARY_LINE.findall(text)
    errors = sum(int(s) for s in summary) if summary else (1 if first_err else 0)
    case = kernel = None
    if first_err:
        cases = re.findall(r"^CASE \d+ (.*)$", text[:first_err.start()], re.M)
        case = cases[-1] if cases else None
        k = KERNEL_LINE.search(text, first_err.end())
        kernel = k.group(1) if k else None
    return {"errors": errors, "case": case, "kernel": kernel,
            "line": first_err.group(1).strip() if first_err else None,
            "done": bool(re.search(r"^DONE \d+ (of \d+ )?cases", text, re.M))}


def run(env_extra: dict[str, str], *, timeout: float) -> dict[str, Any]:
    """The selected sweep cases under memcheck, the mutant (if env_extra names one) in place."""
    from flashcheck.plugin.killrun import clean_env

    env = clean_env()
    env.update(env_extra)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command(CASES), cwd=HOME, env=env, capture_output=True, text=True, timeout=timeout)
        text, rc, timed_out = proc.stdout + proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as e:
        text, rc, timed_out = str(e.stdout or "") + str(e.stderr or ""), -1, True
    out = parse(text)
    out.update(returncode=rc, timed_out=timed_out, wall_seconds=round(time.perf_counter() - t0, 1),
               tail=text[-1500:])
    return out


def baseline(module: str, *, timeout: float) -> str | None:
    """None when the selected cases are clean under memcheck on the unmutated kernels, else why
    not. Run once per code digest and selection (saved beside the store)."""
    from flashcheck.mutation import baselines as runner

    nodeid = f"{SWEEP}::{CASES}"
    with _BASELINE_LOCK:
        saved = runner._saved_baseline(module, nodeid)
        if saved is not None:
            return saved[0]
        r = run({}, timeout=timeout)
        if r["timed_out"]:
            return f"the unmutated sweep timed out after {timeout:.0f}s"
        why = None if r["errors"] == 0 and r["returncode"] == 0 and r["done"] else (
            f"unmutated: {r['errors']} memcheck errors, exit {r['returncode']}" + (f", in {r['case']}" if r["case"] else ""))
        runner._save_baseline(module, nodeid, why, r["wall_seconds"])
        return why


def verdict(module: str, env_extra: dict[str, str], *, timeout: float) -> dict[str, Any]:
    """(status, and the store's fields) of a mutant under the sanitizer: killed where memcheck
    reports an error the unmutated kernels do not make; otherwise undecided ("error"), since only
    some cases ran and memory safety is not the whole contract."""
    r = run(env_extra, timeout=timeout)
    why = baseline(module, timeout=timeout) if r["errors"] and not r["timed_out"] else None
    if r["timed_out"]:
        status, message = "timed_out", f"the sanitizer sweep ran past {timeout:.0f}s"
    elif r["errors"] and why is None:
        status = "killed"
        message = f"compute-sanitizer memcheck: {r['line']} in {r['kernel']} (case {r['case']})"
    elif r["errors"]:
        status, message = "error", f"not a kill: the sweep is not clean on the unmutated kernels ({why})"
    else:
        status, message = "error", f"memcheck clean on the sweep's {CASES!r} cases (undecided: only the sanitizer ran)"
    return {"status": status, "returncode": r["returncode"], "wall_seconds": r["wall_seconds"],
            "caught_by_test": f"{SWEEP}::{r['case']}" if status == "killed" else None,
            "caught_by_property": "memory safety (compute-sanitizer)" if status == "killed" else None,
            "exception": "MemcheckError" if status == "killed" else None,
            "message": message[:600], "tail": r["tail"], "only_tests": f"sanitizer:{CASES}"}


def available() -> bool:
    import shutil

    return shutil.which("compute-sanitizer") is not None
