"""Properties, cases, and exact-bit regression fixtures.

A property is a function `prop(spec, case)` that raises AssertionError with a readable message
when the kernel `spec` violates it on `case`. Properties are registered by family and name, so a
fixture can name the property that failed and be replayed against its kernel forever.

When Hypothesis has shrunk a failure and replays the minimal example (the "final" run),
`check` writes that case as a fixture: raw storage bits of every input tensor with its dtype,
shape, strides and storage offset, so the replay is bit-exact, padding included.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from flashcheck import HOME
from flashcheck.interp_bounds import KernelFault
from flashcheck.kernels.registry import KernelSpec
from flashcheck.strategies.case import Case

FIXTURE_FORMAT = 1
DEFAULT_FIXTURE_DIR = HOME / "tests" / "regressions"
SAVE_ENV = "FLASHCHECK_SAVE_FIXTURES"
DIR_ENV = "FLASHCHECK_FIXTURE_DIR"


Property = Callable[[KernelSpec, Case], None]
PROPERTIES: dict[tuple[str, str], Property] = {}


def prop(family: str, name: str) -> Callable[[Property], Property]:
    """Register a property of a family under a stable name (fixtures refer to it)."""

    def deco(fn: Property) -> Property:
        key = (family, name)
        if key in PROPERTIES and PROPERTIES[key] is not fn:
            raise ValueError(f"property {family}/{name} registered twice")
        PROPERTIES[key] = fn
        return fn

    return deco


Margin = Callable[[KernelSpec, Case], float]
# (family, property) -> the worst measured error over its bound on a case (after the property ran)
MARGINS: dict[tuple[str, str], Margin] = {}


def margin(family: str, name: str) -> Callable[[Margin], Margin]:
    """Register how to read the worst err/bound of property `name` on a case: `check` feeds it to
    `hypothesis.target`, so a search (the soak profile) climbs towards the edge of the bound."""

    def deco(fn: Margin) -> Margin:
        MARGINS[(family, name)] = fn
        return fn

    return deco


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
    try:
        prop_fn(spec, case)
    except Exception as exc:
        if save:
            _save_if_final(spec, name, case, exc)
        raise
    if in_test and (spec.family, name) in MARGINS:
        _target_max(float(MARGINS[(spec.family, name)](spec, case)), f"{name}: worst err/bound")


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
    if saving_enabled() and _is_final_hypothesis_example():
        path = save_fixture(spec, name, case, exc)
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
    failures: list[tuple[str, BaseException]] = []
    for name in names:
        try:
            check(spec, name, case, save=False)
        except Exception as exc:  # a property's verdict, or the kernel raising on this input
            failures.append((name, exc))
            if not isinstance(exc, AssertionError) or isinstance(exc, KernelFault):
                break  # the kernel raised or faulted (interpreter checks): every other property would repeat it
    if not failures:
        return
    first_name, first = failures[0]
    _save_if_final(spec, first_name, case, first)
    sections = []
    for name, exc in failures:
        kind = "" if isinstance(exc, AssertionError) else f"the kernel raised {type(exc).__name__}: "
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
                           "flashcheck.harness._is_final_hypothesis_example") from e


def kernel_target(spec: KernelSpec) -> str:
    """How to name this kernel on the command line (the external target, or the registered name)."""
    return str(spec.extra.get("target") or spec.name)


def replay_note(path: Path, spec: KernelSpec) -> str:
    """What a failure ends with: where its fixture is, how to replay it, how to rebuild the input."""
    payload = json.loads(Path(path).read_text())
    return "\n".join([
        f"flashcheck fixture: {path}",
        f"replay: flashcheck replay {path}" + (f" --kernel {kernel_target(spec)}" if spec.external else ""),
        "repro (rebuilds the exact input bits):",
        repro_snippet(payload, path),
    ])


_SNIPPET_WORDS = 512


def repro_snippet(payload: dict[str, Any], path: Path | str) -> str:
    """Standalone Python that rebuilds the fixture's inputs bit for bit and calls the kernel."""
    lines = ["    import numpy as np, torch"]
    small = all(t["storage_words"] <= _SNIPPET_WORDS for t in payload["tensors"].values())
    if small:
        for name, t in payload["tensors"].items():
            words = [int(w, 16) for line in t["bits"] for w in line.split()]
            width = _WORD[_DTYPES[t["dtype"]].itemsize]
            lines.append(f"    {name} = torch.from_numpy(np.array({words}, dtype=np.{width.__name__})"
                         f".view(np.int{8 * _DTYPES[t['dtype']].itemsize}).copy())"
                         f".view(torch.{t['dtype']}).as_strided({tuple(t['shape'])}, {tuple(t['stride'])}, "
                         f"{t['storage_offset']})")
    else:
        lines.append("    from flashcheck.harness import load_fixture")
        lines.append(f"    _, case = load_fixture({str(path)!r}, torch.device('cpu'))")
        for name in payload["tensors"]:
            lines.append(f"    {name} = case.tensors[{name!r}]")
    lines.append("    # on a GPU: build the storage there (torch.from_numpy(...).cuda()) before .view/.as_strided")
    kwargs = ", ".join(f"{k}={_kwarg_repr(v)}" for k, v in payload["kwargs"].items())
    args = ", ".join(payload["tensors"])
    lines.append(f"    out = {payload['kernel'].rsplit('.', 1)[-1]}({args}{', ' + kwargs if kwargs else ''})"
                 f"  # the kernel: {payload.get('target') or payload['kernel']}")
    return "\n".join(lines)


