"""The suite's tiers: Hypothesis profiles, the profile a run gets by default, and each tier's
per-test timeout.

| tier  | examples | randomness     | meant for                                              |
|-------|----------|----------------|--------------------------------------------------------|
| smoke | 2        | derandomized   | a first look on a GPU: every kernel and dtype touched   |
| ci    | 12       | derandomized   | CPU CI (`CI=true` without a GPU)                        |
| dev   | 25       | random         | a developer's CPU run (default without a GPU)           |
| gpu   | 120      | derandomized   | GPU CI and the default with a GPU; a quick pass of 12 first |
| soak  | 120      | random         | hunting false alarms with `--hypothesis-seed`           |

Every tier runs every test (each is parametrized over every kernel and dtype); the tiers differ in
how many examples each Hypothesis test draws. Markers (`-m "not slow"`) narrow a run further.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, settings

PROFILES: dict[str, dict[str, Any]] = {
    # 2, not 1: the first example Hypothesis draws is the strategy's simplest, so one example
    # would only ever touch the smallest shape; a second reaches a drawn one.
    "smoke": dict(max_examples=2, derandomize=True, database=None),
    "ci": dict(max_examples=12, derandomize=True, database=None),
    "dev": dict(max_examples=25, derandomize=False),
    # An order of magnitude more than ci (the GPU runs kernels in microseconds), still
    # derandomized so GPU CI is repeatable.
    "gpu": dict(max_examples=120, derandomize=True, database=None),
    # As many as gpu, random: each `--hypothesis-seed` is a new sample.
    "soak": dict(max_examples=120, derandomize=False, database=None),
}

#: Default per-test timeout (seconds) for each tier, applied when neither `--timeout`,
#: `PYTEST_TIMEOUT` nor a `timeout` ini value is given. Generous on purpose: a timeout is for a
#: hung kernel, not a slow one. ci is sized for Triton's interpreter on a shared 2-core CPU (the
#: slowest ci test there takes a few minutes); gpu for today's slowest gpu-profile test (462 s on
#: an H200, issue 11) with headroom; soak's examples are random and the suite's slowest.
TIMEOUTS: dict[str, float] = {"smoke": 300.0, "ci": 900.0, "dev": 1800.0, "gpu": 900.0, "soak": 3600.0}

#: `--quick-first` when the command line does not give it (flashcheck.plugin.quick_first): the gpu tier
#: first runs every test with ci's 12 examples, so with -x a broken kernel is caught in seconds
#: rather than after every earlier test's 120 (one H200, kill matrix: median 3.3-4.4 s for the
#: softmax zoo, against 34-37 s without; the attention zoo's 6.7-16.1 s, against more than 60 s
#: without, when 7 of its 14 were caught within 100 s; reports/gpu_run.md).
QUICK_FIRST: dict[str, int] = {"gpu": 12}

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.large_base_example, HealthCheck.differing_executors]
_COMMON: dict[str, Any] = dict(deadline=None, suppress_health_check=_SLOW_OK, print_blob=True)


def register_profiles() -> None:
    """Register every tier with Hypothesis (idempotent: registering again replaces).

    Each inherits from Hypothesis's pristine "default" profile, not from whatever is loaded: with
    `CI` set, Hypothesis loads its own derandomized "ci" profile on import, and a profile
    registered then would inherit `derandomize=True` (a soak run under CI=true would draw the
    same examples for every seed).
    """
    base = settings.get_profile("default")
    for name, kw in PROFILES.items():
        settings.register_profile(name, parent=base, **kw, **_COMMON)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def default_profile(*, gpu: bool | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The tier a plain `pytest` gets: gpu with a GPU; without one ci under `CI=true`, else dev.

    `gpu=None` asks torch, so call this only after `flashcheck.plugin.devices.assign_worker_gpu()`
    (asking initialises CUDA's device list).
    """
    env = os.environ if environ is None else environ
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    if gpu:
        return "gpu"
    return "ci" if _truthy(env.get("CI")) else "dev"


def share_of_examples(fraction: float) -> settings:
    """The loaded tier's settings with `fraction` of its examples per test (at least 2), as a test's
    `@settings`: for suites whose every example costs far more than a softmax row's (the training
    families: certified oracles of a loss and its gradient, several kernel calls), so that a tier
    keeps its proportions (ci 12 -> 12 fraction, gpu 120 -> 120 fraction) and the ci tier's CPU run its
    time. Read when the suite module is imported: after the profile is loaded (conftest, then
    --hypothesis-profile)."""
    return settings(max_examples=max(2, round(settings.default.max_examples * fraction)))


def default_quick_first(profile: str) -> int:
    """Examples of the quick pass a tier runs first (0: none)."""
    return QUICK_FIRST.get(profile, 0)


def default_timeout(profile: str) -> float:
    """The per-test timeout of a tier (unknown profiles, e.g. a user's own, get dev's)."""
    return TIMEOUTS.get(profile, TIMEOUTS["dev"])


#: Hypothesis's folder (its examples database, its cache of constants) for runs of a user's kernel.
STORAGE_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"


def keep_out_of_working_folder() -> None:
    """Hypothesis keeps its folder in the working folder (`.hypothesis/`, written by every run, the
    database=None tiers too): a check of a user's kernel puts it in the user's cache instead,
    $XDG_CACHE_HOME/flashcheck/hypothesis, unless $HYPOTHESIS_STORAGE_DIRECTORY names one. Set in
    the environment too: xdist workers and supervised children inherit it."""
    if os.environ.get(STORAGE_ENV):
        return
    from pathlib import Path

    from hypothesis.configuration import set_hypothesis_home_dir

    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashcheck" / "hypothesis"
    os.environ[STORAGE_ENV] = str(home)
    set_hypothesis_home_dir(home)
