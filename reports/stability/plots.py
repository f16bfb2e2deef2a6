"""The report's figures (matplotlib, Agg): pass/fail heat map, signed error per class, error
profiles against N and against |x_i - max| as small multiples per kernel."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

# Colour scale of err/bound on log10: greens up to the bound (pale = far inside), reds past it.
LOG_MIN, LOG_MAX = -4.0, 6.0
FAIL_RED = "#b2182b"  # the colour a failing cell is drawn with at the least (just past its bound)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ratio_cmap():
    """256 colours over log10(err/bound) in [LOG_MIN, LOG_MAX]: greens below 0, reds above."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap, to_rgba

    greens, reds = colormaps["Greens"], colormaps["Reds"]
    split = -LOG_MIN / (LOG_MAX - LOG_MIN)
    cols = []
    for i in range(256):
        t = i / 255
        if t <= split:
            cols.append(greens(0.08 + 0.42 * t / split))
        else:
            f = (t - split) / (1 - split)
            cols.append(to_rgba(FAIL_RED) if f < 0.02 else reds(0.75 + 0.25 * f))
    return ListedColormap(cols, name="flashcheck_ratio")


def ratio_colour(v: float | None) -> tuple[float, float, float, float]:
    """The heat map colour of one err/bound value (None: no data; inf: NaN mismatch or error)."""
    if v is None:
        return (1.0, 1.0, 1.0, 1.0)
    if not math.isfinite(v):
        return ratio_cmap()(1.0)
    if v > 1.0:  # a failure is red however little it exceeds the bound
        lv = max(math.log10(v), 1e-9)
    else:
        lv = math.log10(v) if v > 0 else LOG_MIN
        lv = min(lv, 0.0)
    t = (min(max(lv, LOG_MIN), LOG_MAX) - LOG_MIN) / (LOG_MAX - LOG_MIN)
    return ratio_cmap()(t)


def is_failure_colour(rgba) -> bool:
    r, g, b = rgba[:3]
    return r > 0.35 and r > g + 0.2 and r > b + 0.2


def cell_text(row: dict[str, Any]) -> str:
    if row["outputs"] == 0 and not row["errors"]:
        return "not run" if row.get("not_run") else "-"
    if row.get("hung"):
        return "hung"
    if row.get("crashed"):
        return "crashed"
    if row["errors"]:
        return "raised"
    if row["mismatch"]:
        return f"NaN/inf\n{row['mismatch']}"
    v = row["max_bound_ratio"]
    txt = "0" if v == 0 else f"{v:.2g}"
    if row["dtype"] in ("fp16", "bf16") and row["exact_share"] is not None:
        txt += f"\n{math.floor(100 * row['exact_share']):.0f}% cr"  # 99.6% is not 100%
    return txt


def cell_value(row: dict[str, Any] | None) -> float | None:
    """The heat map value of a cell: max err/bound (inf for a NaN/inf mismatch or a raise),
    None when the kernel took no input of the class."""
    if row is None or (row["outputs"] == 0 and not row["errors"]):
        return None
    return row["max_bound_ratio"]


def heat_grid(rows: list[dict[str, Any]], family: str):
    """(row keys (kernel, dtype, baseline), classes, {(i, j): (row, colour)}): what the heat map draws."""
    frows = [r for r in rows if r["family"] == family]
    keys = list(dict.fromkeys((r["kernel"], r["dtype"], r["baseline"]) for r in frows))
    kernels = list(dict.fromkeys(k[0] for k in keys))
    dtypes = list(dict.fromkeys(k[1] for k in keys))
    # kernels first, baselines below; each kernel's dtypes together
    keys.sort(key=lambda k: (k[2], kernels.index(k[0]), dtypes.index(k[1])))
    classes = list(dict.fromkeys(r["strategy"] for r in frows))
    by = {(r["kernel"], r["dtype"], r["strategy"]): r for r in frows}
    cells = {}
    for i, (k, d, _) in enumerate(keys):
        for j, c in enumerate(classes):
            r = by.get((k, d, c))
            cells[i, j] = (r, ratio_colour(cell_value(r)))
    return keys, classes, cells


