"""The attention benchmarks (reports/bench_attention*.py, issue 20.3; reports/attention_ceiling.py)
without timing anything: `--help` works and a machine without a GPU gets exit 2 and one line; the
Markdown writer rewrites only the sections a run measured, so a feature run keeps the main table
(and its notes) intact."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashcheck.reports import attention_ceiling, bench_attention, bench_attention_features
from flashcheck.reports.bench_attention import command_line, write_sections


@pytest.mark.parametrize("mod", [bench_attention, bench_attention_features, attention_ceiling],
                         ids=lambda m: m.__name__.rsplit(".")[-1])
def test_help_and_no_gpu_is_exit_2_with_one_line(mod, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0 and "--quick" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mod.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "needs a GPU" in err


def test_sections_replace_only_their_own(tmp_path: Path) -> None:
    text = (Path(bench_attention.__file__).parent / "attention_bench.md").read_text()
    committed = text[:text.index("<!-- /bench:main -->")] + "<!-- /bench:main -->\n"  # the main table alone
    f = tmp_path / "bench.md"
    f.write_text(committed)
    write_sections(f, {"gqa": "## GQA\nv1\n", "decode": "## Decode\n"})
    write_sections(f, {"gqa": "## GQA\nv2\n"})
    text = f.read_text()
    assert text.startswith(committed) and text.count("<!-- bench:gqa -->") == 1 and "v1" not in text
    assert text.index("## GQA\nv2") < text.index("## Decode")
    write_sections(f, {"main": "# new main\n"})
    assert f.read_text().startswith("<!-- bench:main -->\n# new main\n<!-- /bench:main -->\n\n<!-- bench:gqa -->")
    # a file written before the markers is taken whole as the main section
    old = tmp_path / "old.md"
    old.write_text("# table\nnotes\n")
    write_sections(old, {"varlen": "## Varlen\n"})
    assert old.read_text() == ("<!-- bench:main -->\n# table\nnotes\n<!-- /bench:main -->\n\n"
                               "<!-- bench:varlen -->\n## Varlen\n<!-- /bench:varlen -->\n")


def test_the_reproducing_command_leaves_out_the_output_file() -> None:
    assert command_line("prog", ["--quick", "--out", "/tmp/x.md", "--budget", "5", "--out=y"]) == \
        "prog --quick --budget 5"
