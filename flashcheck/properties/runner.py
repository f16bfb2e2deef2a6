"""The properties runner: properties registered by family and name, and `check` / `check_all`,
which run them inside Hypothesis tests (coverage events, targeting, the shrunk failure saved).

A property is a function `prop(spec, case)` that raises AssertionError with a readable message
when the kernel `spec` violates it on `case`. Properties are registered by family and name, so a
fixture can name the property that failed and be replayed against its kernel forever.

When Hypothesis has shrunk a failure and replays the minimal example (the "final" run),
`check` writes that case as a fixture (`flashcheck.fixtures.store`: raw storage bits of every input
tensor with its dtype, shape, strides and storage offset, so the replay is bit-exact, padding
included) and the failure ends with how to replay it (`flashcheck.fixtures.repro`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from flashcheck.fixtures.store import fixture_dir, save_fixture, saving_enabled, storage_of
from flashcheck.interpreter.bounds import KernelFault
from flashcheck.properties.limits import KernelLimit
from flashcheck.kernels.registry import KernelSpec
from flashcheck.fixtures.repro import replay_note
from flashcheck.strategies.case import Case
from flashcheck.isolation import hooks as kernel_hooks

from flashcheck.families import MARGINS, PROPERTIES
from flashcheck.properties.tally import _count_example

kernel_hooks.attach()  # the interpreter patch and the GPU-fault guard, before any kernel runs


def check(spec: KernelSpec, name: str, case: Case, *, save: bool = True) -> None:
    """Run a property; if this is Hypothesis's final (shrunk) failing example, save a fixture.
    Inside a Hypothesis test it also reports coverage events (class, kind, layout, size) and targets
    the property's worst err/bound where a margin is registered."""
    in_test = _in_hypothesis_test()
    if in_test:
        _coverage_events(spec, case)
    try:
        prop_fn = PROPERTIES[(spec.family, name)]
    except KeyError:
        raise KeyError(f"no {spec.family} property named {name!r}; known: "
                       f"{sorted(n for f, n in PROPERTIES if f == spec.family)}") from None
    from flashcheck.isolation import faults
    from flashcheck.isolation import journal as isolation
    from flashcheck.properties import limits
    from flashcheck.properties import refusals
    from flashcheck.isolation.faults import GpuFault

    _count_example(case)
    host = _host_case(case)  # after a GPU fault the device copy cannot be read back
    isolation.note_input(spec, name, host)
    drawn = _as_drawn(case) if save else case
    calls = faults.CALLS[0]
    try:
        with limits.diagnosed(spec, case.tensors):  # a device or launch limit is named as one
            prop_fn(spec, case)
    except GpuFault as exc:
        raise _fault(spec, name, host, exc) from exc
    except Exception as exc:
        refused = refusals.classify(spec, case, exc, faults.CALLS[0] - calls) if refusals.in_pytest() else None
        if refused is not None:  # an undeclared feature refused cleanly: not a failure (rejected or skipped)
            refusals.refuse(refused, faults.CALLS[0] - calls)
        if save:
            _save_if_final(spec, name, drawn, exc)
        raise
    if in_test and (spec.family, name) in MARGINS:
        _target_max(float(MARGINS[(spec.family, name)](spec, case)), f"{name}: worst err/bound")


def _host_case(case: Case) -> Case:
    """The case itself on the CPU; on a GPU, a host copy of every storage (padding included)."""
    if not any(t.is_cuda for t in case.tensors.values()):
        return case
    return _with_storages(case, lambda s: s.cpu())


def _fault(spec: KernelSpec, name: str, case: Case, exc: BaseException) -> BaseException:
    """The GpuFault with its property and case named, saved as a fixture at once: Hypothesis does
    not shrink it (nothing in a dead context means anything), so this example is the one."""
    from flashcheck.isolation.faults import GpuFault

    err = GpuFault(f"{exc}\n  property {name} on {case!r}", getattr(exc, "kind", "GPU fault"))
    if saving_enabled() and getattr(exc, "kind", "") != "context lost":
        err.add_note(replay_note(save_fixture(spec, name, case, exc), spec))
    return err


def _as_drawn(case: Case) -> Case:
    """A copy of the case's storages, taken before the kernel runs, when this example's failure
    would be saved: a kernel that writes into its input must not leave the fixture (and its repro)
    holding what it wrote instead of what was drawn. The case itself otherwise (no copy)."""
    if not (saving_enabled() and _is_final_hypothesis_example()):
        return case
    return _with_storages(case, lambda s: s.clone())


def _with_storages(case: Case, copy: Callable[[Any], Any]) -> Case:
    """The case with each tensor's whole storage (padding included) passed through `copy`."""
    return Case(tensors={k: copy(storage_of(t)).as_strided(t.shape, t.stride(), t.storage_offset())
                         for k, t in case.tensors.items()}, kwargs=case.kwargs, label=case.label)


