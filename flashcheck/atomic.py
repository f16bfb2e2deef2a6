"""Files written whole or not at all (fixtures, the tracked kill matrix, lane records, the mutant
store): a reader, a crash or a second writer never sees half a file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all: a temporary file beside it (a dotted `.tmp-` name,
    which no reader of fixtures or reports collects), then os.replace. Readable by everyone, as
    a plain write would be (mkstemp makes it private). OSError when it cannot; nothing is left."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["write_text"]
