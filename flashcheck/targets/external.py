"""Turn a kernel author's function into a `KernelSpec`: where it is, and what it declares.

A target is `path/to/file.py:fn`, `package.module:fn`, or the name of a registered kernel. The
function may carry a `flashcheck` dict of capabilities (or be a `KernelSpec` itself); command-line
flags override the dict. Declarations only narrow what the suite draws: an undeclared capability
is assumed supported, so a call the kernel cannot take fails the run instead of passing silently.

Every problem with the target or a declaration is a `KernelLoadError` whose message is one line
naming the file, attribute or key at fault.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import torch

from flashcheck.targets import signature
from flashcheck.targets.signature import FALSE_WORDS, configs
from flashcheck.fixtures.store import target_identity
from flashcheck.families import names as family_names
from flashcheck.kernels.registry import REGISTRY, SPEC_TYPES, KernelSpec
from flashcheck.oracles.formats import BY_NAME
from flashcheck.isolation import hooks as kernel_hooks

kernel_hooks.attach()


class KernelLoadError(ValueError):
    """The kernel target or one of its declarations is unusable (the message names which)."""


# ---- declarations -------------------------------------------------------------------------------

def _dtypes(v: Any) -> tuple[torch.dtype, ...]:
    names = v.split(",") if isinstance(v, str) else list(v)
    out = []
    for n in names:
        if isinstance(n, torch.dtype):
            out.append(n)
            continue
        key = str(n).strip().removeprefix("torch.")
        key = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}.get(key, key)
        if key not in BY_NAME:
            raise ValueError(f"unknown dtype {n!r} ({', '.join(BY_NAME)})")
        out.append(BY_NAME[key].torch_dtype)
    if not out:
        raise ValueError("no dtype given")
    return tuple(dict.fromkeys(out))


def _positive_int(v: Any) -> int:
    if isinstance(v, str) and v.strip().lstrip("+").isdigit():  # a command line's --kernel-cap KEY=2
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or int(v) < 1:
        raise ValueError(f"{v!r} is not a positive integer")
    return int(v)


def _bool(v: Any) -> bool:
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in FALSE_WORDS:
            return False
    if isinstance(v, bool):
        return v
    raise ValueError(f"{v!r} is not true or false")


def _validation(v: Any) -> bool | str:
    return "typed" if v == "typed" else _bool(v)


def _ints(v: Any) -> tuple[int, ...]:
    items = v.split(",") if isinstance(v, str) else list(v)
    return tuple(sorted({_positive_int(int(i)) for i in items}))


class HeadDims:
    """A declared list of head dims, usable as the predicate `head_dims(d)`."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        self.dims = frozenset(dims)
        self.__doc__ = f"head dims {sorted(self.dims)}"

    def __call__(self, d: int) -> bool:
        return d in self.dims

    def __repr__(self) -> str:
        return f"HeadDims({sorted(self.dims)})"


def _head_dims(v: Any) -> Callable[[int], bool]:
    return v if callable(v) else HeadDims(_ints(v))


