"""Which side is closer to the truth where flashcheck's softmax and torch.softmax disagree on long rows.

The throughput bench (`bench/softmax.py`) saw its fp32 1 x 2^26 outputs differ from torch's by up to
2.4e-6. This measures both against a float64 softmax of the same input (`torch.softmax` in double on
the GPU: its relative error, at most about n 2^-53 = 7.5e-9 for n = 2^26, is 0.12 fp32 ULP, far below
what it has to tell apart) and against flashcheck's own derived bound (`oracles.bounds`, the split
kernel's summation depth), in ULPs of the output format at the float64 value.

    python -m flashcheck.reports.bench.softmax_accuracy [--out reports/records/softmax_bench.md]

writes the `accuracy` section of the softmax bench report (the throughput table is another section).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from flashcheck import kernels  # noqa: F401  (first: the interpreter switch)
from flashcheck.kernels._runtime import DEVICE
from flashcheck.kernels.registry import get as get_spec
from flashcheck.kernels.softmax import choose_variant, sm_count, softmax
from flashcheck.oracles.bounds import softmax_ulp_bound
from flashcheck.oracles.formats import format_of, ulp_of

from flashcheck.reports import RECORDS

from .common import command_line, no_gpu, run_info, write_sections
from .softmax import HEAD

PROG = "python -m flashcheck.reports.bench.softmax_accuracy"
OUT = RECORDS / "softmax_bench.md"
#: (dtype, M, N): the bench's long rows, the same input (seed 0, randn x 4)
CASES = ((torch.float32, 1, 2**26), (torch.float32, 64, 2**20), (torch.float32, 1024, 2**16),
         (torch.float16, 1, 2**26), (torch.bfloat16, 1, 2**26))


def _errors(y: torch.Tensor, ref: np.ndarray, ulp: np.ndarray) -> tuple[dict, np.ndarray]:
    """Worst ULP distance to the float64 value (`ulp`: the spacing there), its index, the largest
    absolute error and |sum - 1|; and every element's ULP distance."""
    a = y.double().cpu().numpy()
    err = np.abs(a - ref)
    ulps = err / ulp
    i = int(np.argmax(ulps))
    return ({"ulps": float(ulps.flat[i]), "at": np.unravel_index(i, ref.shape), "abs": float(err.max()),
             "sum": float(np.abs(a.sum(axis=-1) - 1.0).max())}, ulps)


def measure(dtype: torch.dtype, m: int, n: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(m, n, device=DEVICE, dtype=dtype) * 4
    xs = x.double()
    ref = torch.softmax(xs, -1).cpu().numpy()
    fmt = format_of(dtype)
    ulp = ulp_of(ref, fmt)
    (ours, _), (theirs, torch_ulps) = _errors(softmax(x), ref, ulp), _errors(torch.softmax(x, -1), ref, ulp)
    variant = choose_variant(m, n, dtype, sm_count(x.device))
    spec = get_spec(f"softmax_{variant}")
    bound = softmax_ulp_bound(xs.cpu().numpy(), ref, fmt, depth=spec.summation_depth(n))
    return {"dtype": fmt.name, "M": m, "N": n, "variant": variant, "ours": ours, "torch": theirs,
            "bound_at_worst": float(bound[ours["at"]]), "bound_max": float(bound.max()),
            "torch_over_bound": int((torch_ulps > bound).sum())}


def to_markdown(rows: list[dict], command: str) -> str:
    lines = ["## Accuracy of the long rows: flashcheck against torch.softmax", "",
             f"{run_info(command)}. Each output against a float64 softmax of the same input (seed 0, "
             "randn x 4, as the throughput table): the worst distance in ULPs of the output format at "
             "the float64 value, the largest |sum of the row - 1|, and flashcheck's derived bound "
             "(`oracles/bounds.py`, the dispatched kernel's summation depth) at our worst element; "
             "`torch > bound`: how many of torch's outputs lie outside the bound ours is held to.", "",
             "| dtype | M x N | ours | ours: worst ULPs | bound there | ours: max abs | ours: sum-1 "
             "| torch: worst ULPs | torch: max abs | torch: sum-1 | torch > bound |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        o, t = r["ours"], r["torch"]
        lines.append(f"| {r['dtype']} | {r['M']}x{r['N']} | {r['variant']} | {o['ulps']:.2f} | {r['bound_at_worst']:.0f} "
                     f"| {o['abs']:.3g} | {o['sum']:.3g} | {t['ulps']:.2f} | {t['abs']:.3g} | {t['sum']:.3g} "
                     f"| {r['torch_over_bound']} |")
    outside = [r for r in rows if r["torch_over_bound"]]
    if outside:
        lines += ["", "Rows where torch's outputs fall outside the bound ours is held to (the disagreements of the "
                  "throughput table):"]
    for r in outside:
        o, t = r["ours"], r["torch"]
        lines.append(f"- {r['dtype']} {r['M']}x{r['N']}: torch's outputs sum to 1 within {t['sum']:.3g} (ours "
                     f"{o['sum']:.3g}); {r['torch_over_bound']} of its {r['M'] * r['N']} outputs lie outside the bound, "
                     f"the worst {t['ulps']:.0f} ULPs from the float64 value; ours stay within {o['ulps']:.0f} ULPs "
                     f"(bound {r['bound_max']:.0f} at most). A row-wide error of the sum scales every output alike.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="Markdown file; only its `accuracy` section is rewritten")
    args = ap.parse_args(argv)
    if no_gpu("softmax_accuracy"):
        return 2
    rows = []
    for dtype, m, n in CASES:
        rows.append(measure(dtype, m, n))
        print(rows[-1], flush=True)
    write_sections(args.out, {"accuracy": to_markdown(rows, command_line(PROG, argv))},
                   HEAD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
