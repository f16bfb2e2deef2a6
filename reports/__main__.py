"""`python -m flashcheck.reports`: the stability report of every registered kernel.

For each kernel, dtype and adversarial class: examples drawn deterministically from the class's
strategy, the kernel's output compared with the certified oracle, and the max/mean ULP error and
measured/bound ratio written as Markdown, JSON and plots.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import REGISTRY

DEFAULT_OUT = Path(__file__).resolve().parent / "out"
# Past |x_i - max| = 104, exp underflows below fp32's smallest subnormal: the output is 0.
EXP_UNDERFLOW = 104.0


def _family_module(family: str):
    if family == "softmax":
        from . import softmax as mod
    else:
        from . import attention as mod
    return mod


def collect(names: list[str] | None, family: str | None, examples: int, log=print) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for spec in REGISTRY:
        if (names and spec.name not in names) or (family and spec.family != family):
            continue
        mod = _family_module(spec.family)
        for dtype in spec.dtypes:
            t0 = time.perf_counter()
            got = mod.stability_rows(spec, dtype, examples=examples)
            rows.extend(got)
            log(f"  {spec.name:<20} {str(dtype):<16} {len(got)} classes  {time.perf_counter() - t0:6.1f}s")
    return rows


def _environment() -> dict[str, str]:
    import torch
    import triton

    return {"date": dt.date.today().isoformat(), "device": "Triton interpreter (CPU)" if INTERPRET
            else torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version()}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def to_markdown(rows: list[dict[str, Any]], env: dict[str, str], examples: int) -> str:
    out = ["# flashcheck stability report", "",
           f"{env['date']} on {env['device']}; torch {env['torch']}, triton {env['triton']}. "
           f"{examples} examples per kernel, dtype and class, drawn deterministically from the class's strategy. "
           "Errors are ULP distances from the correctly rounded oracle; `err/bound` is the largest "
           "measured error over its derived bound (<= 1 passes). `viol` counts elements over the bound, "
           "`ftz` outputs flushed to zero below fp32's normals (allowed), `nan!` NaN mismatches.", ""]
    families = sorted({r["family"] for r in rows})
    for fam in families:
        frows = [r for r in rows if r["family"] == fam]
        out += [f"## {fam}: summary (worst class per kernel and dtype)", "",
                "| kernel | dtype | max ULP | worst class | max err/bound | violations | ftz |",
                "|---|---|---|---|---|---|---|"]
        for key in dict.fromkeys((r["kernel"], r["dtype"]) for r in frows):
            group = [r for r in frows if (r["kernel"], r["dtype"]) == key]
            worst = max(group, key=lambda r: r["max_bound_ratio"])
            out.append(f"| {key[0]} | {key[1]} | {_fmt(max(r['max_ulp'] for r in group))} | {worst['strategy']} | "
                       f"{_fmt(worst['max_bound_ratio'])} | {sum(r['violations'] + r['nan_mismatch'] for r in group)} | "
                       f"{sum(r['ftz'] for r in group)} |")
        extra = [k for k in ("sdpa_ratio",) if any(k in r for r in frows)]
        out += ["", f"## {fam}: every class", "",
                "| kernel | dtype | class | elements | max ULP | mean ULP | max err/bound | mean err/bound | viol | nan! | ftz |"
                + "".join(f" {k} |" for k in extra),
                "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra)]
        for r in frows:
            out.append(f"| {r['kernel']} | {r['dtype']} | {r['strategy']} | {r['elements']} | {_fmt(r['max_ulp'])} | "
                       f"{_fmt(r['mean_ulp'])} | {_fmt(r['max_bound_ratio'])} | {_fmt(r['mean_bound_ratio'])} | "
                       f"{r['violations']} | {r['nan_mismatch']} | {r['ftz']} |"
                       + "".join(f" {_fmt(r.get(k))} |" for k in extra))
        out.append("")
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    for fam in sorted({r["family"] for r in rows}):
        frows = [r for r in rows if r["family"] == fam]
        keys = list(dict.fromkeys((r["kernel"], r["dtype"]) for r in frows))
        classes = list(dict.fromkeys(r["strategy"] for r in frows))
        grid = np.full((len(keys), len(classes)), np.nan)
        for r in frows:
            grid[keys.index((r["kernel"], r["dtype"])), classes.index(r["strategy"])] = r["max_bound_ratio"]
        fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(classes), 1.2 + 0.38 * len(keys)))
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(keys)), [f"{k} {d}" for k, d in keys], fontsize=8)
        for i in range(len(keys)):
            for j in range(len(classes)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if grid[i, j] < 0.6 else "black")
        ax.set_title(f"{fam}: max measured error / derived bound (<= 1 passes)", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.03)
        fig.tight_layout()
        path = out / f"stability_{fam}_ratio.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        written.append(path)
    fp32 = [r for r in rows if r["family"] == "softmax" and r["dtype"] == "fp32" and len(r.get("_samples", ()))]
    if fp32:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for kernel in dict.fromkeys(r["kernel"] for r in fp32):
            s = np.concatenate([r["_samples"] for r in fp32 if r["kernel"] == kernel])
            s = s[s[:, 0] <= EXP_UNDERFLOW]
            ax.scatter(s[:, 0], s[:, 1], s=3, alpha=0.4, label=f"{kernel} measured")
        s = np.concatenate([r["_samples"] for r in fp32])
        s = s[s[:, 0] <= EXP_UNDERFLOW]
        ax.scatter(s[:, 0], s[:, 2], s=2, c="k", alpha=0.25, label="derived bound")
        ax.set_xlabel("|x_i - max|  (condition of exp)")
        ax.set_ylabel("ULP error, fp32 output")
        ax.set_title("softmax fp32: error grows with |x_i - max|, as the bound says", fontsize=9)
        ax.legend(fontsize=7, markerscale=3)
        fig.tight_layout()
        path = out / "stability_softmax_fp32_condition.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashcheck.reports", description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=None,
                   help="examples per kernel, dtype and class (default 6 on CPU, 40 on GPU)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--kernel", action="append", help="only this registered kernel (repeatable)")
    p.add_argument("--family", choices=["softmax", "attention"])
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--kill-matrix", action="store_true",
                   help="instead: run the ci suite against every known-bad zoo kernel (reports/kill_matrix.py; "
                        "its own options follow, e.g. --kill-matrix --zoo NAME --jobs 2)")
    if argv is None:
        argv = sys.argv[1:]
    if "--kill-matrix" in argv:
        from . import kill_matrix

        rest = [a for a in argv if a != "--kill-matrix"]
        return kill_matrix.main(rest)
    args = p.parse_args(argv)
    # The interpreter evaluates -inf - -inf and friends in NumPy on purpose (NUMERICS.md s. 2):
    # its RuntimeWarnings are expected noise here, not findings.
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    examples = args.examples or (6 if INTERPRET else 40)
    args.out.mkdir(parents=True, exist_ok=True)
    env = _environment()
    print(f"flashcheck stability report on {env['device']}, {examples} examples per class")
    t0 = time.perf_counter()
    rows = collect(args.kernel, args.family, examples)
    md = to_markdown(rows, env, examples)
    (args.out / "stability.md").write_text(md)
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    (args.out / "stability.json").write_text(json.dumps({"environment": env, "examples": examples, "rows": clean},
                                                         indent=1))
    written = [] if args.no_plots else plot(rows, args.out)
    print(f"wrote {args.out / 'stability.md'}, stability.json"
          + "".join(f", {w.name}" for w in written) + f" in {time.perf_counter() - t0:.0f}s")
    bad = sum(r["violations"] + r["nan_mismatch"] for r in rows)
    if bad:
        print(f"{bad} elements exceed their bound: see the report", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
