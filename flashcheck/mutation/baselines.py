"""Baseline verdicts of the unmutated code, kept beside a mutant store (`<store>_baselines.json`):
a test (or the sanitizer's cases) decides a mutant only where it passes unmutated."""
from __future__ import annotations

import functools
import hashlib
import json
import threading
from pathlib import Path

from flashcheck import HOME, atomic

_LOCK = threading.Lock()
#: Where baseline verdicts persist (`<store>_baselines.json`, set by `run`), keyed by the unmutated
#: module's source hash and the test: a compiled baseline costs minutes, and a device session's
#: calls each start a fresh process.
BASELINE_FILE: Path | None = None


@functools.lru_cache(maxsize=None)
def _code_digest(test_file: str) -> str:
    """sha256 over what a test's verdict depends on: kernels/, oracles/, strategies/, the engine
    (flashcheck/, not the mutation tool or the suite), the suite's conftest and the test's own file. A saved
    baseline holds only for that code."""
    h = hashlib.sha256()
    files = [p for top in ("kernels", "oracles", "strategies") for p in sorted((HOME / top).rglob("*.py"))]
    engine = HOME / "flashcheck"
    files += sorted(p for p in engine.rglob("*.py") if p.relative_to(engine).parts[0] not in ("mutation", "suite"))
    files += [engine / "suite" / "conftest.py", HOME / test_file]
    for p in files:
        if p.is_file():
            h.update(str(p.relative_to(HOME)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _baseline_key(module: str, nodeid: str) -> str:
    return f"{_code_digest(nodeid.split('::')[0])}:{module}:{nodeid}"


def baselines_file(store: Path) -> Path:
    return store.with_name(store.stem + "_baselines.json")


def _saved_baseline(module: str, nodeid: str) -> tuple[str | None, float] | None:
    if BASELINE_FILE is None or not BASELINE_FILE.exists():
        return None
    got = json.loads(BASELINE_FILE.read_text()).get(_baseline_key(module, nodeid))
    return (got["why"], got["wall"]) if got else None


def _save_baseline(module: str, nodeid: str, why: str | None, wall: float) -> None:
    if BASELINE_FILE is None:
        return
    with _LOCK:
        saved = json.loads(BASELINE_FILE.read_text()) if BASELINE_FILE.exists() else {}
        saved[_baseline_key(module, nodeid)] = {"why": why, "wall": wall}
        atomic.write_text(BASELINE_FILE, json.dumps(saved, indent=1))
