"""What a kernel's signature says it takes (issue 18: declarations read from the signature).

The suite passes each optional feature as a keyword (attention: `causal=`, `scale=`, `window=`,
...; softmax: `out=`; cross-entropy: `weight=`, `label_smoothing=`, `z_loss=`, `softcap=`,
`ignore_index=`, `reduction=`, `inplace_backward=`). A plain function whose signature lacks a feature's keyword, and has no
`**kwargs`, cannot take that feature: it is inferred absent (never drawn), and calls that ask
for nothing through it (`causal=False`, `scale=None`, ...) reach the function without the
keyword. `**kwargs` accepts anything: the declarations (or the defaults: everything) stand.

An explicit declaration wins over the inference, but one the signature contradicts (a feature
declared, its keyword not taken; a launch config naming a keyword not taken) is a load error.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
import json
from typing import Any, Callable, Mapping

#: How a declaration (or a command line) writes false.
FALSE_WORDS = ("0", "false", "no", "off")

#: Capability key -> the keyword the suite passes the feature as, per family.
KEYWORDS: dict[str, dict[str, str]] = {
    "attention": {"causal": "causal", "custom_scale": "scale", "kv_lens": "kv_lens", "window": "window",
                  "softcap": "softcap", "lse": "return_lse", "attn_mask": "attn_mask", "splits": "num_splits",
                  "causal_align": "causal_align"},
    "softmax": {"out": "out"},
    "cross_entropy": {"weight": "weight", "label_smoothing": "label_smoothing", "z_loss": "z_loss", "softcap": "softcap",
                      "ignore_index": "ignore_index", "reductions": "reduction", "inplace_backward": "inplace_backward"},
}
#: Keys whose value is a set of choices passed through one keyword: without the keyword a kernel
#: implements one (the first listed: SDPA's alignment, torch's default reduction).
ONE_OF = {"causal_align": ("top_left",), "reductions": ("mean",)}


def asks_nothing(keyword: str, value: Any, aligns: tuple[str, ...] = ()) -> bool:
    """Whether `keyword=value` asks for nothing a function without the keyword does not do (`aligns`:
    the choices it declares for a one-of keyword, causal_align or reduction)."""
    if keyword in ("causal_align", "reduction"):  # the one choice it implements, keyword or not
        return len(aligns) == 1 and value == aligns[0]
    if value is None:
        return True
    if keyword in ("causal", "return_lse", "inplace_backward"):
        return value is False
    if keyword == "ignore_index":
        return not isinstance(value, bool) and value == -100  # torch's default
    if keyword in ("label_smoothing", "z_loss"):
        return not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0
    if keyword == "window":
        return isinstance(value, (tuple, list)) and tuple(value) == (-1, -1)
    if keyword in ("softcap", "num_splits"):
        return not isinstance(value, bool) and isinstance(value, (int, float)) and value == (0 if keyword == "softcap" else 1)
    return False


@dataclass(frozen=True)
class Accepted:
    """The keywords a function takes (None: `**kwargs`, anything) and its signature as text."""

    keywords: frozenset[str] | None
    text: str

    def takes(self, keyword: str) -> bool:
        return self.keywords is None or keyword in self.keywords


def accepted(fn: Callable) -> Accepted | None:
    """What `fn` takes, or None when it has no readable signature (a builtin, a C extension)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return Accepted(None, f"{getattr(fn, '__name__', 'fn')}{sig}")
    names = frozenset(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD))
    return Accepted(names, f"{getattr(fn, '__name__', 'fn')}{sig}")


def _declared_false(value: Any) -> bool:
    """A declaration that says the feature is absent (False, 0 or a false word)."""
    return (isinstance(value, str) and value.strip().lower() in FALSE_WORDS) or (
        not isinstance(value, str) and value == 0)


