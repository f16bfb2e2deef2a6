"""The cross_entropy family's properties: fn(logits, target, *, ignore_index=-100, label_smoothing=0.0,
reduction="mean", weight=None, z_loss=0.0, softcap=None) -> loss with torch's semantics
(docs/NUMERICS.md 9.1), and its gradient (autograd, else a declared with_grad).

* `outcome`: the calls a case's core properties share, oracles and bounds once, the messages;
* `core`: CORE_PROPERTIES, on every case of every class;
* `metamorphic`: META_PROPERTIES, each making its own calls;
* `inputs`: fitting cases to the declarations, refusable features, the run header's notes, the
  repro's call and the bad inputs.
"""
from __future__ import annotations

from . import core, metamorphic  # noqa: F401  (register the properties)
from .inputs import bad_inputs, capability_notes, fit_to_declarations, kernel_call, refusable
from .outcome import FAMILY, Outcome, call_kwargs, grad_call, outcome

CORE_PROPERTIES = ("input_untouched", "loss_matches_oracle", "grad_matches_oracle", "grad_rows_sum", "loss_nonnegative")
META_PROPERTIES = ("shift_invariant", "mean_is_sum_over_weights", "matches_log_softmax", "nan_guard_invisible",
                   "inplace_backward")
#: The relations drawn on the union of the classes (shift_invariant draws its own cases).
UNION_PROPERTIES = META_PROPERTIES[1:]

__all__ = ["FAMILY", "CORE_PROPERTIES", "META_PROPERTIES", "UNION_PROPERTIES", "Outcome", "outcome", "grad_call",
           "call_kwargs", "bad_inputs", "capability_notes", "fit_to_declarations", "kernel_call", "refusable"]