def _choice(*options: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if v not in options:
            raise ValueError(f"{v!r} is not one of {', '.join(options)}")
        return v
    return conv


def _aligns(v: Any) -> tuple[str, ...]:
    items = v.split(",") if isinstance(v, str) else ([v] if isinstance(v, str) else list(v))
    conv = _choice("top_left", "bottom_right")
    return tuple(conv(i.strip() if isinstance(i, str) else i) for i in items)


def _reductions(v: Any) -> tuple[str, ...]:
    items = v.split(",") if isinstance(v, str) else list(v)
    conv = _choice("mean", "sum", "none")
    out = tuple(conv(i.strip() if isinstance(i, str) else i) for i in items)
    if not out:
        raise ValueError("no reduction given")
    return out


def _empty_lse(v: Any) -> float:
    f = float(v)
    if not math.isinf(f):
        raise ValueError(f"{v!r} is not -inf or +inf")
    return f


def _callable(v: Any) -> Callable:
    if not callable(v):
        raise ValueError(f"{v!r} is not callable")
    return v


def _blocks(v: Any) -> Callable:
    """A (block_m, block_n) pair, or a callable giving one per call, as a callable."""
    if callable(v):
        return v
    items = v.split(",") if isinstance(v, str) else list(v)
    if len(items) != 2:
        raise ValueError(f"{v!r} is not (block_m, block_n)")
    pair = tuple(_positive_int(int(i)) for i in items)
    return lambda head_dim, head_dim_v, m, n, dtype, options: tuple(pair)


class Capability(NamedTuple):
    """A key of an author's `flashcheck` dict: the spec field it sets (`extra.KEY`: kept in the spec's
    extra), how its value is read, and what it means. Which families take it is not listed: those
    whose spec type has the field (`families_of`)."""

    field: str
    convert: Callable[[Any], Any]
    help: str


#: Capability key -> its Capability.
CAPABILITIES: dict[str, Capability] = {k: Capability(*v) for k, v in {
    "dtypes": ("dtypes", _dtypes, f"dtypes it takes: {', '.join(BY_NAME)}"),
    "min_n": ("min_n", _positive_int, "shortest row (softmax, log-softmax, backwards), key count (attention) "
                                      "or vocabulary (cross_entropy)"),
    "max_n": ("max_n", _positive_int, "longest row (softmax, log-softmax, backwards), key count (attention) "
                                      "or vocabulary (cross_entropy)"),
    "sizes": ("sizes", _ints, "sizes that matter to it (tiles, dispatch thresholds): "
                              "row/key lengths are drawn just below, at and above them"),
    "depth": ("depth", _callable, "depth(n): its summation depth for a row of n"),
    "validates_input": ("validates_input", _validation,
                        "it raises on bad input (dtype, rank, device, size): the bad-input tests run; "
                        "true: any exception, \"typed\": TypeError for dtypes, ValueError for the rest"),
    "contiguous_only": ("contiguous_only", _bool, "it takes contiguous inputs only"),
    "out": ("takes_out", _bool, "it accepts out= (guard-band tests run)"),
    "shift_exact": ("shift_exact", _bool, "exact shifts give identical bits (softmax, log_softmax)"),
    "configs": ("configs", configs, "launch kwargs that must give identical bits"),
    "tunings": ("tunings", configs, "launch kwargs that may change bits within the bound"),
    "head_dims": ("head_dims", _head_dims, "head dims it takes (list or predicate)"),
    "max_head_dim": ("max_head_dim", _positive_int, "largest head dim"),
    "square_only": ("square_only", _bool, "M = N only"),
    "causal": ("causal", _bool, "it takes causal=True"),
    "causal_align": ("causal_align", _aligns,
                     "causal alignment it implements: top_left (SDPA), bottom_right (FlashAttention)"),
    "kv_lens": ("kv_lens", _bool, "it takes kv_lens="),
    "custom_scale": ("custom_scale", _bool, "it takes scale="),
    "row_sum": ("row_sum", _choice("rounded_p", "fp32_p"),
                "row sum from the 16-bit P (V of ones exact) or the fp32 P (within 1 ulp)"),
    "empty_row_lse": ("lse_empty", _empty_lse, "lse of a row with no visible key: -inf (torch) or +inf (FlashAttention 2)"),
    "block_n": ("block_n", _positive_int, "its key block: the bound's blocking"),
    "bitwise_invariant": ("bitwise_invariant", _bool,
                          "same bits for any layout and query order (checked bitwise when declared)"),
    "lse_empty": ("lse_empty", _empty_lse, "same as empty_row_lse"),
    **{f: (f, _bool, what) for f, what in (
        ("gqa", "Hq a multiple of Hkv (GQA/MQA)"), ("dv", "v's head dim may differ from q/k's"),
        ("window", "window=(left, right)"),
        ("softcap", "softcap=c (attention: c tanh(s / c) on the scores; cross_entropy: on the logits)"),
        ("lse", "return_lse=True gives (o, lse)"),
        ("attn_mask", "attn_mask= (bool or float bias)"), ("splits", "num_splits="),
        ("varlen", "a packed entry point, given as varlen_fn"))},
    "max_numel": ("extra.max_numel", _positive_int,
                  "most elements of any one input tensor it takes (grid, 32-bit offset or memory limits)"),
    "fp32_dot": ("fp32_dot", _choice("ieee", "tf32"),
                 "how its matmuls read fp32 operands: ieee (exact products) or tf32 (tl.dot's default: 10 "
                 "mantissa bits; the bound adds the derived tf32 terms, oracles.bounds.dot_input_error)"),
    "varlen_fn": ("varlen_fn", _callable,
                  "fn(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k, ...)"),
    **{f: (f, _bool, f"cross_entropy: it takes {what}") for f, what in (
        ("weight", "weight= (class weights (V,))"), ("label_smoothing", "label_smoothing="),
        ("z_loss", "z_loss= (z lse^2 per row, PaLM)"),
        ("ignore_index", "ignore_index= (without it, targets of -100 are still ignored)"),
        ("inplace_backward", "inplace_backward=True (the gradient written into the logits' storage)"))},
    "reductions": ("reductions", _reductions, "cross_entropy: the reductions it takes as reduction= (mean, sum, none; "
                                             "without the keyword: mean)"),
    "with_grad": ("with_grad", _callable, "cross_entropy: fn(logits, target, grad_output, **options) -> (loss, grad): "
                                          "its gradient when the loss it returns carries no grad_fn"),
    "block_v": ("block_v", _positive_int, "cross_entropy: its vocabulary chunk, the bound's blocking (default: the "
                                         "worst case, one column a chunk)"),
    "arithmetic": ("arithmetic", _choice("natural", "fused"),
                   "cross_entropy: natural (lse formed in fp32, the default) or fused (m - x_t exact, the exponent "
                   "from x - m, float64 rows: docs/NUMERICS.md 9.7): the bound's model"),
    "autograd": ("autograd", _bool, "its output carries autograd: the backward is checked through it "
                                    "(default: found out on the first call)"),
    "backward_fn": ("backward_fn", _callable, "fn(q, k, v, o, lse, do, **options) -> (dq, dk, dv): a plain "
                                              "backward, checked when the output carries no autograd"),
    "deterministic_backward": ("deterministic_backward", _bool, "bit-identical dq, dk, dv run to run (checked)"),
    "backward_blocks": ("backward_blocking", _blocks, "(block_m, block_n) of its backward, or a callable "
                                                      "(head_dim, head_dim_v, m, n, dtype, options) -> (block_m, "
                                                      "block_n): "
                                                      "the backward bound's blocking (default: the worst case)"),
}.items()}


def families_of(key: str) -> tuple[str, ...]:
    """The families whose kernels take capability `key`: those whose spec type has its field (a
    field kept in extra: every family)."""
    field = CAPABILITIES[key].field
    if field.startswith("extra."):
        return family_names()
    return tuple(f for f in family_names() if field in {x.name for x in dataclasses.fields(SPEC_TYPES[f])})


#: The command-line flag of a capability (`--kernel-cap KEY=VALUE` for the others): messages name it.
FLAGS = {"dtypes": "--kernel-dtypes", "min_n": "--kernel-min-n", "max_n": "--kernel-max-n", "sizes": "--kernel-sizes"}
COMMAND_LINE = "command line"


def flag(key: str, value: Any) -> str:
    """A declaration as a command line writes it (`--kernel-min-n 5000`, `--kernel-cap KEY=VALUE`)."""
    return f"{FLAGS[key]} {value}" if key in FLAGS else f"--kernel-cap {key}={value}"


def _declared_by(key: str, value: Any, origin: str) -> str:
    """How a declaration was made, as a user would write it again (skip reasons name it)."""
    return flag(key, value) if origin == COMMAND_LINE else f"{key}={value!r} ({origin})"


def apply_capabilities(base: dict[str, Any], caps: Mapping[str, Any], family: str, origin: str) -> dict[str, Any]:
    """KernelSpec keyword arguments from `base` updated by the declarations in `caps` (each one's
    origin kept in extra["declared"]; fields named `extra.KEY` live in extra)."""
    out = dict(base)
    extra = dict(out.get("extra") or {})
    declared = dict(extra.get("declared") or {})
    for key, value in caps.items():
        if key not in CAPABILITIES:
            raise KernelLoadError(f"{origin}: unknown capability {key!r}; known: {', '.join(sorted(CAPABILITIES))}")
        field, conv, _ = CAPABILITIES[key]
        families = families_of(key)
        if family not in families:
            raise KernelLoadError(f"{origin}: capability {key!r} is for {'/'.join(families)} kernels, "
                                  f"not {family}")
        try:
            converted = conv(value)
        except (TypeError, ValueError) as e:
            raise KernelLoadError(f"{origin}: capability {key!r}: {e}") from None
        if field.startswith("extra."):
            extra[field.removeprefix("extra.")] = converted
        else:
            out[field] = converted
        declared[key] = _declared_by(key, value, origin)
    extra["declared"] = declared
    if out.get("min_n") and out.get("max_n") and out["min_n"] > out["max_n"]:
        raise KernelLoadError(f"{origin}: min_n {out['min_n']} > max_n {out['max_n']}")
    # Declarations that could only be ignored: an error, not silence.
    if caps.get("varlen") not in (None, False) and out.get("varlen") and out.get("varlen_fn") is None:
        raise KernelLoadError(f"{origin}: varlen=true needs varlen_fn (its packed entry point): without it no "
                              f"varlen case can be called")
    if any(k in caps for k in ("empty_row_lse", "lse_empty")) and out.get("lse") is False:
        raise KernelLoadError(f"{origin}: empty_row_lse applies to an lse, but lse=false (no return_lse)")
    if extra:
        out["extra"] = extra
    return out


#: Declarations that narrow what the suite may draw: a test left with nothing to draw names them.
NARROWING = ("dtypes", "min_n", "max_n", "max_numel", "head_dims", "max_head_dim", "square_only", "causal",
             "kv_lens", "custom_scale", "causal_align", "gqa", "dv", "weight", "label_smoothing", "z_loss",
             "ignore_index", "reductions")


def declared_as(spec: KernelSpec, key: str) -> str:
    """One declaration as it was made (`--kernel-min-n 5000`), or its value (`min_n=5000`)."""
    declared = (spec.extra or {}).get("declared") or {}
    field = CAPABILITIES[key][0]
    value = (spec.extra or {}).get(field.removeprefix("extra.")) if field.startswith("extra.") else getattr(spec, field)
    return declared.get(key) or f"{key}={value!r}"


def narrowing(spec: KernelSpec) -> list[str]:
    """The kernel's narrowing declarations as they were made (`--kernel-min-n 5000`,
    `head_dims=[16, 32] (k.py:fn.flashcheck)`); registered kernels' own limits are not listed."""
    declared = (spec.extra or {}).get("declared") or {}
    return [declared[k] for k in NARROWING if k in declared]


# ---- loading ------------------------------------------------------------------------------------

def _split_target(target: str) -> tuple[str, str]:
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise KernelLoadError(f"kernel {target!r}: expected FILE.py:FUNCTION, package.module:FUNCTION "
                              f"or a registered name ({', '.join(s.name for s in REGISTRY)})")
    return where, attr


class _ExitAtImport(BaseException):  # not an Exception: a module's own `except Exception` must not swallow it
    pass


@contextlib.contextmanager
def _exits_refused():
    """os._exit while the kernel's module is imported: refused and named, not a silent exit (0 passed CI).
    A process-wide swap for the import only; exits from kernel calls are the isolation's to name."""
    real = os._exit

    def refuse(code: int = 0) -> None:
        raise _ExitAtImport(f"os._exit({code})")

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise KernelLoadError(f"kernel file {path}: no such file")
    name = f"flashcheck_external_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded  # `flashcheck check` loads the target, then its in-process pytest run does
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"kernel file {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    # The file's own folder first, as `python file.py` would: its sibling imports resolve.
    sys.path.insert(0, str(path.parent))
    try:
        with _exits_refused():
            spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise KernelLoadError(f"kernel file {path}:{e.lineno}: syntax error: {e.msg}") from None
    except _ExitAtImport as e:
        sys.modules.pop(name, None)
        raise KernelLoadError(f"kernel file {path}: importing it called {e}") from None
    except ImportError as e:
        sys.modules.pop(name, None)
        package = _package_of(path) if "no known parent package" in str(e) else None
        if package is None:
            raise KernelLoadError(f"kernel file {path}: importing it raised {type(e).__name__}: {e}") from None
        return _import_module(package)  # a module of a package, with relative imports: import it as one
    except (Exception, SystemExit) as e:  # sys.exit(0) at import must not end a check green
        sys.modules.pop(name, None)
        raise KernelLoadError(f"kernel file {path}: importing it raised {type(e).__name__}: {e}") from None
    return module


def _package_of(path: Path) -> str | None:
    """The dotted name of a file inside a package (folders with __init__.py), its root put on the
    path; this checkout's own folders are flashcheck's (kernels/softmax.py is flashcheck.kernels.softmax)."""
    from flashcheck import HOME

    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if len(parts) == 1:
        return None
    if folder == HOME and importlib.util.find_spec(f"flashcheck.{parts[0]}") is not None:
        return ".".join(["flashcheck", *parts])
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return ".".join(parts)


def _from_working_folder(dotted: str) -> None:
    """A dotted target whose package sits in the working folder imports as under `python -m`: the
    folder goes on the path, for this process and the pytest workers it starts."""
    top, here = dotted.split(".")[0], str(Path.cwd())
    if here not in sys.path and ((Path(here) / top).is_dir() or (Path(here) / f"{top}.py").is_file()):
        sys.path.insert(0, here)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)