def _kwarg_repr(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return f"torch.{v['dtype']}"
    return repr(v)


_SETTINGS: dict[str, Any] = {"save": None, "directory": None, "default_dir": None}


def configure(*, save: bool | None = None, directory: Path | None = None, default_dir: Path | None = None) -> None:
    """Set this process's fixture behaviour (the pytest plugin calls it from the options).

    Process state rather than environment variables, so nothing leaks into subprocesses a test
    starts (the suite's own self-tests run pytest in subprocesses with flags of their own).
    """
    if save is not None:
        _SETTINGS["save"] = save
    if directory is not None:
        _SETTINGS["directory"] = Path(directory)
    if default_dir is not None:
        _SETTINGS["default_dir"] = Path(default_dir)


def saving_enabled() -> bool:
    if _SETTINGS["save"] is not None:
        return bool(_SETTINGS["save"])
    return os.environ.get(SAVE_ENV, "1") not in ("0", "false", "no", "")


def fixture_dir() -> Path:
    """Explicit --fixture-dir, else $FLASHCHECK_FIXTURE_DIR, else ./flashcheck-regressions for an
    external kernel, else the suite's own tests/regressions."""
    return Path(_SETTINGS["directory"] or os.environ.get(DIR_ENV) or _SETTINGS["default_dir"]
                or DEFAULT_FIXTURE_DIR)


# ---- serialisation -----------------------------------------------------------------------------

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool)}
_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind a view, as a flat tensor of its dtype on its device (no copy)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))


def storage_snapshot(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the bytes of a view's whole storage (padding and guards included)."""
    return storage_of(t).cpu().view(torch.uint8).clone()


def _encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    words = storage_of(t).cpu().view(torch.uint8).numpy().view(_WORD[t.element_size()])
    width = 2 * t.element_size()
    hexes = [format(int(w), f"0{width}x") for w in words]
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "storage_words": len(words),
        "bits": [" ".join(hexes[i:i + 16]) for i in range(0, len(hexes), 16)],
        "values": _preview(t),
    }


def _preview(t: torch.Tensor) -> list[Any]:
    """Human-readable values of the view (first rows), for reviewers; replay uses `bits`."""
    v = t.detach().cpu()
    if v.is_floating_point():
        v = v.double()
    flat = v.reshape(-1)[:256].tolist()
    return [repr(x) if isinstance(x, float) else x for x in flat]


def _decode_tensor(d: dict[str, Any], device: torch.device) -> torch.Tensor:
    dtype = _DTYPES[d["dtype"]]
    words = np.array([int(w, 16) for line in d["bits"] for w in line.split()], dtype=_WORD[dtype.itemsize])
    if len(words) != d["storage_words"]:
        raise ValueError("fixture storage length does not match its bits")
    base = torch.from_numpy(words.view(np.uint8).copy()).view(dtype).to(device)
    return base.as_strided(d["shape"], d["stride"], d["storage_offset"])


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    return v


