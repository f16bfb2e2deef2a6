"""The known-bad zoo: small broken Triton kernels, one real bug class each (NUMERICS.md sections 6, 9.7).

They exist to measure the suite: every one must be caught by the default (ci) suite, run as an
external kernel, e.g.

    pytest --kernel flashcheck/suite/zoo/softmax_bugs.py:online_rescale_nan --family softmax -x

(`python -m flashcheck.reports --kill-matrix` runs them all, `tests/test_zoo.py` asserts it). They are never
registered in `kernels/`; only the kill matrix (`reports/quality/kill_matrix.py`) and the self-tests import
them.

Each module lists its kernels in `ZOO`: name -> `ZooKernel` (the broken function, the same code
with the bug switched off, the bug class, the real-world references and one input that triggers
it). `tests/test_zoo.py` checks on that input that the broken kernel is wrong and its fixed twin is
right, so a kill is the bug's doing and not an unrelated defect of the zoo kernel.
"""
from __future__ import annotations

from pathlib import Path

from flashcheck.suite.zoo.kernel import ZooKernel  # noqa: F401  (the zoo's face)


def zoo(family: str | None = None, *, runnable: bool = False) -> list[ZooKernel]:
    """The zoo kernels (of one family); runnable=True leaves out the GPU-only ones under the
    interpreter (what the CPU kill matrix runs)."""
    from flashcheck.kernels import INTERPRET

    from . import attention_backward_bugs, attention_bugs, softmax_bugs, training_bugs

    out = (list(softmax_bugs.ZOO.values()) + list(attention_bugs.ZOO.values())
           + list(attention_backward_bugs.ZOO.values()) + list(training_bugs.ZOO.values()))
    return [z for z in out if (family is None or z.family == family)
            and not (runnable and INTERPRET and z.gpu_only)]


def module_path(z: ZooKernel) -> str:
    """The FILE.py path that `--kernel` takes, relative to `flashcheck.HOME` (the repository root in a
    checkout)."""
    import sys

    from flashcheck import HOME

    return str(Path(sys.modules[z.broken.__module__].__file__).resolve().relative_to(HOME))
