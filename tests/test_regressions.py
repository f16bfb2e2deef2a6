"""Replay every saved exact-bit fixture against its kernel, on every run.

A fixture is a shrunk counterexample Hypothesis once found. Replaying it rebuilds the input
bit for bit (padding and guard bytes included) and re-checks the property that failed. A fixture
that cannot be read, or that names a kernel nobody can find, fails its own test (and only it).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from flashcheck.harness import PROPERTIES, check, fixture_paths, load_fixture, load_properties, resolve_fixture_kernel
from flashcheck.kernels import DEVICE


@pytest.mark.parametrize("fixture", fixture_paths(), ids=lambda p: p.name)
def test_replay_fixture(fixture: Path, request: pytest.FixtureRequest) -> None:
    load_properties()
    payload, case = load_fixture(fixture, DEVICE)
    family = request.config.getoption("flashcheck_family")
    if family and payload["family"] != family:
        pytest.skip(f"{fixture.name} is a {payload['family']} fixture; this run checks {family}")
    assert (payload["family"], payload["property"]) in PROPERTIES, \
        f"{fixture}: unknown {payload['family']} property {payload['property']!r}"
    spec = resolve_fixture_kernel(payload, fixture)
    check(spec, payload["property"], case)
