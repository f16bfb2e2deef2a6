"""The attention family's core properties, checked on every drawn case (CORE_PROPERTIES): the
output's contract (shape, dtype, device), the input left untouched, the special values of
NUMERICS.md section 2, and the output and lse against the certified oracle within the derived bound.
"""
from __future__ import annotations


import numpy as np
import torch

from flashcheck.families import prop
from flashcheck.strategies.case import Case
from flashcheck.properties.limits import tf32_hint
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import compare_lse
from flashcheck.oracles.formats import to_float64
from flashcheck.strategies.attention import is_varlen
from flashcheck.properties.attention.outcome import FAMILY, _shapes, describe, outcome, specials


# ---- core properties ---------------------------------------------------------------------------

@prop(FAMILY, "output_contract")
def output_contract(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    if not isinstance(o.out, torch.Tensor):
        raise AssertionError(f"{spec.name} returned {type(o.out).__name__}, not a tensor")
    if is_varlen(case):
        want = (o.q.shape[0], o.q.shape[1], o.v.shape[2])
        want_lse = (o.q.shape[1], o.q.shape[0])
    else:
        want = (*o.q.shape[:3], o.v.shape[3])
        want_lse = tuple(o.q.shape[:3])
    if tuple(o.out.shape) != want or o.out.dtype != o.q.dtype or o.out.device.type != o.q.device.type:
        raise AssertionError(f"{spec.name} returned {tuple(o.out.shape)} {o.out.dtype} on {o.out.device}, "
                             f"expected {want} {o.q.dtype} on {o.q.device} ({_shapes(o)})")
    if o.lse is not None and (tuple(o.lse.shape) != want_lse or o.lse.dtype != torch.float32):
        raise AssertionError(f"{spec.name} returned lse {tuple(o.lse.shape)} {o.lse.dtype}, expected {want_lse} "
                             f"float32 ({_shapes(o)})")


@prop(FAMILY, "input_untouched")
def input_untouched(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    for name, b in o.before.items():
        if not torch.equal(b, o.after[name]):
            changed = int((b != o.after[name]).sum())
            raise AssertionError(f"{spec.name} modified the storage of {name} ({changed} bytes; {case!r})")


@prop(FAMILY, "special_values")
def special_values(spec: KernelSpec, case: Case) -> None:
    """Rows that see no key are exact zeros (lse: the declared empty value); NaN in a visible key
    (or the query, or a visible key's bias) makes the row NaN, in a visible value its column;
    nothing else is NaN or inf: stored NaN past kv_lens, outside the views or in another varlen
    sequence never leaks."""
    for o in outcome(spec, case).dense():
        s = specials(o)
        y = o.out64
        zero = np.broadcast_to(s.zero_rows[..., None], y.shape)
        bad = zero & (y != 0)
        if bad.any():
            raise AssertionError(describe(spec, case, o, bad, "rows with no visible key are not exact zeros",
                                          expected=np.zeros_like(y)))
        bad = s.nan & ~np.isnan(y)
        if bad.any():
            raise AssertionError(describe(spec, case, o, bad, "NaN in a visible key/value did not propagate",
                                          expected=np.full_like(y, np.nan)))
        bad = ~s.may_nan & ~np.isfinite(y)
        if bad.any():
            raise AssertionError(describe(spec, case, o, bad, "non-finite outputs where every input they see is "
                                          "finite (hidden or guard data leaked?)"))
        if o.lse is not None:
            lse = to_float64(o.lse)
            bad = s.zero_rows & (lse != o.lse_empty)
            if bad.any():
                raise AssertionError(describe(spec, case, o, bad, f"lse of rows with no visible key is not "
                                              f"{o.lse_empty}", expected=np.full_like(lse, o.lse_empty), actual=lse))


@prop(FAMILY, "matches_oracle")
def matches_oracle(spec: KernelSpec, case: Case) -> None:
    for o in outcome(spec, case).dense():
        if o.out.numel() == 0:
            continue
        c = o.cmp
        s = specials(o)
        bad = c.violations & ~(s.may_nan & ~s.nan & np.isnan(c.actual))
        if bad.any():
            raise AssertionError(describe(spec, case, o, bad, "exceed the error bound", expected=c.oracle,
                                          err=c.err, bound=c.bound, ulps=c.dist) + tf32_hint(o, bad))


@prop(FAMILY, "lse_matches_oracle")
def lse_matches_oracle(spec: KernelSpec, case: Case) -> None:
    """The lse within its absolute bound (`oracles.bounds.attention_lse_bound`); NaN rows NaN."""
    for o in outcome(spec, case).dense():
        if o.lse is None or o.lse.numel() == 0:
            continue
        c = compare_lse(o.lse, o.oracle, block_n=o.block_n, n_blocks=o.n_blocks, empty=o.lse_empty,
                        fp32_dot=o.fp32_dot)
        if c.violations.any():
            raise AssertionError(describe(spec, case, o, c.violations, "lse exceeds its bound", expected=c.oracle,
                                          err=c.err, bound=c.bound, actual=c.actual))
