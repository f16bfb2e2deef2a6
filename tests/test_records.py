"""The records under reports/records/ (reports/quality/records.py): each opens with its header and stays short, and
the index reports/records/README.md says for each whether it was measured at today's kernels, recomputed
here from git, so neither a record nor the index can claim numbers it does not have."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flashcheck import HOME
from flashcheck.reports.quality import records

pytestmark = pytest.mark.skipif(not (HOME / ".git").exists(), reason="needs the git checkout (an installed copy has no history)")


def test_every_record_has_its_header_and_at_most_200_lines() -> None:
    assert records.records(), "no record found under reports/records/"
    assert records.problems() == []


def test_the_index_is_todays(capsys: pytest.CaptureFixture) -> None:
    """reports/records/README.md is `python -m flashcheck.reports.quality.records --write` at HEAD's kernels: a kernel
    change committed without regenerating it fails here (its records would still say current)."""
    assert records.INDEX.read_text() == records.index(), "run: python -m flashcheck.reports.quality.records --write"
    assert records.main(["--check"]) == 0, capsys.readouterr().err


def test_the_status_column_is_the_digests_compared() -> None:
    """Recomputed apart from index(): git's kernels/*.py at HEAD, hashed as gpu_lane hashes a lane's."""
    names = subprocess.run(["git", "ls-tree", "--name-only", "HEAD", "kernels/"], cwd=HOME, capture_output=True,
                           text=True, check=True).stdout.split()
    files = [(Path(n).name, subprocess.run(["git", "show", f"HEAD:{n}"], cwd=HOME, capture_output=True,
                                           check=True).stdout) for n in names if n.endswith(".py")]
    head = records._digest(files)
    rows = {ln.split("](")[0].lstrip("| ["): ln.split(" | ")[3] for ln in records.INDEX.read_text().splitlines()
            if ln.startswith("| [")}
    assert set(rows) == {records._name(p) for p in records.records()}
    for p in records.records():
        ds = records.digests(records.read_header(p.read_text()))
        want = "current" if all(d == head for d in ds) else "stale"
        assert rows[records._name(p)].split(" ")[0] == want, p.name


def test_a_record_without_header_or_too_long_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "RECORDS", tmp_path)
    monkeypatch.setattr(records, "INDEX", tmp_path / "README.md")
    head = records.header("R", what="w", device="d", date="2026-01-01", commit="abc1234", digest=f"`{'a' * 16}`",
                          command="cmd")
    (tmp_path / "ok.md").write_text("\n".join(head) + "\nbody\n")
    (tmp_path / "diary.md").write_text("# Session of 2026-11-28 (seventeenth)\n\nX1 ran.\n")
    (tmp_path / "long.md").write_text("\n".join(head) + "\n" + "row\n" * 200)
    bad = records.problems()
    assert any(b.startswith("diary.md: header lacks what, device") for b in bad), bad
    assert any(b.startswith("long.md: 2") and "at most 200" in b for b in bad), bad
    assert not any(b.startswith("ok.md") for b in bad), bad
    index = records.index("b" * 16)
    assert "| [ok.md](ok.md) | w | `aaaaaaaaaaaaaaaa` | stale |" in index, index
    assert "| [ok.md](ok.md) | w | `aaaaaaaaaaaaaaaa` | current |" in records.index("a" * 16)
    mixed = {"kernels digest": f"`{'a' * 16}` (main); `{'b' * 16}` (gqa, decode)"}
    assert records.status(mixed, "a" * 16) == "stale (current: main)"
