"""`--quick-first N`: every Hypothesis test of the run first with N examples, all of them before any
test runs with its profile's full count (a pytest plugin, loaded by the suite's conftest).

Why: with `-x`, the time to catch a broken kernel is the time spent in the tests that run before the
one that catches it. In the gpu profile each test draws 120 examples and a new block width compiles
the kernel again, so a bug that the 15th test shows waits for 14 full tests. Measured on one H200
(`reports/gpu_run.md`, kill matrix in the gpu profile): bugs the first test shows were caught in
2-6 s, the others after 34-78 s or more. In the ci profile (12 examples a test) the CPU catches all
but one zoo kernel within 10 s. A quick pass of N examples per test (the ci count, say) reaches every
test early; the full pass then runs every test with the profile's count, unchanged. In the gpu
profile on a 2-core CPU, the softmax zoo's catches went from a median 4.5 s (worst 203 s) to 1.0 s
(worst 18.7 s) with N = 12; on one H200 (kill matrix, gpu profile, 6 zoo kernels at a time) the
median catch went from 34-37 s to 3.3-4.4 s (softmax zoo) and from more than 60 s (7 of 14 caught
within 100 s) to 6.7-16.1 s (attention zoo).

The quick copy of a test is a second item, `test_name_quick[params]`, with the same parameters and
markers; it runs with `max_examples=N` and otherwise the same settings.
Nothing changes when N is 0 or when the profile draws at most N examples a test; a test whose own
`@settings` draw at most N gets no quick copy. Without the option, the tier decides
(`profiles.QUICK_FIRST`: 12 in the gpu tier, where a GPU measured the gain, off elsewhere).
The full pass draws the same examples as without the option; the quick pass adds at most
N/max_examples to the examples run (some of them may be the full pass's own first examples).
"""
from __future__ import annotations

import pytest

QUICK = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("flashcheck").addoption(
        "--quick-first", dest="flashcheck_quick_first", type=int, default=None, metavar="N",
        help="run every Hypothesis test first with N examples, all before any runs with the profile's "
             "count (faster first failure with -x; 0: off; default: 12 in the gpu tier, else 0)")


def _profile_examples() -> int:
    from hypothesis import settings

    return settings.default.max_examples


def _draws_more(item: pytest.Item, n: int) -> bool:
    """A Hypothesis test whose own settings (the profile's, or its `@settings`) draw more than n."""
    if not (isinstance(item, pytest.Function) and getattr(item.obj, "is_hypothesis_test", False)):
        return False
    own = getattr(item.obj, "_hypothesis_internal_use_settings", None)
    return own is None or own.max_examples > n


QUICK_SUFFIX = "_quick"


def quick_name(originalname: str) -> str:
    return originalname + QUICK_SUFFIX


def selectable_nodeid(nodeid: str) -> str:
    """The node id pytest can be given to run `nodeid`: a quick copy exists only after collection
    (a node id naming it selects nothing, pytest's exit 4), so it maps to the test it copies, whose
    run makes the copy again wherever the quick pass is on."""
    head, sep, last = nodeid.rpartition("::")
    name, bracket, params = last.partition("[")
    if sep and name.endswith(QUICK_SUFFIX):
        return f"{head}{sep}{name.removesuffix(QUICK_SUFFIX)}{bracket}{params}"
    return nodeid


def _quick_copy(item: pytest.Function, n: int) -> pytest.Function:
    # The node id is the function's name and the parameters' id (pytest 9 builds it from
    # `originalname` and the callspec, older pytest from `name`): both name the quick copy.
    callspec = getattr(item, "callspec", None)
    base = quick_name(item.originalname)
    copy = pytest.Function.from_parent(
        item.parent, name=base + item.name[len(item.originalname):], callspec=callspec,
        callobj=item.obj, fixtureinfo=item._fixtureinfo, originalname=base, keywords={"quick": True})
    for mark in item.own_markers:  # markers added after collection (tiers: gpu_only, skips)
        if mark not in copy.own_markers:
            copy.own_markers.append(mark)
            copy.keywords[mark.name] = mark
    copy.stash[QUICK] = n
    return copy


@pytest.hookimpl(trylast=True)  # after deselection (-k, -m) and any reordering (--order-from)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    n = config.getoption("flashcheck_quick_first", None)
    if n is None:
        from flashcheck.plugin import profiles
        from flashcheck.plugin.tiers import active_profile

        n = profiles.default_quick_first(active_profile(config))
    if n < 0:
        raise pytest.UsageError(f"--quick-first {n}: must be 0 (off) or a number of examples")
    if n == 0 or _profile_examples() <= n:
        return
    quick = [_quick_copy(i, n) for i in items if _draws_more(i, n)]
    items[:] = quick + items


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    n = item.stash.get(QUICK, 0)
    if not n:
        yield
        return
    from hypothesis import settings

    fn = item.obj
    before = fn._hypothesis_internal_use_settings  # read by Hypothesis at each call of the test
    fn._hypothesis_internal_use_settings = settings(before, max_examples=n)
    try:
        yield
    finally:
        fn._hypothesis_internal_use_settings = before
