"""A kernel that cleanly refuses a feature it never declared (issue 48 item 4).

Undeclared means supported (flashcheck.targets.external), so the suite draws every optional feature a plain
function's `flashcheck` dict, flags and signature leave open (`extra["assumed"]`). A kernel that
raises ValueError, NotImplementedError, TypeError or AssertionError from its own Python code before
launching anything, on an example that uses such an assumed feature, has told us it does not take
it: that example is not a failure. It is rejected (`hypothesis.reject`), so the test's other
examples still run and check the kernel; a test whose examples were all refused is skipped naming
the feature and the kernel's message. The run ends with one line per refused feature, with the
declaration that leaves it out and the one that requires it (then the same refusal fails).

What stays a failure, as before: a refusal of an example that uses no optional feature, or one it
declared (even beside assumed ones: the refusal may be of the declared one), another exception type, an exception raised inside torch, triton or
flashcheck (a launch, a shape error deep in a library, a property's verdict), and a refusal after an
earlier call on the same example returned (the kernel produced output for it). Registered kernels
and KernelSpec exports assume nothing: their fields are their declarations.
"""
from __future__ import annotations

import os
import sys
from typing import Any

#: Lengths (softmax rows, attention keys) beyond which a length counts as the optional feature
#: `max_n`: every kernel takes a plain tile of 256, so a refusal at or below it stays a failure.
LONG = 256
#: Refusals in one test, with nothing checked, after which it stops drawing and is skipped.
GIVE_UP = 10
TYPES = (ValueError, NotImplementedError, TypeError, AssertionError)
#: Declaration keys whose "leave it out" value is True, not False.
_INVERTED = {"square_only"}
# Per running test (node id): refused examples, their kernel calls, the records for the summary.
_TESTS: dict[str, dict[str, Any]] = {}


def _test_id() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _state(test: str) -> dict[str, Any]:
    from flashcheck.properties import tally as properties

    return _TESTS.setdefault(test, {"examples": properties.EXAMPLES[0], "refused": 0, "calls": 0, "records": []})


def begin(test: str) -> None:
    """A test starts: its examples are counted from here."""
    _TESTS.pop(test, None)
    _state(test)


def take(test: str) -> dict[str, Any]:
    """The test's refusals ({} if none): refused examples and calls, and the summary's records."""
    from flashcheck.properties import tally as properties

    s = _TESTS.pop(test, None)
    if not s or not s["refused"]:
        return {}
    checked = properties.EXAMPLES[0] - s["examples"] - s["refused"]
    return {"refused": s["refused"], "calls": s["calls"], "checked": checked, "records": s["records"]}


def _library_dirs() -> list[str]:
    """Where a raise means the kernel reached a library (a launch, a torch op) or flashcheck."""
    dirs = []
    for name in ("torch", "triton", "numpy", "flashcheck"):
        mod = sys.modules.get(name)
        for p in getattr(mod, "__path__", None) or ():
            dirs.append(os.path.join(os.path.realpath(p), ""))
    return dirs


def _before_launch(exc: BaseException, spec: Any) -> bool:
    """Raised by the kernel's own Python code: the traceback enters the kernel's file and no frame
    from there on is in torch, triton or flashcheck (nothing was launched, no library refused)."""
    from flashcheck.properties.limits import kernel_frames

    files = kernel_frames(exc, spec)
    lib = _library_dirs()
    return bool(files) and not any(os.path.realpath(f).startswith(tuple(lib)) for f in files)


