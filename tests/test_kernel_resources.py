"""`flashcheck.reports.kernel_resources` compiles the production attention kernel for sm_90 on a
machine with no GPU and reads its registers: the offline check that found the prefill regression
(reports/attention_bench.md)."""
from __future__ import annotations

import pytest

from flashcheck.reports import kernel_resources


def test_one_variant_compiles_for_hopper_without_a_gpu(capsys: pytest.CaptureFixture) -> None:
    assert kernel_resources.main(["--cases", "fp16 D64"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| fp16 D64 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    regs, stack, shared, ctas = (int(c) for c in cells[4:8])
    assert 1 <= regs <= 255 and stack >= 0 and shared > 0 and ctas >= 1


def test_an_unknown_case_is_one_clear_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        kernel_resources.main(["--cases", "fp16 D65"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown case(s) 'fp16 D65'" in err and "fp16 D64" in err
