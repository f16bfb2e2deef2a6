"""Bring the public kernels that sources.json pins into tests/public_kernels/_vendor/, unchanged, and
check each against its sha256 (the files stay out of git: their licenses travel with them).

    python tests/public_kernels/fetch.py
"""
from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    bad = 0
    for f in json.loads((HERE / "sources.json").read_text())["files"]:
        dest = HERE / "_vendor" / f["local"]
        if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == f["sha256"]:
            continue
        url = f"https://raw.githubusercontent.com/{f['repo']}/{f['commit']}/{f['path']}"
        data = urllib.request.urlopen(url, timeout=60).read()
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            print(f"{url}: sha256 differs from the pin", file=sys.stderr)
            bad += 1
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        print(f"{dest.relative_to(HERE)} <- {url}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