def classify(spec: Any, case: Any, exc: BaseException, calls: int) -> dict[str, Any] | None:
    """The refusal record if `exc` is a clean refusal of assumed features `case` uses, else None.
    calls: the kernel calls this check made (more than one: an earlier call returned)."""
    from flashcheck.interpreter.bounds import KernelFault
    from flashcheck.properties.limits import KernelUnsupported

    assumed = set((getattr(spec, "extra", None) or {}).get("assumed") or ())
    if not assumed or calls > 1:
        return None
    if isinstance(exc, KernelUnsupported) and exc.__cause__ is not None:
        exc = exc.__cause__  # the feature hint for a declared feature: look at what the kernel raised
    if not isinstance(exc, TYPES) or isinstance(exc, KernelFault) or not _before_launch(exc, spec):
        return None
    from flashcheck.families import get

    used = get(spec.family).hook("refusable")(case)
    if "head_dims" in used and "max_head_dim" not in assumed:
        assumed.discard("head_dims")
    # Every feature it uses must be assumed: with one declared supported among them, the refusal
    # may be of that one, and a declared feature refused is the kernel's failure.
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    if not used:  # a plain input refused: the same message elsewhere is no feature's refusal either
        _state(_test_id())["records"].append({"features": [], "message": message, "n": 0, "test": _test_id()})
        return None
    if any(k not in assumed for k in used):
        return None
    features = used
    length = case.tensors[get(spec.family).length_input].shape[get(spec.family).length_axis]
    return {"features": sorted(features), "what": ", ".join(features.values()), "message": message,
            "n": int(length)}


def refuse(record: dict[str, Any], calls: int) -> None:
    """Record a refusal and leave the example (always raises): rejected inside a Hypothesis test
    (its other examples run), skipped in a plain test and once a test has refused GIVE_UP examples
    with nothing checked. Outside pytest (`flashcheck replay`) a refusal is never called."""
    from flashcheck.properties import tally as properties

    test = _test_id()
    s = _state(test)
    s["refused"] += 1
    s["calls"] += calls
    same = [r for r in s["records"] if (r["features"], r["message"]) == (record["features"], record["message"])]
    if same:  # each distinct refusal once, at its shortest length (a max_n to declare)
        same[0]["n"] = min(same[0]["n"], record["n"])
    else:
        s["records"].append({**record, "test": test})
    from hypothesis.control import currently_in_test_context

    checked = properties.EXAMPLES[0] - s["examples"] - s["refused"]
    if not currently_in_test_context() or (s["refused"] >= GIVE_UP and checked <= 0):
        import pytest

        pytest.skip(skip_reason(s["records"]))
    from hypothesis import reject

    reject()


def in_pytest() -> bool:
    return bool(os.environ.get("PYTEST_CURRENT_TEST"))


def skip_reason(records: list[dict[str, Any]]) -> str:
    r = next(r for r in records if r["features"])
    return (f"refused {'+'.join(r['features'])}: the kernel raised {r['message']} on {r['what']} "
            f"(undeclared, so assumed supported; the run's summary says what to declare)")


def declarations(key: str, n: int) -> tuple[str, str]:
    """(the declaration that leaves `key` out, the one that requires it), as dict entries."""
    if key == "max_n":
        return f"max_n={max(1, n - 1)}", f"max_n={n} or more"
    if key == "head_dims":
        return "head_dims=[the dims it takes]", "head_dims listing it"
    if key == "reductions":
        return "reductions=mean", "reductions listing it"
    off = key in _INVERTED
    return f"{key}={off}", f"{key}={not off}"


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per refused feature over every test's records ({"test", "features", "message",
    "n"}): a refusal of several assumed features at once is counted under one of them that was also
    refused alone, else under the first."""
    from flashcheck.targets.external import flag

    plain = {r["message"] for r in records if not r["features"]}
    records = [r for r in records if r["features"] and r["message"] not in plain]
    alone = {r["features"][0] for r in records if len(r["features"]) == 1}
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        key = next((f for f in r["features"] if f in alone), r["features"][0])
        by.setdefault(key, []).append(r)
    lines = []
    for key, rs in sorted(by.items()):
        tests = len({r["test"] for r in rs})
        messages = sorted({r["message"] for r in rs}, key=[r["message"] for r in rs].index)
        n = min(r["n"] for r in rs)
        off, on = declarations(key, n)
        cli = f" ({flag(key, off.split('=', 1)[1])})" if key not in ("head_dims",) else ""
        more = f" (and {len(messages) - 1} other messages)" if len(messages) > 1 else ""
        lines.append(f"flashcheck: refused {key} ({tests} test{'s' * (tests != 1)}): \"{messages[0]}\"{more} "
                     f"-- declare {off}{cli} to skip it, {on} to fail it")
    return lines
