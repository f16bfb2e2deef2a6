"""Exact-bit regression fixtures: data, never code.

A fixture is a JSON file holding the raw storage bits of every input tensor (dtype, shape, strides,
storage offset: the replay is bit-exact, padding included), the property that failed and the
identity of the kernel it failed on. No field of it is ever imported or executed: the kernel a
fixture is replayed against comes from the command line (`--kernel`, the check/replay target) or
the registry, and a folder's fixtures are replayed only against the kernel whose identity they
record (`kernel_identity`).

Identity: `registered:NAME` for our registered kernels; for an external kernel
`file:PATH:FN` with PATH relative to the project that holds the file (the nearest folder with
.git, pyproject.toml, setup.py or setup.cfg; the absolute path when there is none), or
`module:DOTTED:FN`. Not a hash of the kernel's source: a fixture must keep replaying after the
kernel is edited (the fix is the edit that matters). Not the absolute path: a committed fixture
must replay in another clone and in CI. Two files with one stem in different folders differ.

A fixture that cannot be read, has wrong types or implausible sizes is a bad fixture
(`FixtureError`, checked before anything is allocated): reported as such, never as the kernel's
failure.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flashcheck import LOCAL_FIXTURE_DIR, SUITE, atomic, families

FIXTURE_FORMAT = 2  # 2: the kernel's identity (format 1 named it by file stem only)
#: flashcheck's own committed fixtures; written only when the suite's opt-in is on (SUITE_ENV).
DEFAULT_FIXTURE_DIR = SUITE / "regressions"
SAVE_ENV = "FLASHCHECK_SAVE_FIXTURES"
DIR_ENV = "FLASHCHECK_FIXTURE_DIR"
#: "1": this run may write into DEFAULT_FIXTURE_DIR (the `flashcheck_suite_fixtures` ini option of
#: the checkout's pyproject.toml sets it for the project's own runs; subprocesses of the tooling get "0").
SUITE_ENV = "FLASHCHECK_SUITE_FIXTURES"
#: Caps checked before anything is allocated (a real fixture is a shrunk case: kilobytes).
MAX_FILE_BYTES = 1 << 30
MAX_STORAGE_BYTES = 256 << 20
MAX_DIMS = 8
#: Views, not only storage, are capped: zero strides make a view of any size from one stored word,
#: and the kernel's output, the tool's copies and the oracle all scale with the view (issue 49: a
#: [1, 10**9] view of one word grew a replay to 23 GB). The attention oracle keeps five float64
#: (B, Hq, M, N) arrays: 2^22 scores is 20 times the largest drawn case, under 1 GB.
MAX_VIEW_BYTES = MAX_STORAGE_BYTES
MAX_SCORES = 1 << 22
#: Largest integer keyword (max_seqlen_*, num_splits, window): kernels size grids and loops by them.
MAX_KWARG_INT = 1 << 24


class FixtureError(ValueError):
    """A fixture file that cannot be replayed (the message names the file and the problem)."""


# ---- where, and whether ------------------------------------------------------------------------------

_SETTINGS: dict[str, Any] = {"save": None, "directory": None, "default_dir": None, "suite": None}


def configure(*, save: bool | None = None, directory: Path | None = None, default_dir: Path | None = None,
              suite: bool | None = None) -> None:
    """Set this process's fixture behaviour (the pytest plugin calls it from the options).

    Process state rather than environment variables, so nothing leaks into subprocesses a test
    starts (the suite's own self-tests run pytest in subprocesses with flags of their own).
    """
    for key, value in (("save", save), ("suite", suite)):
        if value is not None:
            _SETTINGS[key] = value
    for key, value in (("directory", directory), ("default_dir", default_dir)):
        if value is not None:
            _SETTINGS[key] = Path(value)


def _env_flag(name: str) -> bool | None:
    raw = os.environ.get(name)
    return None if raw is None else raw.strip().lower() not in ("0", "false", "no", "")


def saving_enabled() -> bool:
    if _SETTINGS["save"] is not None:
        return bool(_SETTINGS["save"])
    return _env_flag(SAVE_ENV) is not False


def suite_fixtures_enabled() -> bool:
    """Whether this run may write into flashcheck's own flashcheck/suite/regressions:
    $FLASHCHECK_SUITE_FIXTURES when set, else the ini option. Never in a mutation run (the kernels
    there are broken on purpose)."""
    if os.environ.get("FLASHCHECK_MUTANT"):
        return False
    env = _env_flag(SUITE_ENV)
    return bool(_SETTINGS["suite"]) if env is None else env


def fixture_dir() -> Path:
    """Explicit --fixture-dir, else $FLASHCHECK_FIXTURE_DIR, else ./flashcheck-regressions for an
    external kernel, else the suite's own flashcheck/suite/regressions when the suite's opt-in is on,
    else ./flashcheck-regressions."""
    explicit = _SETTINGS["directory"] or os.environ.get(DIR_ENV) or _SETTINGS["default_dir"]
    if explicit:
        return Path(explicit)
    return DEFAULT_FIXTURE_DIR if suite_fixtures_enabled() else Path.cwd() / LOCAL_FIXTURE_DIR


def is_suite_dir(d: Path) -> bool:
    try:
        return Path(d).resolve() == DEFAULT_FIXTURE_DIR.resolve()
    except OSError:
        return False


def dir_problem(d: Path) -> str | None:
    """Why fixtures cannot be written into `d` (None: they can), without creating anything: a
    passing run leaves no folder behind."""
    d = Path(d)
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            return f"{d}: no existing parent folder"
        probe = probe.parent
    if not probe.is_dir():
        return f"{d}: {probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{d}: {probe} is not writable"
    return None


def write_refusal(identity: str, d: Path) -> str | None:
    """Why a fixture of `identity` must not go into `d` (None: it may)."""
    if not is_suite_dir(d):
        return None
    if not identity.startswith("registered:"):
        return f"{d} is flashcheck's own regression folder: it takes fixtures of registered kernels only"
    if not suite_fixtures_enabled():
        return (f"{d} is flashcheck's own regression folder: writing there needs {SUITE_ENV}=1 or the "
                "flashcheck_suite_fixtures ini option (the project's own suite sets it)")
    return None


def fixture_paths(directory: Path | None = None) -> list[Path]:
    """The fixtures of a folder: *.json, never a temporary file of a write in progress (.tmp-*)."""
    d = Path(directory) if directory else fixture_dir()
    return sorted(p for p in d.glob("*.json") if not p.name.startswith(".") and p.is_file()) if d.is_dir() else []


# ---- identity ----------------------------------------------------------------------------------------

_ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def _project_relative(path: Path) -> str:
    path = path.resolve()
    for parent in path.parents:
        if any((parent / m).exists() for m in _ROOT_MARKERS):
            return path.relative_to(parent).as_posix()
    return path.as_posix()


def target_identity(where: str, attr: str, *, is_file: bool) -> str:
    """The identity of an external kernel target (see the module docstring for why this one)."""
    return f"file:{_project_relative(Path(where))}:{attr}" if is_file else f"module:{where}:{attr}"


def kernel_identity(spec: Any) -> str:
    """A kernel's stable identity: what its fixtures are keyed by."""
    ident = (getattr(spec, "extra", None) or {}).get("identity")
    if ident:
        return str(ident)
    from flashcheck.kernels.registry import PRODUCTION

    if not spec.external and any(s.name == spec.name for s in PRODUCTION):
        return f"registered:{spec.name}"
    return f"unregistered:{spec.name}"  # built in code: never matched to a folder's fixtures


def payload_identity(payload: dict[str, Any]) -> str | None:
    """The identity a fixture records; format 1 recorded only a name: None for an external one."""
    if payload.get("identity"):
        return str(payload["identity"])
    return None if payload.get("target") else f"registered:{payload['kernel']}"


# ---- serialisation -----------------------------------------------------------------------------------

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool)}
WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def storage_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind a view, as a flat tensor of its dtype on its device (no copy)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))


