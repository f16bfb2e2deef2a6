"""The stability report's numbers as text and its tables: per kernel, dtype and class, and two
kernels side by side (reports/stability/cli.py builds the document around them)."""
from __future__ import annotations

import math
from typing import Any

from .document import Table


# ---- numbers as text -----------------------------------------------------------------------------

def _g(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v == 0:
            return "0"
        return f"{v:.{digits}g}"
    return str(v)


def _pct(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if v < 0.001:
        return "<0.1%"
    if v < 1 and v > 0.999:
        return ">99.9%"
    return f"{100 * v:.1f}%"


def _signed(s: dict[str, Any]) -> str:
    if s["mean"] is None:
        return "-"
    if s["lo"] is None:
        return f"{s['mean']:+.2g} (1 row)"
    return f"{s['mean']:+.2g} [{s['lo']:+.2g}, {s['hi']:+.2g}]"


def _biased(s: dict[str, Any]) -> bool:
    from ._stats import biased

    return biased(s)


# ---- tables --------------------------------------------------------------------------------------

def _baseline_ratio(r: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Our max error over each baseline's on the same inputs (< 1: more accurate than it)."""
    parts = []
    for b in rows:
        if not b["baseline"] or (b["family"], b["dtype"], b["strategy"]) != (r["family"], r["dtype"], r["strategy"]):
            continue
        if not b["outputs"]:
            parts.append(f"{b['kernel']} n/a")
            continue
        ours, theirs = r["max_err"], b["max_err"]
        if ours == 0 and theirs == 0:
            txt = "both exact"
        elif theirs == 0 or math.isinf(ours):
            txt = "inf"
        else:
            txt = _g(ours / theirs, 2)
        parts.append(f"{b['kernel']} {txt}")
    return "; ".join(parts) or "-"


def class_table(kernel: str, rows: list[dict[str, Any]], units: str) -> Table:
    mine = [r for r in rows if r["kernel"] == kernel]
    header = ["dtype", "class", "verdict", "outputs", "correctly rounded", "1 ULP off", "over bound",
              "NaN/inf mismatch", "flushed", f"max err ({units})", "max err/bound (bound > 1 ULP)",
              f"signed err ({units}): mean [95% CI]", "signed rel. err: mean [95% CI]"]
    base = not mine or not mine[0]["baseline"]
    if base:
        header.append("max err / baseline's")
    out, cls = [], []
    for r in mine:
        status = "FAIL" if r["status"] == "FAIL" else ("-" if not r["outputs"] else "PASS")
        if r["baseline"] and status != "-":  # baselines are measured, not judged
            status = "over bound" if status == "FAIL" else "within bound"
        note = ""
        if r["errors"]:
            how = "hung" if r.get("hung") else ("crashed" if r.get("crashed") else "raised")
            note = f" ({how}: {r['errors'][0][:80]})"
        elif r.get("not_run") and not r["outputs"]:
            note = " (not run: the kernel crashed or hung too often)"
        elif r["skipped"] and not r["outputs"]:
            note = " (not taken)"
        row = [r["dtype"], r["strategy"], status + note, str(r["outputs"]), _pct(r["exact_share"]),
               _pct(r["one_ulp_share"]), f"{r['violations']}" + (f" ({_pct(r['beyond_share'])})" if r["violations"] else ""),
               str(r["mismatch"]), str(r["ftz"]), _g(r["max_err"]), _g(r["max_bound_ratio_wide"]),
               _signed(r["signed_ulp"]), _signed(r["signed_rel"])]
        c = ["", "", "fail" if status == "FAIL" else ("pass" if status == "PASS" else ""), "", "", "",
             "fail" if r["violations"] else "", "fail" if r["mismatch"] else "", "", "", "",
             "bias" if _biased(r["signed_ulp"]) else "", "bias" if _biased(r["signed_rel"]) else ""]
        if base:
            row.append(_baseline_ratio(r, rows))
            c.append("")
        out.append(row)
        cls.append(c)
    return Table(header, out, cls)


def compare_table(a: str, b: str, rows: list[dict[str, Any]], units: str) -> Table:
    """Two kernels side by side on the same inputs, per dtype and class."""
    by = {(r["kernel"], r["dtype"], r["strategy"]): r for r in rows}
    keys = list(dict.fromkeys((r["dtype"], r["strategy"]) for r in rows if r["kernel"] in (a, b)))
    header = ["dtype", "class"]
    for k in (a, b):
        header += [f"{k}: verdict", f"{k}: max err ({units})", f"{k}: max err/bound", f"{k}: signed err mean [CI]"]
    header.append(f"max err {b} / {a}")
    out, cls = [], []
    for d, c in keys:
        row, cl = [d, c], ["", ""]
        pair = [by.get((k, d, c)) for k in (a, b)]
        for r in pair:
            if r is None:
                row += ["-"] * 4
                cl += [""] * 4
                continue
            st = r["status"] if r["outputs"] or r["errors"] else "-"
            row += [st, _g(r["max_err"]), _g(r["max_bound_ratio"]), _signed(r["signed_ulp"])]
            cl += ["fail" if st == "FAIL" else ("pass" if st == "PASS" else ""), "", "", ""]
        ra, rb = pair
        if ra and rb and ra["outputs"] and rb["outputs"]:
            x, y = ra["max_err"], rb["max_err"]
            row.append("both exact" if x == y == 0 else ("inf" if x == 0 or math.isinf(y) else _g(y / x, 2)))
        else:
            row.append("-")
        cl.append("")
        out.append(row)
        cls.append(cl)
    return Table(header, out, cls)


__all__ = ["class_table", "compare_table"]
