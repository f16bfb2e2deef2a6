"""The shipped suite: the family suites (`test_softmax*.py`, `test_attention.py`), the replay of
the regression fixtures (`test_regressions.py`, `regressions/`) and the known-bad zoo (`zoo/`).

This is what `flashcheck check` and `pytest --kernel` run against a kernel; installed, it is
`site-packages/flashcheck/suite/`. The project's own self-tests live in the repository's `tests/`
and do not ship.
"""


def seed_key(file_name: str, test: str) -> str:
    """What Hypothesis seeds a derandomized run (the ci and gpu profiles) of the suite's test `test`
    (`name[params]`) in `file_name` from. Hypothesis keys a parametrized test by its pytest node id,
    which names the folder: the suite keeps the id it had in `tests/` before it moved here
    (`conftest.py` sets it), so its ci draws, the kill matrix and the GPU record did not move with
    the folder, and an installed suite draws what a checkout draws."""
    return f"tests/{file_name}::{test}"