def storage_snapshot(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the bytes of a view's whole storage (padding and guards included)."""
    return storage_of(t).cpu().view(torch.uint8).clone()


def _encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    words = storage_of(t).cpu().view(torch.uint8).numpy().view(WORD[t.element_size()])
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


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    return v


def _unjson(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"dtype"}:
        return DTYPES[v["dtype"]]
    return v


def _versions() -> dict[str, str]:
    import hypothesis
    import triton

    from flashcheck.kernels import INTERPRET

    return {"torch": torch.__version__, "triton": triton.__version__, "hypothesis": hypothesis.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "backend": "interpreter" if INTERPRET else torch.cuda.get_device_name()}


def kernel_target(spec: Any) -> str:
    """How to name this kernel on the command line (the external target, or the registered name)."""
    return str(spec.extra.get("target") or spec.name)


def fixture_payload(spec: Any, name: str, case: Any, exc: BaseException) -> dict[str, Any]:
    return {
        "format": FIXTURE_FORMAT,
        "kernel": spec.name,
        "identity": kernel_identity(spec),
        "target": kernel_target(spec) if spec.external else None,  # for the reader: never imported
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
    ident = {k: payload.get(k) for k in ("kernel", "identity", "property", "kwargs")}
    ident["tensors"] = {k: {f: v for f, v in t.items() if f != "values"} for k, t in payload["tensors"].items()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def save_fixture(spec: Any, name: str, case: Any, exc: BaseException, directory: Path | None = None) -> Path:
    """Write the failing case atomically (`flashcheck.atomic`: a temporary file, then os.replace); one
    file per distinct failure, safe under xdist. OSError when it cannot (the caller notes why)."""
    payload = fixture_payload(spec, name, case, exc)
    d = Path(directory) if directory else fixture_dir()
    refusal = write_refusal(payload["identity"], d)
    if refusal:
        raise PermissionError(refusal)
    safe_kernel = "".join(c if c.isalnum() or c in "-_" else "_" for c in spec.name)
    path = d / f"{safe_kernel}__{name}__{fixture_key(payload)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(payload, indent=1) + "\n")  # readable: fixtures are for reviewers too
    return path


# ---- reading: every field checked before anything is allocated ----------------------------------------

def _int(v: Any, what: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise FixtureError(f"{what} is {v!r}, not an integer >= {lo}")
    return v


def _ints(v: Any, what: str) -> list[int]:
    if not isinstance(v, list):
        raise FixtureError(f"{what} is {type(v).__name__}, not a list")
    if len(v) > MAX_DIMS:
        raise FixtureError(f"{what} has {len(v)} dims (at most {MAX_DIMS})")
    return [_int(x, f"{what}[{i}]") for i, x in enumerate(v)]


def _check_tensor(name: str, t: Any) -> None:
    what = f"tensor {name!r}"
    if not isinstance(t, dict):
        raise FixtureError(f"{what} is {type(t).__name__}, not an object")
    if t.get("dtype") not in DTYPES:
        raise FixtureError(f"{what}: unknown dtype {t.get('dtype')!r} (known: {', '.join(DTYPES)})")
    size = DTYPES[t["dtype"]].itemsize
    shape, stride = _ints(t.get("shape"), f"{what} shape"), _ints(t.get("stride"), f"{what} stride")
    if len(shape) != len(stride):
        raise FixtureError(f"{what}: shape {shape} and stride {stride} differ in rank")
    offset = _int(t.get("storage_offset"), f"{what} storage_offset")
    words = _int(t.get("storage_words"), f"{what} storage_words")
    if words * size > MAX_STORAGE_BYTES:
        raise FixtureError(f"{what}: storage of {words} words is implausibly large (cap {MAX_STORAGE_BYTES >> 20} MiB)")
    if offset > words or (all(shape) and offset + sum((n - 1) * s for n, s in zip(shape, stride)) >= words):
        raise FixtureError(f"{what}: shape {shape}, stride {stride}, offset {offset} reach past its "
                           f"{words}-word storage")
    if math.prod(shape) * size > MAX_VIEW_BYTES:
        raise FixtureError(f"{what}: shape {shape} is {math.prod(shape)} elements, implausibly many (cap "
                           f"{MAX_VIEW_BYTES >> 20} MiB as a tensor; it views {words} stored words)")
    bits = t.get("bits")
    if not isinstance(bits, list) or not all(isinstance(line, str) for line in bits):
        raise FixtureError(f"{what}: bits is not a list of strings")
    word = re.compile(f"[0-9a-fA-F]{{1,{2 * size}}}")
    count = 0
    for i, line in enumerate(bits):
        for w in line.split():
            if not word.fullmatch(w):
                raise FixtureError(f"{what}: bits line {i}: {w[:40]!r} is not a {8 * size}-bit hex word")
            count += 1
    if count != words:
        raise FixtureError(f"{what}: {count} words of bits, storage_words says {words}")


def _check_kwargs(kwargs: Any) -> None:
    if not isinstance(kwargs, dict):
        raise FixtureError(f"kwargs is {type(kwargs).__name__}, not an object")
    for k, v in kwargs.items():
        if isinstance(v, dict) and (set(v) != {"dtype"} or v["dtype"] not in DTYPES):
            raise FixtureError(f"kwarg {k!r}: {v!r} is not a dtype object ({{\"dtype\": NAME}})")
        ints = v if isinstance(v, list) else [v]
        if any(isinstance(i, int) and abs(i) > MAX_KWARG_INT for i in ints):
            raise FixtureError(f"kwarg {k!r}: {v!r} is implausibly large (cap {MAX_KWARG_INT})")


def _check_work(tensors: dict[str, Any]) -> None:
    """What the replay allocates beyond the views: attention's output (query rows x Dv) and the
    oracle's scores (query rows x key rows: an upper bound, exact for one batch and head)."""
    if not all(isinstance(tensors.get(n), dict) and tensors[n]["shape"] for n in ("q", "k", "v")):
        return
    rows_q, rows_k = (math.prod(tensors[n]["shape"][:-1]) for n in ("q", "k"))
    out = rows_q * tensors["v"]["shape"][-1]
    if out * DTYPES[tensors["q"]["dtype"]].itemsize > MAX_VIEW_BYTES or rows_q * rows_k > MAX_SCORES:
        raise FixtureError(f"{rows_q} query rows, {rows_k} key rows: {rows_q * rows_k} scores and {out} output "
                           f"elements are implausibly many (caps: {MAX_SCORES} scores, {MAX_VIEW_BYTES >> 20} MiB "
                           "of output)")


def read_fixture(path: Path | str) -> dict[str, Any]:
    """A fixture's payload, every field checked; FixtureError('bad fixture PATH: why') otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise FixtureError(f"{size} bytes is implausibly large (cap {MAX_FILE_BYTES >> 20} MiB)")
        payload = json.loads(path.read_text())
        if not isinstance(payload, dict):
            raise FixtureError(f"the file holds a JSON {type(payload).__name__}, not an object")
        if payload.get("format") not in (1, FIXTURE_FORMAT):
            raise FixtureError(f"unknown fixture format {payload.get('format')!r} (expected {FIXTURE_FORMAT})")
        for key in ("kernel", "property"):
            if not isinstance(payload.get(key), str) or not payload[key]:
                raise FixtureError(f"{key} is {payload.get(key)!r}, not a name")
        for key in ("identity", "target", "label"):
            if payload.get(key) is not None and not isinstance(payload[key], str):
                raise FixtureError(f"{key} is {type(payload[key]).__name__}, not a string")
        if payload.get("family") not in families.names():
            raise FixtureError(f"family is {payload.get('family')!r}, not one of {', '.join(families.names())}")
        _check_kwargs(payload.get("kwargs"))
        tensors = payload.get("tensors")
        if not isinstance(tensors, dict) or not tensors:
            raise FixtureError(f"tensors is {type(tensors).__name__ if tensors is not None else 'missing'}, "
                               "not an object of tensors")
        total = viewed = 0
        for name, t in tensors.items():
            _check_tensor(name, t)
            total += t["storage_words"] * DTYPES[t["dtype"]].itemsize
            viewed += math.prod(t["shape"]) * DTYPES[t["dtype"]].itemsize
        if total > MAX_STORAGE_BYTES or viewed > MAX_VIEW_BYTES:
            raise FixtureError(f"{max(total, viewed)} bytes of tensors is implausibly large (cap "
                               f"{MAX_STORAGE_BYTES >> 20} MiB)")
        _check_work(tensors)
    except FixtureError as e:
        raise FixtureError(f"bad fixture {path}: {e}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FixtureError(f"bad fixture {path}: unreadable ({type(e).__name__}: {e})") from None
    return payload


def _decode_tensor(d: dict[str, Any], device: torch.device) -> torch.Tensor:
    dtype = DTYPES[d["dtype"]]
    # fromiter, not a list: a list of Python ints is ~36 bytes a word, 18 times an fp16 storage
    words = np.fromiter((int(w, 16) for line in d["bits"] for w in line.split()), dtype=WORD[dtype.itemsize],
                        count=int(d["storage_words"]))
    base = torch.from_numpy(words.view(np.uint8).copy()).view(dtype).to(device)
    return base.as_strided(d["shape"], d["stride"], d["storage_offset"])


def case_of(payload: dict[str, Any], device: torch.device, path: Path | str = "") -> Any:
    """The Case a checked payload (read_fixture) describes, its tensors on `device`."""
    from flashcheck.strategies.case import Case

    try:
        return Case(tensors={k: _decode_tensor(t, device) for k, t in payload["tensors"].items()},
                    kwargs={k: _unjson(v) for k, v in payload["kwargs"].items()},
                    label=payload.get("label") or "")
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise FixtureError(f"bad fixture {path}: bad tensor data ({type(e).__name__}: {e})") from None


def load_fixture(path: Path | str, device: torch.device) -> tuple[dict[str, Any], Any]:
    payload = read_fixture(path)
    return payload, case_of(payload, device, path)


# ---- which fixture replays against which kernel --------------------------------------------------------

class Replay:
    """One fixture file's fate: "run" (against `spec`), "bad" (a bad fixture: its own failure) or
    "skip" (not for the kernels under test). `reason` says why, or notes a forced replay."""

    def __init__(self, path: Path, status: str, reason: str = "", spec: Any = None,
                 payload: dict[str, Any] | None = None) -> None:
        self.path, self.status, self.reason, self.spec, self.payload = Path(path), status, reason, spec, payload

    def __repr__(self) -> str:
        return f"Replay({self.path.name}, {self.status})"


def plan_replays(paths: list[Path], specs: list[Any], *, force: bool = False) -> list[Replay]:
    """Match fixtures to the kernels under test by identity. force (one kernel, fixture files named
    by the user): replay each against it even when it was recorded for another, with a note."""
    from flashcheck.properties import PROPERTIES, load_properties
    from flashcheck.kernels.registry import PRODUCTION

    load_properties()
    out = []
    for path in paths:
        try:
            payload = read_fixture(path)
        except FixtureError as e:
            out.append(Replay(path, "bad", str(e)))
            continue
        ident, family = payload_identity(payload), payload["family"]
        matches = [s for s in specs if s.family == family and kernel_identity(s) == ident]
        note = ""
        if not matches and force and len(specs) == 1 and specs[0].family == family:
            matches = list(specs)
            note = f"recorded for {ident or payload['kernel']}, replayed against {kernel_identity(specs[0])} as asked"
        registered = {s.name for s in PRODUCTION}
        if not matches:
            if ident and ident.startswith("registered:") and ident.removeprefix("registered:") not in registered:
                out.append(Replay(path, "bad", f"bad fixture {path}: its kernel {ident} is not registered "
                                               f"(registered: {', '.join(sorted(registered))})", payload=payload))
            elif ident is None:
                out.append(Replay(path, "skip", f"format-1 fixture of external kernel {payload['kernel']!r}, named "
                                                "by file stem only: replay it with `flashcheck replay "
                                                f"{shlex.quote(str(path))} --kernel TARGET`", payload=payload))
            else:
                out.append(Replay(path, "skip", f"not for this kernel: a fixture of {ident}", payload=payload))
            continue
        if (family, payload["property"]) not in PROPERTIES:
            out.append(Replay(path, "bad", f"bad fixture {path}: unknown {family} property {payload['property']!r}",
                              payload=payload))
            continue
        _, needed, _, _ = families.get(family).module("properties").kernel_call(matches[0], list(payload["tensors"]))
        missing = [n for n in needed if n not in payload["tensors"]]
        if missing:  # else the property's KeyError would read as the kernel's failure
            out.append(Replay(path, "bad", f"bad fixture {path}: no tensor {', '.join(map(repr, missing))} (the kernel "
                                           f"is called on {', '.join(needed)})", payload=payload))
            continue
        out.append(Replay(path, "run", note, spec=matches[0], payload=payload))
    return out


def replay_dirs(specs: list[Any]) -> list[Path]:
    """Where a run's fixtures are replayed from: its fixture folder, plus flashcheck's own committed
    ones when a registered kernel is under test (reading them is harmless wherever the run writes)."""
    dirs = [fixture_dir()]
    if any(kernel_identity(s).startswith("registered:") for s in specs) and not is_suite_dir(dirs[0]):
        dirs.append(DEFAULT_FIXTURE_DIR)
    return dirs
