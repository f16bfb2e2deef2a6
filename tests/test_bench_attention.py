"""The attention benchmarks (reports/bench/attention*.py, issue 20.3; reports/bench/attention_ceiling.py)
without timing anything: `--help` works and a machine without a GPU gets exit 2 and one line; the
Markdown writer rewrites only the sections a run measured, so a feature run keeps the main table
(and its notes) intact."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashcheck.reports.bench import attention as bench_attention, attention_ceiling
from flashcheck.reports.bench import attention_features as bench_attention_features
from flashcheck.reports.bench.attention import command_line, write_sections


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
    text = bench_attention.OUT.read_text()
    committed = text[:text.index("<!-- /bench:main -->")] + "<!-- /bench:main -->\n"  # the main table alone
    f = tmp_path / "bench.md"
    f.write_text(committed)
    write_sections(f, {"gqa": "## GQA\nv1\n", "decode": "## Decode\n"})
    write_sections(f, {"gqa": "## GQA\nv2\n"})
    text = f.read_text()
    assert text.startswith(committed) and text.count("<!-- bench:gqa -->") == 1 and "v1" not in text
    assert text.index("## GQA\nv2") < text.index("## Decode")
    write_sections(f, {"main": "# new main\n"})
    head = committed[:committed.index("<!-- bench:main -->")]  # the record's header stays as it was
    assert f.read_text().startswith(head + "<!-- bench:main -->\n# new main\n<!-- /bench:main -->\n\n<!-- bench:gqa -->")
    # a file written before the markers is taken whole as the main section
    old = tmp_path / "old.md"
    old.write_text("# table\nnotes\n")
    write_sections(old, {"varlen": "## Varlen\n"})
    assert old.read_text() == ("<!-- bench:main -->\n# table\nnotes\n<!-- /bench:main -->\n\n"
                               "<!-- bench:varlen -->\n## Varlen\n<!-- /bench:varlen -->\n")


def test_the_header_is_rebuilt_from_the_sections_stamps(tmp_path: Path) -> None:
    """With a head, the text above the first marker becomes the record's header (reports/quality/records.py):
    a section measured at other kernels shows as its own digest, so a partial re-run cannot pass
    the whole record off as current."""
    from flashcheck.reports.quality.records import read_header

    def section(commit: str, digest: str) -> str:
        return f"## T\n\nNVIDIA H200, 2026-11-2{commit[-1]}; torch 2.11, triton 3.6.0; commit {commit}, kernels `{digest}`; `cmd`.\n"
    f = tmp_path / "bench.md"
    f.write_text("# old notebook\n\nsession one\n")
    write_sections(f, {"main": section("aaaaaa1", "1" * 16)}, ("Title", "what", "the command"))
    write_sections(f, {"gqa": section("bbbbbb2", "2" * 16)}, ("Title", "what", "the command"))
    text = f.read_text()
    h = read_header(text)
    assert text.startswith("# Title\n") and "session one" not in text.split("<!-- bench:main -->")[0]
    assert h["kernels digest"] == f"`{'1' * 16}` (main); `{'2' * 16}` (gqa)", h
    assert h["commit"] == "aaaaaa1 (main); bbbbbb2 (gqa)" and h["date"] == "2026-11-21 to 2026-11-22", h
    assert h["command"] == "`the command`" and h["device"] == "NVIDIA H200, torch 2.11, triton 3.6.0", h


def test_the_reproducing_command_leaves_out_the_output_file() -> None:
    assert command_line("prog", ["--quick", "--out", "/tmp/x.md", "--budget", "5", "--out=y"]) == \
        "prog --quick --budget 5"


def test_decode_table_sets_ours_against_the_fastest_captured_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode table's GPU-alone columns: the fastest SDPA backend from a CUDA graph, named, and
    its time over ours-auto's; '-' where no backend was captured (an older run's rows)."""
    f = bench_attention_features
    monkeypatch.setattr(f, "run_info", lambda command: f"a GPU; `{command}`")  # no device to name here
    row = {"dtype": "float16", "n": 1024, "hq": 32, "hkv": 8, "bytes": 16 << 20, "copy_ms": 0.0135,
           "auto_splits": 4, "ours_ms": {"auto": 0.03, **{s: 0.03 + s * 1e-3 for s in f.SPLITS}},
           "sdpa_ms": {"flash": 0.05, "cudnn": 0.02, "efficient": None}, "max_diff": 1e-4,
           "auto_graph_us": 9.0, "sdpa_graph_us": {"flash": 12.0, "cudnn": 8.1}}
    old = {k: v for k, v in row.items() if k != "sdpa_graph_us"}
    lines = [ln for ln in f.md_decode([row, old], "cmd", 0).splitlines() if ln.startswith("| float16")]
    head = next(ln for ln in f.md_decode([row], "cmd", 0).splitlines() if ln.startswith("| dtype"))
    cells = [[c.strip() for c in ln.split("|")[1:-1]] for ln in lines]
    names = [c.strip() for c in head.split("|")[1:-1]]
    got = [dict(zip(names, c)) for c in cells]
    assert all(len(c) == len(names) for c in cells)
    assert got[0]["best SDPA GPU"] == "8.1 (cudnn)" and got[0]["GPU: best SDPA / auto"] == "0.90x"
    assert got[1]["best SDPA GPU"] == "-" and got[1]["GPU: best SDPA / auto"] == "-"
