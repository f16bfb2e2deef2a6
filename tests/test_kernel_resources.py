"""`flashcheck.reports.bench.kernel_resources` compiles the production attention kernel for sm_90 on a
machine with no GPU and reads its registers: the offline check that found the prefill regression
(reports/records/attention_bench.md)."""
from __future__ import annotations

import pytest

from flashcheck.reports.bench import kernel_resources


@pytest.mark.parametrize("case", ["attention fp16 D64", "attention decode fp16 D64 splits=4",
                                  "softmax split_stats fp16 warps=4"])
def test_a_variant_compiles_for_hopper_without_a_gpu(case: str, capsys: pytest.CaptureFixture) -> None:
    assert kernel_resources.main(["--cases", case]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"| {case} |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    warps, regs, stack, shared, ctas, fma = (int(c) for c in cells[3:4] + cells[5:9] + cells[10:11])
    assert 1 <= regs <= 255 and stack >= 0 and shared > 0 and ctas >= 1
    assert warps == (4 if "warps=4" in case else 8)
    # the chunked softmax's bits may not depend on num_warps: nothing contracted (attention: plenty)
    assert (fma == 0) if case.startswith("softmax") else (fma > 0)


def test_an_unknown_case_is_one_clear_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        kernel_resources.main(["--cases", "attention fp16 D65"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown case(s) 'attention fp16 D65'" in err and "attention fp16 D64" in err


def test_the_cluster_probe_gives_a_verdict_per_cluster_size(capsys: pytest.CaptureFixture) -> None:
    """reports/bench/cluster_probe.py backs issue 20's note that Triton 3.6 cannot reduce a row across a
    cluster: one CTA must compile (else the probe, not the cluster, is what fails), and each size
    gets one verdict line."""
    from flashcheck.reports.bench import cluster_probe

    assert cluster_probe.main(["--n", "4096", "--ctas", "1,2"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "num_ctas=" in ln]
    assert lines[0] == "num_ctas=1: compiles, 0 cluster instructions in the PTX", lines
    assert len(lines) == 2 and lines[1].startswith("num_ctas=2: "), lines
    with pytest.raises(SystemExit) as exit_:
        cluster_probe.main(["--ctas", "3"])
    assert exit_.value.code == 2
