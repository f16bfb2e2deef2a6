"""What a failure ends with: where its fixture is, how to replay it, and standalone Python that
rebuilds the exact input bits and calls the kernel (from a fixture's payload, `flashcheck.fixtures`).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from flashcheck import families
from flashcheck.fixtures import DTYPES, WORD, kernel_target
from flashcheck.kernels.registry import KernelSpec


def replay_note(path: Path, spec: KernelSpec) -> str:
    """What a failure ends with: where its fixture is, how to replay it, how to rebuild the input."""
    payload = json.loads(Path(path).read_text())
    command = ["flashcheck", "replay", str(path), *(["--kernel", kernel_target(spec)] if spec.external else [])]
    return "\n".join([
        f"flashcheck fixture: {path}",
        f"replay: {shlex.join(command)}",  # pasted into a shell: a path with spaces stays one argument
        "repro (rebuilds the exact input bits):",
        repro_snippet(payload, path, spec),
    ])


_SNIPPET_WORDS = 512


def repro_snippet(payload: dict[str, Any], path: Path | str, spec: KernelSpec) -> str:
    """Standalone Python that rebuilds the fixture's inputs bit for bit and calls the kernel as the
    family's properties do (`kernel_call`: which tensors go by position, which by keyword)."""
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
    names = list(payload["tensors"])
    call = families.get(payload["family"]).module("properties").kernel_call
    entry, positional, keywords, constant = call(spec, names)
    own = [n for n in names if n not in positional and n not in keywords]
    if own:
        lines.append(f"    # {', '.join(own)}: the property's own input, not passed to the kernel (the property "
                     "builds its further calls from it)")
    args = [*positional, *(f"{n}={n}" for n in keywords),
            *(f"{k}={_kwarg_repr(v)}" for k, v in {**payload["kwargs"], **constant}.items())]
    name = payload["kernel"].rsplit(".", 1)[-1] + ("_varlen" if entry == "varlen_fn" else "")
    what = f"the kernel's varlen_fn ({payload.get('target') or payload['kernel']})" if entry == "varlen_fn" else \
        f"the kernel: {payload.get('target') or payload['kernel']}"
    lines.append(f"    out = {name}({', '.join(args)})  # {what}")
    return "\n".join(lines)


def _kwarg_repr(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return f"torch.{v['dtype']}"
    return repr(v)
