"""Where the fetched public kernels live (tests/public_kernels/_vendor/, not committed: SOURCES.md
pins each file's repository, path, commit and sha256; `python tests/public_kernels/fetch.py` brings them)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "_vendor"
MANIFEST = HERE / "sources.json"


def require(*names: str) -> Path:
    """The vendor folder on sys.path, after checking each named file against the manifest."""
    pins = {f["local"]: f for f in json.loads(MANIFEST.read_text())["files"]}
    for name in names:
        path = VENDOR / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing: run `python {HERE / 'fetch.py'}` (it pins {pins[name]['repo']}@{pins[name]['commit'][:12]})")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != pins[name]["sha256"]:
            raise RuntimeError(f"{path} is not the pinned file (sha256 {digest[:12]}, pinned {pins[name]['sha256'][:12]})")
    if str(VENDOR) not in sys.path:
        sys.path.insert(0, str(VENDOR))
    return VENDOR