def heatmap(rows: list[dict[str, Any]], family: str, path: Path) -> Path:
    plt = _plt()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    keys, classes, cells = heat_grid(rows, family)
    fig, ax = plt.subplots(figsize=(2.2 + 0.82 * len(classes), 1.6 + 0.42 * len(keys)))
    for (i, j), (r, col) in cells.items():
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=col, edgecolor="white", lw=1))
        if r is not None:
            v = cell_value(r)
            dark = sum(col[:3]) < 1.6
            ax.text(j, i, cell_text(r), ha="center", va="center", fontsize=6,
                    color="white" if dark else "black", fontweight="bold" if v and v > 1 else None)
    nk = sum(1 for k in keys if not k[2])
    if 0 < nk < len(keys):
        ax.axhline(nk - 0.5, color="black", lw=1.5)
    ax.set_xlim(-0.5, len(classes) - 0.5)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xticks(range(len(classes)), classes, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(keys)), [f"{k} {d}" + (" (baseline)" if b else "") for k, d, b in keys], fontsize=8)
    for t, (_, _, b) in zip(ax.get_yticklabels(), keys):
        if b:
            t.set_color("#555555")
    ax.set_title(f"{family}: max error / derived bound per kernel, dtype and class\n"
                 "green passes (<= 1), red fails; 'cr' = share of 16-bit outputs correctly rounded",
                 fontsize=9)
    sm = ScalarMappable(norm=Normalize(LOG_MIN, LOG_MAX), cmap=ratio_cmap())
    cb = fig.colorbar(sm, ax=ax, fraction=0.025, pad=0.02)
    ticks = list(range(int(LOG_MIN), int(LOG_MAX) + 1, 2))
    cb.set_ticks(ticks, labels=[("bound" if t == 0 else f"1e{t}") for t in ticks], fontsize=7)
    cb.set_label("err / bound (log scale; 0 and below 1e-4 at the bottom)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def signed_errors(rows: list[dict[str, Any]], family: str, path: Path, units: str) -> Path | None:
    """Mean signed error with its 95% CI per class, one panel per dtype, a marker per kernel."""
    plt = _plt()
    frows = [r for r in rows if r["family"] == family and r["signed_ulp"]["mean"] is not None]
    if not frows:
        return None
    dtypes = list(dict.fromkeys(r["dtype"] for r in frows))
    classes = list(dict.fromkeys(r["strategy"] for r in rows if r["family"] == family))
    kernels = list(dict.fromkeys((r["kernel"], r["baseline"]) for r in frows))
    kernels.sort(key=lambda k: k[1])
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(1.8 + 0.62 * len(classes), 2.3 * len(dtypes)), sharex=True,
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.7 / max(len(kernels), 1)
    for ax, d in zip(axes[:, 0], dtypes):
        ax.axhline(0, color="black", lw=0.8)
        for i, (k, base) in enumerate(kernels):
            xs, ys, lo, hi = [], [], [], []
            for j, c in enumerate(classes):
                r = next((r for r in frows if (r["kernel"], r["dtype"], r["strategy"]) == (k, d, c)), None)
                if r is None:
                    continue
                s = r["signed_ulp"]
                xs.append(j - 0.35 + width * (i + 0.5))
                ys.append(s["mean"])
                lo.append(s["mean"] - (s["lo"] if s["lo"] is not None else s["mean"]))
                hi.append((s["hi"] if s["hi"] is not None else s["mean"]) - s["mean"])
            col = colours[i % len(colours)]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=4, capsize=2, lw=1, color=col,
                        mfc="white" if base else col, label=k + (" (baseline)" if base else ""))
        # a +0.5 ULP bias must look large, noise of 0.001 ULP flat; bound units are finer
        lim = max([abs(v) for v in ax.get_ylim()] + [0.6 if units == "ULP" else 0.02])
        if lim > (4 if units == "ULP" else 1):
            ax.set_yscale("symlog", linthresh=1.0 if units == "ULP" else 0.01)
        else:
            ax.set_ylim(-lim, lim)
        ax.set_ylabel(f"{d}: mean signed\nerror ({units})", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xticks(range(len(classes)), classes, rotation=40, ha="right", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=min(len(kernels), 4), loc="upper right")
    fig.suptitle(f"{family}: signed error, mean and 95% CI over rows\n(a bar clear of 0 is a rounding bias)",
                 fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bound_cap(max_err: np.ndarray, bound: np.ndarray, units: str) -> float:
    """The top of a profile's scale: 100x the largest finite error or 10x the median bound, whichever
    is higher, at least 10 ULPs (or 1 bound). Bounds in ULPs explode where outputs sit near the
    subnormal range (an absolute term over a tiny ULP: 1e31 ULPs in an H200's bf16 and fp32
    panels), which squeezed every error onto the axis; those spikes are clipped and marked."""
    finite = max_err[np.isfinite(max_err)]
    bounds = bound[np.isfinite(bound) & (bound > 0)]
    return max(100.0 * float(finite.max()) if finite.size else 0.0,
               10.0 * float(np.median(bounds)) if bounds.size else 0.0, 10.0 if units == "ULP" else 1.0)


def profiles(rows: list[dict[str, Any]], family: str, feature: str, label: str, units: str,
             path: Path) -> Path | None:
    """Error against one feature, small multiples: a row of panels per kernel, a column per dtype.
    Mean and max error per log2 bin, the largest bound in the bin dashed, failing bins in red.
    Outputs flushed to zero where the contract allows it are not in the profiles (the tables'
    `flushed` column counts them)."""
    plt = _plt()
    # Only what was measured: a kernel that raised, hung or took no input has no error to plot
    # (its table says why), and a legend of no lines cannot be laid out.
    frows = [r for r in rows if r["family"] == family and not r["baseline"] and r["outputs"]]
    kernels = list(dict.fromkeys(r["kernel"] for r in frows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in frows))
    if not kernels:
        return None
    fig, axes = plt.subplots(len(kernels), len(dtypes), figsize=(3.4 * len(dtypes), 0.8 + 2.4 * len(kernels)),
                             squeeze=False, sharex=True)
    for i, k in enumerate(kernels):
        for j, d in enumerate(dtypes):
            ax = axes[i, j]
            agg: dict[float, list[float]] = {}
            for r in frows:
                if (r["kernel"], r["dtype"]) != (k, d):
                    continue
                p = r["profiles"][feature]
                for x, c, mean, mx, b, f in zip(p["x"], p["count"], p["mean"], p["max"], p["bound"], p["fail"]):
                    a = agg.setdefault(x, [0, 0.0, 0.0, 0.0, 0])
                    a[0] += c
                    a[1] += mean * c
                    a[2] = max(a[2], mx)
                    a[3] = max(a[3], b)
                    a[4] += f
            if agg:
                xs = np.array(sorted(agg))
                A = np.array([agg[x] for x in xs], dtype=np.float64)
                top = np.where(np.isfinite(A[:, 2]), A[:, 2], np.nan)
                cap = _bound_cap(top, A[:, 3], units)
                ax.plot(xs, A[:, 1] / A[:, 0], "o-", ms=2.5, lw=1, label="mean error")
                ax.plot(xs, top, "s-", ms=2.5, lw=1, label="max error")
                ax.plot(xs, np.minimum(A[:, 3], cap), "k--", lw=1, label="largest bound")
                off = A[:, 3] > cap
                if off.any():
                    ax.plot(xs[off], np.full(int(off.sum()), cap), "k^", ms=4, label="bound off the scale")
                bad = A[:, 4] > 0
                if bad.any():
                    ymark = np.where(np.isfinite(A[:, 2]), np.minimum(A[:, 2], cap), cap)
                    ax.plot(xs[bad], ymark[bad], "x", color=FAIL_RED, ms=7, mew=2, label="over bound")
                ax.set_ylim(top=1.5 * min(cap, np.nanmax(np.r_[A[:, 3], top, 1e-300])))
            ax.set_xscale("symlog", linthresh=2.0**-8 if feature == "cond" else 1.0)
            if feature == "cond":
                ax.set_xticks([0, 1e-2, 1, 1e2, 1e4], ["0", "0.01", "1", "100", "1e4"])
            # ULPs are integers (linear up to 1); errors in units of a bound are small fractions
            ax.set_yscale("symlog", linthresh=1.0 if units == "ULP" else 1e-3)
            ax.set_ylim(bottom=0)  # errors and bounds are magnitudes
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if i == 0:
                ax.set_title(d, fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{k}\nerror ({units})", fontsize=8)
            if i == len(kernels) - 1:
                ax.set_xlabel(label, fontsize=8)
    handles, labels = [], []
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    height = 0.8 + 2.4 * len(kernels)
    if labels:  # (every output of a measured kernel may be a flush, left out above)
        fig.legend(handles, labels, loc="lower center", fontsize=7, ncol=len(labels))
    fig.suptitle(f"{family}: error against {label}\n(outputs flushed to zero where allowed are left out; "
                 "the tables count them)", fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1 - 0.4 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["heatmap", "heat_grid", "cell_value", "signed_errors", "profiles", "ratio_colour", "is_failure_colour", "FAIL_RED", "cell_text"]
