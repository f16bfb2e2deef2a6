"""The shipped suite: the family suites (`test_softmax*.py`, `test_attention.py`), the replay of
the regression fixtures (`test_regressions.py`, `regressions/`) and the known-bad zoo (`zoo/`).

This is what `flashcheck check` and `pytest --kernel` run against a kernel; installed, it is
`site-packages/flashcheck/suite/`. The project's own self-tests live in the repository's `tests/`
and do not ship.
"""
