"""Cross-entropy cases as a kernel's declarations allow them, the features a case uses, what the
run's header says, how the properties call the kernel (a fixture's repro), and the bad inputs a
validating kernel refuses."""
from __future__ import annotations

from typing import Any

import torch

from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties.limits import within_declared_numel
from flashcheck.strategies.case import Case
from .outcome import IGNORE_INDEX, options


def _reduced(case: Case, reduction: str) -> Case:
    """The case with another reduction; grad_output reshaped to it ((N,) for "none": the drawn scalar
    repeated; a scalar otherwise: the first row's)."""
    tensors = dict(case.tensors)
    go = tensors.get("grad_output")
    if go is not None:
        n = tensors["logits"].shape[0]
        tensors["grad_output"] = (go.reshape(1).expand(n).clone() if reduction == "none" and go.dim() == 0 else
                                  go.reshape(-1)[0].clone() if reduction != "none" and go.dim() == 1 else go)
    return Case(tensors=tensors, kwargs={**case.kwargs, "reduction": reduction},
                label=f"{case.label}/reduction={reduction}")


def fit_to_declarations(spec: KernelSpec, case: Case) -> Case | None:
    """The case as the kernel's declarations allow it: a feature it lacks (weight, label smoothing,
    z-loss, softcap, an ignore_index other than -100) rejects the case; a reduction it lacks is
    replaced by its first; contiguous_only gives contiguous copies; lengths, dtypes and max_numel as
    declared."""
    logits = case.tensors["logits"]
    if not spec.supports(logits.dtype, logits.shape[-1]) or not within_declared_numel(spec, case.tensors):
        return None
    opts = options(case)
    for feature, used in (("weight", opts["weight"] is not None), ("label_smoothing", opts["label_smoothing"] != 0),
                          ("z_loss", opts["z_loss"] != 0), ("softcap", opts["softcap"] is not None),
                          ("ignore_index", opts["ignore_index"] != IGNORE_INDEX)):
        if used and not spec.has(feature):
            return None
    if opts["reduction"] not in spec.reductions:
        case = _reduced(case, spec.reductions[0])
    if spec.contiguous_only:
        case = Case(tensors={n: (t.contiguous() if n in ("logits", "target") else t) for n, t in case.tensors.items()},
                    kwargs=dict(case.kwargs), label=case.label + "/contiguous")
    return case


def refusable(case: Case) -> dict[str, str]:
    """The optional features a case uses, by the capability key declaring each (a clean refusal of an
    undeclared one is a skip: flashcheck.properties.refusals)."""
    from flashcheck.properties.refusals import LONG

    opts = options(case)
    v = case.tensors["logits"].shape[-1]
    return {k: what for k, on, what in (
        ("weight", opts["weight"] is not None, "class weights"),
        ("label_smoothing", opts["label_smoothing"] != 0, f"label_smoothing={opts['label_smoothing']}"),
        ("z_loss", opts["z_loss"] != 0, f"z_loss={opts['z_loss']}"),
        ("softcap", opts["softcap"] is not None, f"softcap={opts['softcap']}"),
        ("ignore_index", opts["ignore_index"] != IGNORE_INDEX, f"ignore_index={opts['ignore_index']}"),
        ("reductions", opts["reduction"] != "mean", f"reduction={opts['reduction']!r}"),
        ("max_n", v > LONG, f"a vocabulary of {v}"),
    ) if on}


def kernel_call(spec: KernelSpec, tensors: list[str]) -> tuple[str, list[str], list[str], dict]:
    """How the properties call the kernel on a case with these tensors, for a repro snippet (its
    gradient: autograd's backward with grad_output, or with_grad)."""
    return "fn", ["logits", "target"], [n for n in ("weight",) if n in tensors], {}


def capability_notes(spec: KernelSpec) -> tuple[list[str], list[str]]:
    """(declared limits, tests not run) for the run's header."""
    parts = [f"reductions {'/'.join(spec.reductions)}",
             "gradient through autograd, else " + ("with_grad" if spec.with_grad is not None else
                                                   "not checked (no with_grad declared)")]
    skipped = [what for f, what in (("weight", "class weights"), ("label_smoothing", "label smoothing"),
                                    ("z_loss", "z-loss"), ("softcap", "softcap"),
                                    ("ignore_index", "ignore_index other than -100"),
                                    ("inplace_backward", "inplace_backward")) if not spec.has(f)]
    return parts, skipped


def bad_inputs(device: Any) -> dict[str, tuple[type[Exception], tuple, dict]]:
    """Inputs a validating kernel refuses: (the exception a "typed" kernel raises, args, kwargs)."""
    x = torch.zeros(2, 5, device=device)
    t = torch.tensor([1, 2], device=device)
    return {
        "int_logits": (TypeError, (torch.zeros(2, 5, dtype=torch.int32, device=device), t), {}),
        "float64_logits": (TypeError, (torch.zeros(2, 5, dtype=torch.float64, device=device), t), {}),
        "rank_3": (ValueError, (torch.zeros(2, 5, 3, device=device), t), {}),
        "wrong_device": (ValueError, (torch.zeros(2, 5, device="meta"), t), {}),
        "float_target": (TypeError, (x, t.float()), {}),
        "target_shape": (ValueError, (x, torch.tensor([1, 2, 3], device=device)), {}),
        "target_out_of_range": (ValueError, (x, torch.tensor([1, 5], device=device)), {}),
        "weight_shape": (ValueError, (x, t), {"weight": torch.ones(4, device=device)}),
        "bad_reduction": (ValueError, (x, t), {"reduction": "avg"}),
        "smoothing_past_one": (ValueError, (x, t), {"label_smoothing": 1.5}),
    }
