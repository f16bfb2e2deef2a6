"""The attention family's properties (engine code; flashcheck/suite/test_attention.py only parametrizes and
drives them). Each is registered with `flashcheck.families.prop("attention", name)` under a stable
name: regression fixtures refer to it. This is the family's properties module (its record in
flashcheck/families.py names it): the property sets the suite checks together, and the properties
registered by role, in this order:

- `outcome.py`: one kernel call per case serves every property (`outcome`),
  the key blocking the bound needs (`blocking`), failure messages, what the inputs say about
  special values;
- `core.py`: CORE_PROPERTIES, the output against the oracle and NUMERICS.md
  section 2;
- `metamorphic.py`: METAMORPHIC_PROPERTIES and VARLEN_PROPERTIES, the kernel
  against itself (which relations are bitwise and which within the bound is said there);
- `inputs.py`: bad input rejected, `fit_to_declarations`, and what the engine asks a family (limits,
  declarations, the run's header);
- `backward.py`: BACKWARD_PROPERTIES, dq, dk, dv of a kernel with a backward (autograd or a declared
  `backward_fn`) against the backward oracle and against themselves;
- `sdpa.py`: torch SDPA as the baseline.
"""
from __future__ import annotations

# Imported in registration order (the registry lists properties as they were registered).
from flashcheck.properties.attention import core, metamorphic  # noqa: F401
from flashcheck.properties.attention import backward  # noqa: F401,I001  (after the forward's)
from flashcheck.properties.attention.backward import BACKWARD_PROPERTIES
from flashcheck.properties.attention.inputs import (
    bad_variants, bad_varlen_variants, capability_notes, feature_hint, fit_to_declarations, limit_sizes, refusable,
    resource_declaration,
)
from flashcheck.properties.attention.outcome import (
    FAMILY, ORACLE_KEYS, Outcome, Specials, blocking, describe, fp32_dot, kernel_call, outcome, specials, visible,
)

CORE_PROPERTIES = ("output_contract", "input_untouched", "special_values", "matches_oracle", "lse_matches_oracle")
METAMORPHIC_PROPERTIES = ("deterministic", "configs_identical", "tunings_within_bound",
                          "hidden_and_layout_invariance", "ones_v", "query_permutation", "key_permutation",
                          "gqa_equals_mha", "window_unlimited_is_none", "softcap_changes_output",
                          "lse_agrees_with_weights")
VARLEN_PROPERTIES = ("varlen_sequences_isolated",)

__all__ = ["BACKWARD_PROPERTIES", "CORE_PROPERTIES", "METAMORPHIC_PROPERTIES", "VARLEN_PROPERTIES", "FAMILY", "ORACLE_KEYS", "Outcome",
           "Specials", "bad_variants", "bad_varlen_variants", "blocking", "capability_notes", "describe", "feature_hint",
           "fit_to_declarations", "fp32_dot", "kernel_call", "limit_sizes", "outcome", "refusable",
           "resource_declaration", "specials", "visible"]