def contradictions(acc: Accepted | None, family: str, declared: Mapping[str, Any], origin: str) -> list[str]:
    """One line per declaration in `declared` (raw capability dict) the signature cannot honour."""
    if acc is None or acc.keywords is None:
        return []
    out = []
    for key, keyword in KEYWORDS.get(family, {}).items():
        if key not in declared or acc.takes(keyword):
            continue
        value = declared[key]
        if key in ONE_OF:
            many = value.split(",") if isinstance(value, str) else ([value] if isinstance(value, str) else list(value))
            if len(many) > 1:
                what = "alignments" if key == "causal_align" else key
                out.append(f"{origin}: {key}={value!r} declares {len(many)} {what}, but {acc.text} "
                           f"takes no `{keyword}` keyword to choose one (declare the one it implements)")
        elif not _declared_false(value):
            out.append(f"{origin}: {key}={value!r} declares `{keyword}=`, but {acc.text} takes no `{keyword}` "
                       f"keyword (declare {key}=false, or add the keyword)")
    for kind in ("configs", "tunings"):
        try:
            entries = configs(declared.get(kind) or ())
        except ValueError:
            continue  # malformed: apply_capabilities names it
        for cfg in entries:
            lacking = sorted(k for k in dict(cfg) if not acc.takes(k))
            if lacking:
                out.append(f"{origin}: {kind} entry {dict(cfg)!r} passes {', '.join(lacking)}, which {acc.text} "
                           f"does not take")
    return out


def inferred(acc: Accepted | None, family: str, declared: Mapping[str, Any]) -> dict[str, Any]:
    """Capabilities the signature implies for the keys `declared` leaves open."""
    if acc is None or acc.keywords is None:
        return {}
    out: dict[str, Any] = {}
    for key, keyword in KEYWORDS.get(family, {}).items():
        if key in declared or acc.takes(keyword):
            continue
        # Without the keyword a kernel implements one choice: SDPA's alignment, torch's default reduction.
        out[key] = list(ONE_OF[key]) if key in ONE_OF else False
    return out


def adapt(fn: Callable, acc: Accepted | None, family: str, aligns: tuple[str, ...]) -> Callable:
    """`fn` called without the feature keywords it lacks when their value asks for nothing (the
    suite passes `causal=False, scale=None` to every attention kernel, `ignore_index=-100` to every
    cross-entropy kernel; `aligns`: the one choice of its one-of keyword); any other value still
    reaches it, so a call it cannot take fails loudly rather than being changed."""
    if acc is None or acc.keywords is None:
        return fn
    missing = frozenset(k for k in KEYWORDS.get(family, {}).values() if not acc.takes(k))
    if not missing:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        for key in missing & kw.keys():
            if asks_nothing(key, kw[key], aligns):
                del kw[key]
        return fn(*args, **kw)

    return call


def describe(spec: Any) -> str | None:
    """The header line: what was read from the kernel's signature (None: nothing was)."""
    info = (getattr(spec, "extra", None) or {}).get("signature")
    if not info:
        return None
    if info["accepts_any"]:
        return f"signature {info['text']}: takes any keyword (**kwargs): features as declared"
    absent = info["absent"]
    text = f"signature {info['text']}: "
    text += f"absent (no keyword): {', '.join(absent)}" if absent else "every feature keyword taken"
    if "causal_align" in absent:
        text += "; causal alignment assumed top_left (declare causal_align=bottom_right if it aligns to the end)"
    return text


def configs(v: Any) -> tuple[dict[str, Any], ...]:
    """A list of launch-keyword dicts; a command line writes it as JSON (`configs=[{"block": 64}]`)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise ValueError(f"{v!r} is not JSON (write a list of objects: [{{\"block\": 64}}])") from None
    if isinstance(v, Mapping) or not isinstance(v, (list, tuple)) or not all(
            isinstance(c, Mapping) and all(isinstance(k, str) for k in c) for c in v):
        raise ValueError(f"{v!r} is not a list of keyword dicts (e.g. [{{\"block\": 64}}])")
    return tuple(dict(c) for c in v)
