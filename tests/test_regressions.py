"""Replay every saved exact-bit fixture against its kernel, on every run.

A fixture is a shrunk counterexample Hypothesis once found. Replaying it rebuilds the input
bit for bit (padding and guard bytes included) and re-checks the property that failed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import test_attention  # noqa: F401  (registers the attention properties)
from . import test_softmax  # noqa: F401  (registers the softmax properties)
from . import test_softmax_metamorphic  # noqa: F401  (registers the metamorphic properties)
from flashcheck.kernels import DEVICE
from flashcheck.kernels.registry import REGISTRY
from flashcheck.harness import PROPERTIES, check, fixture_paths, load_fixture


def _replayable() -> list[tuple[Path, str]]:
    active = {s.name for s in REGISTRY}
    out = []
    for path in fixture_paths():
        kernel = json.loads(path.read_text())["kernel"]
        if kernel in active:
            out.append((path, kernel))
    return out


@pytest.mark.parametrize("fixture", _replayable(), ids=lambda f: f[0].name if isinstance(f, tuple) else str(f))
def test_replay_fixture(fixture: tuple[Path, str]) -> None:
    path, kernel = fixture
    payload, case = load_fixture(path, DEVICE)
    spec = next(s for s in REGISTRY if s.name == kernel)
    check(spec, payload["property"], case)


@pytest.mark.parametrize("path", fixture_paths(), ids=lambda p: p.name)
def test_fixture_is_well_formed(path: Path) -> None:
    payload, case = load_fixture(path, DEVICE)
    assert (payload["family"], payload["property"]) in PROPERTIES, f"{path.name}: unknown property"
    assert case.tensors, f"{path.name}: no tensors"
