"""reports/bench/softmax_accuracy.py (issue 20.1, the fp32 64M disagreement) without a GPU: the same
measurement on a short row under the interpreter, and its table."""
from __future__ import annotations

import torch

from flashcheck.reports.bench import softmax_accuracy as acc


def test_measure_holds_ours_to_its_bound_and_reports_both_sides(monkeypatch) -> None:
    r = acc.measure(torch.float32, 2, 5000)
    assert r["variant"] in ("row", "online", "split")
    assert 0 <= r["ours"]["ulps"] <= r["bound_at_worst"]  # the kernel inside the bound it is tested against
    assert r["torch"]["ulps"] >= 0 and r["torch"]["sum"] >= 0
    monkeypatch.setattr(acc, "run_info", lambda command: f"device; `{command}`")  # no GPU name here
    md = acc.to_markdown([r], "cmd")
    assert "| fp32 | 2x5000 |" in md and "`cmd`" in md
