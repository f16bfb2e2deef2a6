"""What a failure ends with: where its fixture is, how to replay it, and standalone Python that
rebuilds the exact input bits and calls the kernel (from a fixture's payload, `flashcheck.fixtures`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashcheck.fixtures import DTYPES, WORD, kernel_target
from flashcheck.kernels.registry import KernelSpec


def replay_note(path: Path, spec: KernelSpec) -> str:
    """What a failure ends with: where its fixture is, how to replay it, how to rebuild the input."""
    payload = json.loads(Path(path).read_text())
    return "\n".join([
        f"flashcheck fixture: {path}",
        f"replay: flashcheck replay {path}" + (f" --kernel {kernel_target(spec)}" if spec.external else ""),
        "repro (rebuilds the exact input bits):",
        repro_snippet(payload, path),
    ])


_SNIPPET_WORDS = 512


def repro_snippet(payload: dict[str, Any], path: Path | str) -> str:
    """Standalone Python that rebuilds the fixture's inputs bit for bit and calls the kernel."""
    lines = ["    import numpy as np, torch"]
    small = all(t["storage_words"] <= _SNIPPET_WORDS for t in payload["tensors"].values())
    if small:
        for name, t in payload["tensors"].items():
            words = [int(w, 16) for line in t["bits"] for w in line.split()]
            width = WORD[DTYPES[t["dtype"]].itemsize]
            lines.append(f"    {name} = torch.from_numpy(np.array({words}, dtype=np.{width.__name__})"
                         f".view(np.int{8 * DTYPES[t['dtype']].itemsize}).copy())"
                         f".view(torch.{t['dtype']}).as_strided({tuple(t['shape'])}, {tuple(t['stride'])}, "
                         f"{t['storage_offset']})")
    else:
        lines.append("    from flashcheck.fixtures import load_fixture")
        lines.append(f"    _, case = load_fixture({str(path)!r}, torch.device('cpu'))")
        for name in payload["tensors"]:
            lines.append(f"    {name} = case.tensors[{name!r}]")
    lines.append("    # on a GPU: build the storage there (torch.from_numpy(...).cuda()) before .view/.as_strided")
    kwargs = ", ".join(f"{k}={_kwarg_repr(v)}" for k, v in payload["kwargs"].items())
    args = ", ".join(payload["tensors"])
    lines.append(f"    out = {payload['kernel'].rsplit('.', 1)[-1]}({args}{', ' + kwargs if kwargs else ''})"
                 f"  # the kernel: {payload.get('target') or payload['kernel']}")
    return "\n".join(lines)


def _kwarg_repr(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return f"torch.{v['dtype']}"
    return repr(v)