def _in_hypothesis_test() -> bool:
    from hypothesis.control import currently_in_test_context

    return currently_in_test_context()


def _target_max(value: float, label: str) -> None:
    """hypothesis.target once per label and example: a property checked on several cases of one
    example targets its first (Hypothesis refuses a second call with the same label)."""
    import math

    from hypothesis import target
    from hypothesis.errors import InvalidArgument

    if not math.isfinite(value):  # inf/NaN ratios already fail the property; target() wants finite
        return
    try:
        target(value, label=label)
    except InvalidArgument:
        pass


def _coverage_events(spec: KernelSpec, case: Case) -> None:
    """`--hypothesis-show-statistics` then lists which classes, kinds, layouts and sizes ran."""
    from hypothesis import event

    label = case.label or "unlabelled"
    event(f"class: {label.split('/')[0]}")
    if "/" in label:
        event(f"kind: {label}")
    for key, t in case.tensors.items():
        if t.dim() < 2:
            continue
        n = t.shape[-1]
        s = t.stride()
        layout = ("transposed" if s[-1] != 1 and s[-2] == 1 and t.shape[-2] > 1 else
                  "column step" if s[-1] > 1 else
                  "row stride > N" if t.shape[-2] > 1 and s[-2] > n else "contiguous rows")
        event(f"{key} layout: {layout}{', offset' if t.storage_offset() else ''}")
        size = ("N=1" if n == 1 else "N power of two" if n & (n - 1) == 0 else
                "N = 2^k +- 1" if (n + 1) & n == 0 or (n - 1) & (n - 2) == 0 else "N other")
        event(f"{key} size: {size}{', N>1024' if n > 1024 else ''}")


def _save_if_final(spec: KernelSpec, name: str, case: Case, exc: BaseException) -> None:
    """Save the shrunk failure; a fixture that cannot be written never masks the failure itself:
    the kernel's exception is kept and a note says why there is no fixture."""
    if saving_enabled() and _is_final_hypothesis_example():
        d = fixture_dir()
        try:
            path = save_fixture(spec, name, case, exc, d)
        except OSError as e:
            exc.add_note(f"flashcheck: no fixture written to {d}: {type(e).__name__}: {e}")
            return
        exc.add_note(replay_note(path, spec))


class PropertyFailures(AssertionError):
    """Properties failed on one case (each reported in its own section)."""


def check_all(spec: KernelSpec, names: Sequence[str], case: Case) -> None:
    """Run every property in `names` on one case; report each failure on its own.

    Whatever fails, the error is raised from this one place, so Hypothesis shrinks one failure
    per test instead of grouping the properties into an ExceptionGroup; its message lists every
    property that failed. The shrunk case is saved once, as a fixture of the first failing
    property (replaying it re-checks that property).
    """
    from hypothesis.errors import UnsatisfiedAssumption

    failures: list[tuple[str, BaseException]] = []
    drawn = _as_drawn(case)
    for name in names:
        try:
            check(spec, name, case, save=False)
        except UnsatisfiedAssumption:
            raise  # a refused undeclared feature (flashcheck.properties.refusals): the example is left, not failed
        except Exception as exc:  # a property's verdict, or the kernel raising on this input
            failures.append((name, exc))
            if not isinstance(exc, AssertionError) or isinstance(exc, KernelFault):
                break  # the kernel raised or faulted (interpreter checks): every other property would repeat it
    if not failures:
        return
    first_name, first = failures[0]
    _save_if_final(spec, first_name, drawn, first)
    sections = []
    for name, exc in failures:
        kind = "" if isinstance(exc, (AssertionError, KernelLimit)) else f"the kernel raised {type(exc).__name__}: "
        sections.append(f"[{name}] {kind}{exc}")
    err = PropertyFailures(f"{', '.join(n for n, _ in failures)} failed ({len(failures)} of {len(names)} "
                           f"properties) on {case!r}\n\n"
                           + "\n\n".join(sections))
    for note in getattr(first, "__notes__", []):
        err.add_note(note)
    raise err


def _is_final_hypothesis_example() -> bool:
    """True while Hypothesis replays the shrunk failing example (its last run of the test).

    `currently_in_test_context` is public; `current_build_context().is_final` is the one
    internal attribute kept: tests/test_fixtures.py fails loudly if an upgrade removes it.
    """
    from hypothesis.control import current_build_context, currently_in_test_context

    if not currently_in_test_context():
        return False
    try:
        return bool(current_build_context().is_final)
    except AttributeError as e:  # pragma: no cover - a Hypothesis upgrade changed its internals
        import hypothesis

        raise RuntimeError(f"Hypothesis {hypothesis.__version__} has no BuildContext.is_final: "
                           "flashcheck cannot tell the shrunk example; pin hypothesis or update "
                           "flashcheck.properties.runner._is_final_hypothesis_example") from e