def _import_module(dotted: str) -> Any:
    if importlib.util.find_spec(dotted.split(".")[0]) is None:
        _from_working_folder(dotted)
    try:
        with _exits_refused():
            return importlib.import_module(dotted)
    except _ExitAtImport as e:
        raise KernelLoadError(f"kernel module {dotted!r}: importing it called {e}") from None
    except ModuleNotFoundError as e:
        raise KernelLoadError(f"kernel module {dotted!r}: {e}") from None
    except SyntaxError as e:
        raise KernelLoadError(f"kernel module {dotted!r}: {e.filename}:{e.lineno}: syntax error: {e.msg}") from None
    except (Exception, SystemExit) as e:
        raise KernelLoadError(f"kernel module {dotted!r}: importing it raised {type(e).__name__}: {e}") from None


#: The keyword an autotuned launcher's wrapper takes to run one forced config (a tuning's label).
TUNING_KWARG = "flashcheck_autotune_config"


def _with_autotune_tunings(fn: Callable) -> tuple[Callable, tuple[dict[str, Any], ...]]:
    """A launcher whose kernels are `@triton.autotune`d: every config becomes a tuning (each must
    meet the bound), run by forcing it; the plain call runs the autotuner's own choice."""
    from flashcheck.interpreter import autotune

    found = autotune.tunings(fn)
    if not found:
        return fn, ()
    by_label = {t.label: t for t in found}

    def launcher(*args: Any, **kw: Any) -> Any:
        label = kw.pop(TUNING_KWARG, None)
        if label is None:
            return fn(*args, **kw)
        with by_label[label]():
            return fn(*args, **kw)

    launcher.__name__ = getattr(fn, "__name__", "launcher")
    launcher.__doc__ = fn.__doc__
    launcher.__wrapped__ = fn  # type: ignore[attr-defined]
    return launcher, tuple({TUNING_KWARG: label} for label in by_label)