def _unjson(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return _DTYPES[v["dtype"]]
    return v


def _versions() -> dict[str, str]:
    import hypothesis
    import triton

    from flashcheck.kernels import INTERPRET

    return {"torch": torch.__version__, "triton": triton.__version__, "hypothesis": hypothesis.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "backend": "interpreter" if INTERPRET else torch.cuda.get_device_name()}


def fixture_payload(spec: KernelSpec, name: str, case: Case, exc: BaseException) -> dict[str, Any]:
    return {
        "format": FIXTURE_FORMAT,
        "kernel": spec.name,
        "target": kernel_target(spec) if spec.external else None,
        "family": spec.family,
        "property": name,
        "label": case.label,
        "message": f"{type(exc).__name__}: {exc}",
        "kwargs": {k: _jsonable(v) for k, v in case.kwargs.items()},
        "tensors": {k: _encode_tensor(t) for k, t in case.tensors.items()},
        "versions": _versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def fixture_key(payload: dict[str, Any]) -> str:
    """Identity of a failure: kernel, property and the exact input, not message or versions."""
    ident = {k: payload[k] for k in ("kernel", "property", "kwargs")}
    ident["tensors"] = {k: {f: v for f, v in t.items() if f != "values"} for k, t in payload["tensors"].items()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def save_fixture(spec: KernelSpec, name: str, case: Case, exc: BaseException) -> Path:
    """Write the failing case atomically; one file per distinct failure, safe under xdist."""
    payload = fixture_payload(spec, name, case, exc)
    safe_kernel = "".join(c if c.isalnum() or c in "-_" else "_" for c in spec.name)
    path = fixture_dir() / f"{safe_kernel}__{name}__{fixture_key(payload)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; fixtures are for reviewers too
    os.replace(tmp, path)
    return path


class FixtureError(ValueError):
    """A fixture file that cannot be replayed (the message names the file and the problem)."""


def load_fixture(path: Path, device: torch.device) -> tuple[dict[str, Any], Case]:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FixtureError(f"fixture {path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != FIXTURE_FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise FixtureError(f"fixture {path}: unknown fixture format {got!r} (expected {FIXTURE_FORMAT})")
    missing = [k for k in ("kernel", "family", "property", "kwargs", "tensors") if k not in payload]
    if missing:
        raise FixtureError(f"fixture {path}: missing field(s) {', '.join(missing)}")
    try:
        case = Case(
            tensors={k: _decode_tensor(t, device) for k, t in payload["tensors"].items()},
            kwargs={k: _unjson(v) for k, v in payload["kwargs"].items()},
            label=payload.get("label", ""),
        )
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise FixtureError(f"fixture {path}: bad tensor data ({type(e).__name__}: {e})") from None
    return payload, case


def load_properties() -> None:
    """Import every family's properties (they register themselves with `prop`)."""
    import importlib

    for module in ("flashcheck.properties_softmax", "flashcheck.properties_attention"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def resolve_fixture_kernel(payload: dict[str, Any], path: Path | str) -> KernelSpec:
    """The kernel a fixture names: one under test, else its recorded external target, else a
    registered production kernel. A fixture of a kernel nobody can find is an error."""
    from flashcheck.kernels.registry import PRODUCTION, REGISTRY

    name = payload["kernel"]
    for s in REGISTRY:
        if s.name == name:
            return s
    target = payload.get("target")
    if target:
        from flashcheck.external import KernelLoadError, load_kernel

        try:
            return load_kernel(target, payload["family"])
        except KernelLoadError as e:
            raise FixtureError(f"fixture {path}: its kernel {target!r} cannot be loaded: {e}") from None
    for s in PRODUCTION:
        if s.name == name:
            return s
    raise FixtureError(f"fixture {path}: names kernel {name!r}, which is neither registered nor an external "
                       f"target (registered: {', '.join(s.name for s in PRODUCTION)})")


def fixture_paths(directory: Path | None = None) -> list[Path]:
    d = directory or fixture_dir()
    return sorted(d.glob("*.json")) if d.is_dir() else []
