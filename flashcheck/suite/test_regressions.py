"""Replay the saved exact-bit fixtures of the kernels under test, on every run.

A fixture is a shrunk counterexample Hypothesis once found. Replaying it rebuilds the input bit
for bit (padding and guard bytes included) and re-checks the property that failed. A fixture is
data: it is replayed against the kernel under test whose identity it records (fixtures of other
kernels in the folder are not collected), never against anything it names. A bad fixture fails
its own test, labelled "bad fixture", and only it.
"""
from __future__ import annotations

import pytest

from flashcheck import families

from flashcheck.isolation import journal as isolation
from flashcheck.isolation.journal import BAD_FIXTURE
from flashcheck.fixtures.store import FixtureError, Replay, case_of, fixture_paths, plan_replays, replay_dirs
from flashcheck.properties.runner import check
from flashcheck.kernels import DEVICE


def _plan(config: pytest.Config) -> list[Replay]:
    from flashcheck.kernels.registry import REGISTRY

    family = config.getoption("flashcheck_family", None)
    specs = [s for s in REGISTRY if not family or s.family == family]
    seen, paths = set(), []
    for d in replay_dirs(specs):
        for p in fixture_paths(d):
            if p.resolve() not in seen:
                seen.add(p.resolve())
                paths.append(p)
    names = {s.name for s in specs}
    # Another kernel's fixture is not collected; a format-1 one that only names this kernel's stem
    # is shown as a skip saying how to replay it.
    return [r for r in plan_replays(paths, specs)
            if r.status != "skip" or (r.payload and r.payload.get("kernel") in names and "format-1" in r.reason)]


def _bad(request: pytest.FixtureRequest, reason: str) -> None:
    """A bad fixture fails its own test, marked as bad input: `flashcheck check` then exits 2 (as
    `replay` does), not 1, when nothing else failed."""
    request.node.user_properties.append((BAD_FIXTURE, reason))
    pytest.fail(reason, pytrace=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.name == "test_replay_fixture":
        plan = _plan(metafunc.config)
        metafunc.parametrize("fixture", plan, ids=[r.path.name for r in plan])


def test_replay_fixture(fixture: Replay, request: pytest.FixtureRequest) -> None:
    if fixture.status == "bad":
        _bad(request, fixture.reason)
    if fixture.status == "skip":
        pytest.skip(fixture.reason)
    try:
        case = case_of(fixture.payload, DEVICE, fixture.path)
    except FixtureError as e:
        _bad(request, str(e))
    # a fixture recorded before a declaration narrowed the kernel
    if families.get(fixture.spec.family).hook("fit_to_declarations")(fixture.spec, case) is None:
        pytest.skip(f"{fixture.path.name}: its input needs what {fixture.spec.name} does not declare ({case!r})")
    isolation.note_fixture(fixture.path)  # a crash here is this fixture's (no second fixture of it)
    check(fixture.spec, fixture.payload["property"], case)