def load_kernel(target: str, family: str | None = None, *, overrides: Mapping[str, Any] | None = None) -> KernelSpec:
    """The KernelSpec for `target` (FILE.py:FN, package.module:FN or a registered name).

    family: required for a plain function, checked against a KernelSpec's. overrides: capability
    declarations that replace the function's own `flashcheck` dict entries (command-line flags).
    """
    if family is not None and family not in family_names():
        raise KernelLoadError(f"--family {family!r}: expected one of {', '.join(family_names())}")
    if ":" not in target:
        for s in REGISTRY:
            if s.name == target:
                if family is not None and s.family != family:
                    raise KernelLoadError(f"kernel {target!r} is a {s.family} kernel, not {family}")
                return with_overrides(s, overrides)
    where, attr = _split_target(target)
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    module = _import_file(Path(where).resolve()) if is_file else _import_module(where)
    label = where if is_file else f"module {where}"
    try:
        obj = getattr(module, attr)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise KernelLoadError(f"kernel {label}: no attribute {attr!r} (callables: {', '.join(public[:20])})") from None
    # Its fixtures are keyed by where it lives, never by a name a file chose (flashcheck.fixtures.store).
    keys = {"target": target, "identity": target_identity(where, attr, is_file=is_file)}
    if isinstance(obj, KernelSpec):
        if family is not None and obj.family != family:
            raise KernelLoadError(f"kernel {label}:{attr} is a {obj.family} kernel, not {family}")
        return with_overrides(dataclasses.replace(obj, external=True, extra={**obj.extra, **keys}), overrides)
    if not callable(obj):
        raise KernelLoadError(f"kernel {label}:{attr} is {type(obj).__name__}, not callable")
    if family is None:
        raise KernelLoadError(f"kernel {label}:{attr}: say which suite runs with --family "
                              f"({', '.join(family_names())})")
    caps = getattr(obj, "flashcheck", None) or {}
    if not isinstance(caps, Mapping):
        raise KernelLoadError(f"kernel {label}:{attr}: its `flashcheck` attribute is "
                              f"{type(caps).__name__}, not a dict")
    # What its signature cannot take is absent; declarations win, but not against the signature.
    acc = signature.accepted(obj)
    problems = (signature.contradictions(acc, family, caps, f"{label}:{attr}.flashcheck")
                + signature.contradictions(acc, family, overrides or {}, COMMAND_LINE))
    if problems:
        raise KernelLoadError(problems[0])
    implied = signature.inferred(acc, family, {**caps, **(overrides or {})})
    # Nothing is promised that the author did not declare: no input validation by default.
    kwargs = apply_capabilities({"validates_input": False, "bitwise_invariant": False}, implied, family,
                                "its signature")
    kwargs = apply_capabilities(kwargs, caps, family, f"{label}:{attr}.flashcheck")
    kwargs = apply_capabilities(kwargs, overrides or {}, family, COMMAND_LINE)
    stem = Path(where).stem if is_file else where.rsplit(".", 1)[-1]
    kwargs["extra"] = {**kwargs.get("extra", {}), **keys}
    # Left open by the dict, the flags and the signature: assumed supported, so a clean refusal of
    # one is a skip naming it (flashcheck.properties.refusals); a KernelSpec spells out all of its fields.
    kwargs["extra"]["assumed"] = sorted(set(CAPABILITIES) - set(kwargs["extra"].get("declared") or ()))
    if acc is not None:
        kwargs["extra"]["signature"] = {"text": acc.text, "accepts_any": acc.keywords is None,
                                        "absent": sorted(implied)}
    obj, autotuned = _with_autotune_tunings(obj)
    if autotuned:
        kwargs["tunings"] = tuple(kwargs.get("tunings", ())) + autotuned
    obj = signature.adapt(obj, acc, family, tuple(kwargs.get("causal_align") or kwargs.get("reductions") or ()))
    return KernelSpec(name=f"{stem}.{attr}", family=family, fn=obj, external=True,
                      description=f"external kernel {target}", **kwargs)


def with_overrides(spec: KernelSpec, overrides: Mapping[str, Any] | None) -> KernelSpec:
    """A registered kernel (or a file's KernelSpec) with the command line's declarations applied:
    a flag is used or rejected with its reason, never ignored."""
    if not overrides:
        return spec
    acc = signature.accepted(spec.fn)
    problems = signature.contradictions(acc, spec.family, overrides, COMMAND_LINE)
    if problems:
        raise KernelLoadError(problems[0])
    kwargs = apply_capabilities({"extra": dict(spec.extra)}, overrides, spec.family, COMMAND_LINE)
    return dataclasses.replace(spec, **kwargs)
