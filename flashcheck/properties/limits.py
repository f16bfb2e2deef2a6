"""Limits, not numerics (issue 18): a kernel that fails because an input is past what this device
or its launch can take is told so, with the declaration that would skip that input.

`classify` is the one place that maps a kernel's exception to a limit:

| raised                                               | limit               | declaration                    |
|------------------------------------------------------|---------------------|--------------------------------|
| triton `OutOfResources` (shared memory, registers)   | per-block resources | softmax `max_n`, attention `max_head_dim` |
| `Triton Error [CUDA]: invalid argument`, the interpreter's grid check (`interp_gpu`) | launch / grid limits | `max_numel` |
| `torch.OutOfMemoryError` / "CUDA out of memory"      | device memory       | `max_numel`                    |

Each declared value is this input's size minus one: Hypothesis shrinks a failure to the smallest
input that still fails, so the shrunk example's hint is the largest size the kernel can take.
`properties.check` (every property) and the tests that call a kernel directly (`diagnosed`) raise
`KernelLimit` from the original exception. An fp32 attention result off by what TF32 matmuls give
is not an exception: `tf32_hint` says so where the bound is checked.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Iterator

import torch


class KernelLimit(RuntimeError):
    """The kernel hit a limit of the device or launch on this input (the message names the
    declaration that skips it); a failure of the run, not of the kernel's numerics."""


def _sizes(spec: Any, tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    ts = [t for t in tensors.values() if isinstance(t, torch.Tensor)]
    out = {"numel": max((t.numel() for t in ts), default=0)}
    from flashcheck.families import get

    family = get(spec.family)  # its record names the input whose length a limit names, and the axis
    main = tensors.get(family.length_input)
    if main is not None and main.dim() >= 1:
        out["n"] = int(main.shape[family.length_axis] if main.dim() >= -family.length_axis else main.shape[-1])
    out.update(family.hook("limit_sizes")(tensors))  # the family's own (attention: d)
    return out


def _declare(key: str, value: int) -> str:
    from flashcheck.targets.external import flag

    return f"declare `{key}={value}` ({flag(key, value)}) to skip inputs this large"


def classify(exc: BaseException, spec: Any, tensors: dict[str, torch.Tensor]) -> str | None:
    """'limit reached: ...' for an exception that is a device or launch limit, else None."""
    from flashcheck.interpreter.gpu import GpuIncompatible

    text, name = str(exc), type(exc).__name__
    size = _sizes(spec, tensors)
    where = f"{spec.name} on {', '.join(f'{k}={v}' for k, v in size.items())}"
    if name == "OutOfResources" or "out of resource" in text.lower():
        m = re.search(r"out of resource:\s*([a-z ]+?)(?:,|$)", text, re.I)
        resource = getattr(exc, "name", None) or (m.group(1).strip() if m else "resources")
        need = getattr(exc, "required", None)
        have = getattr(exc, "limit", None)
        amount = f" ({need} needed, {have} per block on this GPU)" if need is not None and have is not None else ""
        from flashcheck.families import get

        decl = get(spec.family).hook("resource_declaration")(size, resource, _declare)
        decl = decl or _declare("max_n", max(1, size.get("n", 1) - 1))
        return f"limit reached: out of {resource}{amount}: {where}; {decl}"
    launch = ("invalid argument" in text and ("CUDA" in text or "Triton Error" in text)) or \
        (isinstance(exc, GpuIncompatible) and "grid dimension" in text)
    if launch:
        past = " (past 2^31 elements: a grid or 32-bit offset limit)" if size["numel"] >= 2**31 else ""
        return (f"limit reached: the launch was rejected (grid or launch configuration limit){past}: {where}; "
                f"{_declare('max_numel', max(1, size['numel'] - 1))}")
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in text:
        return f"limit reached: out of GPU memory: {where}; {_declare('max_numel', max(1, size['numel'] - 1))}"
    return None


class KernelUnsupported(RuntimeError):
    """The kernel raised on an input using a feature no signature can show (grouped heads, a v head
    dim of its own, M != N): still its failure, as undeclared means supported, but the message
    names the feature and the declaration that leaves it out."""


def feature_hint(spec: Any, tensors: dict[str, torch.Tensor]) -> str | None:
    """For an input that raised: the shape features it used, each with its declaration (the family's
    properties module says which: softmax the row's length, attention grouped heads, Dv, M != N)."""
    from flashcheck.families import get
    from flashcheck.targets.external import flag

    return get(spec.family).hook("feature_hint")(spec, tensors, _sizes(spec, tensors), flag)


def kernel_frames(exc: BaseException, spec: Any) -> list[str]:
    """The files of the traceback's frames from the first in the kernel's own file on (empty: the
    exception never passed through it, e.g. the tool's oracle raised)."""
    import inspect

    fn = inspect.unwrap(spec.fn)
    try:
        home = inspect.getsourcefile(fn)
    except TypeError:
        return []
    files, tb = [], exc.__traceback__
    while tb is not None:
        if files or tb.tb_frame.f_code.co_filename == home:
            files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def _raised_in_kernel(exc: BaseException, spec: Any) -> bool:
    """Whether the traceback passes through the kernel's own file (not only the tool's oracle)."""
    return bool(kernel_frames(exc, spec))


@contextmanager
def diagnosed(spec: Any, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """Run a kernel call; an exception that is a limit becomes KernelLimit naming it, one on an
    input with an undeclarable-by-signature feature KernelUnsupported naming the declaration."""
    try:
        yield
    except (KernelLimit, KernelUnsupported):
        raise  # a nested diagnosis already named it
    except Exception as exc:
        hint = classify(exc, spec, tensors)
        if hint is not None:
            raise KernelLimit(f"{hint}\n  ({type(exc).__name__}: {str(exc).strip()[:300]})") from exc
        # a failed check is the property's verdict, not an exception of the kernel's
        hint = None if isinstance(exc, AssertionError) or not _raised_in_kernel(exc, spec) else feature_hint(spec, tensors)
        if hint is None:
            raise
        raise KernelUnsupported(f"{spec.name}: {type(exc).__name__}: {str(exc).strip()[:300]}\n  {hint}") from exc


def within_declared_numel(spec: Any, tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every tensor of an input is within the kernel's declared `max_numel`."""
    limit = (getattr(spec, "extra", None) or {}).get("max_numel")
    return limit is None or all(t.numel() <= limit for t in tensors.values() if isinstance(t, torch.Tensor))


def tf32_hint(o: Any, violations: Any) -> str:
    """For an fp32 attention result that exceeds the exact-product ("ieee") bound: a line saying
    whether the TF32 bound (`oracles.bounds.dot_input_error`) holds everywhere, i.e. the error is
    what tf32 matmuls give (tl.dot's default for fp32), and which declaration checks that."""
    if o.fmt.name != "fp32" or o.fp32_dot != "ieee" or not violations.any():
        return ""
    from flashcheck.oracles.attention import compare_attention

    c = compare_attention(o.out, o.oracle, block_n=o.block_n, n_blocks=o.n_blocks, fp32_dot="tf32")
    if (c.violations & violations).any():
        return ""
    return ("\n  limit reached: fp32 precision of its matmuls: every element is within the TF32 bound "
            "(operands read with 10 mantissa bits, tl.dot's default input_precision for fp32): declare "
            "`fp32_dot='tf32'` (--kernel-cap fp32_dot=tf32) to check it against that derived bound, or pass "
            "input_precision=\"ieee\" to tl.dot")
