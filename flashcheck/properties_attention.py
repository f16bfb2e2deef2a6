"""The attention family's properties (engine code; flashcheck/suite/test_attention.py only parametrizes and
drives them). Each is registered with `flashcheck.properties.prop("attention", name)` under a stable
name: regression fixtures refer to it.

One kernel call per case serves every core property (`outcome`). Dense cases call `spec.fn(q, k,
v, **kwargs)` (with return_lse=True when the kernel declares lse); varlen cases (strategies'
`varlen_batches`) call `spec.varlen_fn` once and are then judged sequence by sequence, each
sequence as the dense problem it is (`Outcome.parts`).

Key permutation is NOT bitwise: the online softmax visits keys in blocks, so permuting keys moves
them between blocks (other running maxima, other rescales) and reorders the fp32 sums in P @ V.
The exact result is permutation invariant, so the permuted output must lie within the bound of
the unpermuted oracle. Query permutation IS bitwise (rows are independent: the same instructions
on the same values), as are hidden padding, layout, the launch configurations a spec lists, a
window of (-1, -1) against none, and a varlen sequence against the same call with its neighbours
poisoned. GQA against MHA with repeated K/V, and tunings, are within the bound: a kernel may tile
differently shaped calls differently (other tile shapes sum in another order on a GPU).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from flashcheck import signature
from flashcheck.fixtures import storage_snapshot
from flashcheck.properties import prop
from flashcheck.strategies.case import Case
from flashcheck.limits import tf32_hint, within_declared_numel
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import (
    AttentionComparison, AttentionOracle, attention_oracle, compare_attention, compare_lse, visibility,
)
from flashcheck.oracles.bounds import ones_v_tolerance
from flashcheck.oracles.formats import FP32, Format, format_of, to_float64
from flashcheck.strategies.attention import case_inputs, is_varlen, varlen_inputs, varlen_sequences

FAMILY = "attention"
CORE_PROPERTIES = ("output_contract", "input_untouched", "special_values", "matches_oracle", "lse_matches_oracle")
METAMORPHIC_PROPERTIES = ("deterministic", "configs_identical", "tunings_within_bound",
                          "hidden_and_layout_invariance", "ones_v", "query_permutation", "key_permutation",
                          "gqa_equals_mha", "window_unlimited_is_none", "softcap_changes_output",
                          "lse_agrees_with_weights")
VARLEN_PROPERTIES = ("varlen_sequences_isolated",)
ORACLE_KEYS = ("causal", "scale", "kv_lens", "window", "softcap", "causal_align", "attn_mask")


def blocking(spec: KernelSpec, head_dim: int, n: int, dtype: torch.dtype,
             kw: dict | None = None) -> tuple[int, int]:
    """(block_n, n_blocks) the bound needs: the kernel's own when its spec says, its declared
    block_n, else the worst case of one dot over every key and one rescale per key; split-KV
    (kw's num_splits) adds one rescale per split."""
    fn = spec.extra.get("blocking")
    if fn is not None:
        bn, nb = fn(head_dim, n, dtype)
    elif spec.block_n:
        bn, nb = spec.block_n, max(1, -(-n // spec.block_n))
    else:
        bn, nb = max(n, 1), max(n, 1)
    splits = int((kw or {}).get("num_splits", 1) or 1)
    return bn, nb + (splits if splits > 1 else 0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The output's bit patterns (NaN payloads included), for bitwise comparisons."""
    c = t.detach().contiguous()
    return c.view({2: torch.int16, 4: torch.int32}[c.element_size()]).cpu()


@dataclass
class Outcome:
    """One dense attention problem, the kernel's answer to it, and (lazily) the oracle."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kw: dict  # the kernel's keywords (dense form)
    out: torch.Tensor
    lse: torch.Tensor | None
    fmt: Format
    block_n: int
    n_blocks: int
    lse_empty: float = -math.inf
    fp32_dot: str = "ieee"  # how the kernel's matmuls read fp32 operands (capability fp32_dot)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    parts: list = field(default_factory=list)  # varlen: one dense Outcome per sequence
    _oracle: AttentionOracle | None = None
    _cmp: AttentionComparison | None = None

    @property
    def oracle_kw(self) -> dict:
        return {k: v for k, v in self.kw.items() if k in ORACLE_KEYS}

    @property
    def oracle(self) -> AttentionOracle:
        if self._oracle is None:
            self._oracle = attention_oracle(self.q, self.k, self.v, **self.oracle_kw)
        return self._oracle

    @property
    def cmp(self) -> AttentionComparison:
        if self._cmp is None:
            self._cmp = compare_attention(self.out, self.oracle, block_n=self.block_n, n_blocks=self.n_blocks,
                                          fp32_dot=self.fp32_dot)
        return self._cmp

    @property
    def out64(self) -> np.ndarray:
        return to_float64(self.out)

    def dense(self) -> list["Outcome"]:
        return self.parts if self.parts else [self]


_last: tuple[str, Case, Outcome] | None = None


def _split(res, want_lse: bool):
    if want_lse:
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise AssertionError(f"return_lse=True must give (out, lse), got {type(res).__name__}")
        return res[0], res[1]
    return res, None


def _varlen_parts(spec: KernelSpec, case: Case, out: torch.Tensor, lse: torch.Tensor | None) -> list[Outcome]:
    kw, seqs = varlen_sequences(case)
    fmt = format_of(case.tensors["q"].dtype)
    parts = []
    for sl_q, q, k, v, keys in seqs:
        o = out[sl_q].transpose(0, 1)[None]
        lb = lse[:, sl_q][None] if lse is not None else None
        # the launch is sized for the longest sequence: its blocking (conservative for this one)
        bn, nb = blocking(spec, q.shape[-1], keys, q.dtype, kw)
        parts.append(Outcome(q, k, v, kw, o, lb, fmt, bn, nb, spec.lse_empty, fp32_dot(spec)))
    return parts


def fp32_dot(spec: KernelSpec) -> str:
    """How the kernel's matmuls read fp32 operands: its declared `fp32_dot`, else "ieee"."""
    return spec.extra.get("fp32_dot", "ieee")


def outcome(spec: KernelSpec, case: Case) -> Outcome:
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    want_lse = spec.has("lse")
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    if is_varlen(case):
        args, kw = varlen_inputs(case)
        out, lse = _split(spec.varlen_fn(*args, **kw, **({"return_lse": True} if want_lse else {})), want_lse)
        q, k, v = args[:3]
        o = Outcome(q, k, v, kw, out, lse, format_of(q.dtype), 0, 0, spec.lse_empty, fp32_dot(spec))
        o.parts = _varlen_parts(spec, case, out, lse)
    else:
        q, k, v, kw = case_inputs(case)
        out, lse = _split(spec.fn(q, k, v, **kw, **({"return_lse": True} if want_lse else {})), want_lse)
        bn, nb = blocking(spec, q.shape[-1], k.shape[2], q.dtype, kw)
        o = Outcome(q, k, v, kw, out, lse, format_of(q.dtype), bn, nb, spec.lse_empty, fp32_dot(spec))
    o.before = before
    o.after = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    _last = (spec.name, case, o)
    return o


def _call(spec: KernelSpec, q, k, v, kw, **extra) -> torch.Tensor:
    """The kernel's output alone (dense), whatever it returns with lse."""
    res = spec.fn(q, k, v, **{**kw, **extra})
    return res[0] if isinstance(res, (tuple, list)) else res


# ---- failure messages --------------------------------------------------------------------------

def _shapes(o: Outcome) -> str:
    parts = [f"{n} {tuple(t.shape)} stride={t.stride()} offset={t.storage_offset()}"
             for n, t in (("q", o.q), ("k", o.k), ("v", o.v))]
    extra = []
    for key, val in o.kw.items():
        if isinstance(val, torch.Tensor):
            val = val.tolist() if val.numel() <= 8 else f"tensor{tuple(val.shape)} {val.dtype}"
        extra.append(f"{key}={val}")
    return "; ".join(parts) + "; " + " ".join(extra)


def describe(spec: KernelSpec, case: Case, o: Outcome, bad: np.ndarray, what: str,
             expected: np.ndarray | None = None, err: np.ndarray | None = None,
             bound: np.ndarray | None = None, ulps: np.ndarray | None = None, actual: np.ndarray | None = None) -> str:
    score = np.where(bad, np.nan_to_num(err, nan=np.inf) if err is not None else 1.0, -1.0)
    idx = np.unravel_index(int(np.argmax(score)), score.shape)
    y = o.out64 if actual is None else actual
    lines = [f"{spec.name} [{o.fmt.name}] {what}: {int(bad.sum())} of {bad.size} elements ({case.label})",
             f"  {_shapes(o)}",
             f"  worst at {list(map(int, idx))}: kernel={float(y[idx])!r}"
             + (f" expected={float(expected[idx])!r}" if expected is not None else "")
             + (f" |err|={float(err[idx]):.4g} bound={float(bound[idx]):.4g}" if err is not None else "")
             + (f" ulps={float(ulps[idx]):g}" if ulps is not None else "")]
    return "\n".join(lines)


# ---- what the inputs say about special values ----------------------------------------------------

@dataclass
class Specials:
    zero_rows: np.ndarray  # (B, Hq, M): rows that see no key
    nan: np.ndarray  # (B, Hq, M, Dv): must be NaN
    may_nan: np.ndarray  # (B, Hq, M, Dv): may be NaN (a NaN value of an existing key hidden by a mask)


def _lens(o: Outcome) -> list[int]:
    kv = o.kw.get("kv_lens")
    return kv.tolist() if kv is not None else [o.k.shape[2]] * o.q.shape[0]


def visible(o: Outcome) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(seen (B, Hq, M, N), existing (B, Hq, M, N), bias or None) from the inputs alone."""
    B, Hq, M, _ = o.q.shape
    N = o.k.shape[2]
    lens = _lens(o)
    kw = o.kw
    seen = np.zeros((B, Hq, M, N), dtype=bool)
    exist = np.zeros((B, Hq, M, N), dtype=bool)
    for b in range(B):
        seen[b] = visibility(M, N, lens[b], bool(kw.get("causal")), kw.get("window"), kw.get("causal_align", "top_left"))
        exist[b] = visibility(M, N, lens[b])
    bias = None
    mask = kw.get("attn_mask")
    if mask is not None:
        m = mask.expand(B, Hq, M, N)
        if m.dtype == torch.bool:
            seen &= m.cpu().numpy()
        else:
            bias = to_float64(m)
            seen &= bias != -np.inf
    return seen, exist, bias


def specials(o: Outcome) -> Specials:
    q, k, v = to_float64(o.q), to_float64(o.k), to_float64(o.v)
    g = q.shape[1] // max(k.shape[1], 1)
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    vis, exist, bias = visible(o)
    any_vis = vis.any(-1)
    bad_key = vis & ~np.isfinite(k).all(-1)[:, :, None, :]
    if bias is not None:
        bad_key |= vis & ~np.isfinite(bias)
    row_nan = any_vis & (~np.isfinite(q).all(-1) | bad_key.any(-1))
    v_bad = (~np.isfinite(v)).astype(np.float64)
    col_nan = (vis.astype(np.float64) @ v_bad) > 0
    nan = row_nan[..., None] | col_nan
    may = nan | ((((exist & ~vis).astype(np.float64) @ v_bad) > 0) & any_vis[..., None])
    return Specials(~any_vis, nan, may)


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


# ---- metamorphic properties --------------------------------------------------------------------

def _bitwise(spec, case, o, other: torch.Tensor, what: str, expected: torch.Tensor | None = None) -> None:
    ref = o.out if expected is None else expected
    if tuple(other.shape) != tuple(ref.shape):
        raise AssertionError(f"{spec.name}: {what}: shape {tuple(other.shape)} != {tuple(ref.shape)}")
    same = (_bits(other) == _bits(ref)).numpy()
    if not same.all():
        raise AssertionError(describe(spec, case, o, ~same, f"{what} changed the output bits",
                                      expected=to_float64(other)))


def _masked(o: Outcome) -> bool:
    """Whether visibility depends on the query/key position (the mask moves under permutation)."""
    kw = o.kw
    return bool(kw.get("causal")) or kw.get("attn_mask") is not None or tuple(kw.get("window") or (-1, -1)) != (-1, -1)


@prop(FAMILY, "deterministic")
def deterministic(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    _bitwise(spec, case, o, _call(spec, o.q, o.k, o.v, o.kw), "a second run")


@prop(FAMILY, "configs_identical")
def configs_identical(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    for cfg in spec.configs:
        _bitwise(spec, case, o, _call(spec, o.q, o.k, o.v, o.kw, **cfg), f"launch config {cfg}")


@prop(FAMILY, "tunings_within_bound")
def tunings_within_bound(spec: KernelSpec, case: Case) -> None:
    """Every tuning (num_splits for split-KV) meets the oracle's bound for its own blocking."""
    o = outcome(spec, case)
    for cfg in spec.tunings:
        kw = {**o.kw, **cfg}
        _within_bound(spec, case, o, _call(spec, o.q, o.k, o.v, kw), kw, f"tuning {cfg}")


def _within_bound(spec: KernelSpec, case: Case, o: Outcome, y: torch.Tensor, kw: dict, what: str) -> None:
    """`y`, another call on the same exact problem as `o`, meets o's oracle within the bound of
    its own blocking (kw's num_splits)."""
    bn, nb = blocking(spec, o.q.shape[-1], o.k.shape[2], o.q.dtype, kw)
    c = compare_attention(y, o.oracle, block_n=bn, n_blocks=nb, fp32_dot=o.fp32_dot)
    s = specials(o)
    bad = c.violations & ~(s.may_nan & ~s.nan & np.isnan(c.actual))
    if bad.any():
        raise AssertionError(describe(spec, case, o, bad, f"{what} exceeds the bound", expected=c.oracle,
                                      err=c.err, bound=c.bound, ulps=c.dist, actual=c.actual))


def _hidden_zeroed(t: torch.Tensor, lens: list[int] | None) -> torch.Tensor:
    c = t.detach().clone(memory_format=torch.contiguous_format)
    if lens is not None:
        for b, n in enumerate(lens):
            c[b, :, n:, :] = 0
    return c


@prop(FAMILY, "hidden_and_layout_invariance")
def hidden_and_layout_invariance(spec: KernelSpec, case: Case) -> None:
    """Contiguous copies of q, k, v with every key past kv_lens zeroed give the same bits: the
    layout and whatever is stored in hidden padding do not matter."""
    if not spec.bitwise_invariant:
        return
    o = outcome(spec, case)
    kv = o.kw.get("kv_lens")
    lens = kv.tolist() if kv is not None else None
    q2 = o.q.detach().clone(memory_format=torch.contiguous_format)
    out2 = _call(spec, q2, _hidden_zeroed(o.k, lens), _hidden_zeroed(o.v, lens), o.kw)
    _bitwise(spec, case, o, out2, "contiguous copies with zeroed hidden keys")


@prop(FAMILY, "ones_v")
def ones_v(spec: KernelSpec, case: Case) -> None:
    """V of all ones (NaN stored in hidden rows) gives exactly 1 in fp16/bf16 when the row sum is
    taken from the rounded P, within 1 ulp when from the fp32 P; fp32 within the accumulation
    part of the bound (`oracles.bounds.ones_v_tolerance`)."""
    o = outcome(spec, case)
    kv = o.kw.get("kv_lens")
    v1 = torch.ones(o.v.shape, dtype=o.v.dtype, device=o.v.device)
    if kv is not None:
        for b, n in enumerate(kv.tolist()):
            v1[b, :, n:, :] = float("nan")
    y = to_float64(_call(spec, o.q, o.k, v1, o.kw))
    s = specials(Outcome(o.q, o.k, v1, o.kw, o.out, None, o.fmt, o.block_n, o.n_blocks))
    expected = np.where(np.broadcast_to(s.zero_rows[..., None], y.shape), 0.0, 1.0)
    expected = np.where(s.nan, np.nan, expected)
    tol = ones_v_tolerance(o.fmt, spec.row_sum, o.block_n, o.n_blocks, o.fp32_dot)
    err = np.where(np.isnan(expected), np.where(np.isnan(y), 0.0, np.inf),
                   np.abs(np.nan_to_num(y, nan=np.inf) - expected))
    ok = err <= np.where(expected == 1.0, tol, 0.0)
    ok |= s.may_nan & np.isnan(y)
    if not ok.all():
        bad = ~ok
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise AssertionError(f"{spec.name} [{o.fmt.name}] V of all ones: {int(bad.sum())} elements off; "
                             f"at {list(map(int, idx))} got {y[idx]!r}, expected {expected[idx]!r} "
                             f"(tolerance {tol:.3g}) ({case.label}; {_shapes(o)})")


@prop(FAMILY, "query_permutation")
def query_permutation(spec: KernelSpec, case: Case) -> None:
    """Permuting query rows permutes output rows, bit for bit (no position-dependent mask)."""
    if not spec.bitwise_invariant:
        return
    o = outcome(spec, case)
    if _masked(o) or o.q.shape[2] < 2:
        return
    m = o.q.shape[2]
    perm = torch.from_numpy(np.random.default_rng(m).permutation(m)).to(o.q.device)
    y = _call(spec, o.q[:, :, perm], o.k, o.v, o.kw)
    _bitwise(spec, case, o, y, "permuting the queries", expected=o.out[:, :, perm])


@prop(FAMILY, "key_permutation")
def key_permutation(spec: KernelSpec, case: Case) -> None:
    """Permuting the existing keys and values together (no position-dependent mask) keeps the
    exact result, so the permuted output must meet the bound of the unpermuted oracle."""
    o = outcome(spec, case)
    if _masked(o):
        return
    B, N = o.k.shape[0], o.k.shape[2]
    lens = _lens(o)
    rng = np.random.default_rng(N)
    k2, v2 = o.k.detach().clone(), o.v.detach().clone()
    for b in range(B):
        perm = torch.from_numpy(rng.permutation(lens[b])).to(o.k.device)
        k2[b, :, : lens[b]] = o.k[b, :, perm]
        v2[b, :, : lens[b]] = o.v[b, :, perm]
    y = _call(spec, o.q, k2, v2, o.kw)
    c = compare_attention(y, o.oracle, block_n=o.block_n, n_blocks=o.n_blocks, fp32_dot=o.fp32_dot)
    if c.violations.any():
        raise AssertionError(describe(spec, case, Outcome(o.q, k2, v2, o.kw, y, None, o.fmt, o.block_n, o.n_blocks),
                                      c.violations, "after permuting keys and values, exceed the bound of the oracle",
                                      expected=c.oracle, err=c.err, bound=c.bound, ulps=c.dist))


@prop(FAMILY, "gqa_equals_mha")
def gqa_equals_mha(spec: KernelSpec, case: Case) -> None:
    """MHA on K and V repeated per query head (head h reads kv head h // (Hq // Hkv)) is the same
    exact problem as GQA/MQA: its output meets the GQA oracle within the bound. Not bitwise: a
    correct kernel may tile the two calls differently (ours packs a group's heads into one tile
    for decode-shaped GQA calls, and on a GPU another tile shape sums in another order)."""
    o = outcome(spec, case)
    g = o.q.shape[1] // o.k.shape[1]
    if g == 1:
        return
    k2, v2 = (t.repeat_interleave(g, dim=1) for t in (o.k, o.v))
    _within_bound(spec, case, o, _call(spec, o.q, k2, v2, o.kw), o.kw, f"K/V repeated {g}x per head (MHA)")


@prop(FAMILY, "window_unlimited_is_none")
def window_unlimited_is_none(spec: KernelSpec, case: Case) -> None:
    """window=(-1, -1) is no window: the same bits."""
    o = outcome(spec, case)
    if not spec.has("window") or tuple(o.kw.get("window") or (-1, -1)) != (-1, -1):
        return
    _bitwise(spec, case, o, _call(spec, o.q, o.k, o.v, {**o.kw, "window": (-1, -1)}), "window=(-1, -1)")


@prop(FAMILY, "softcap_changes_output")
def softcap_changes_output(spec: KernelSpec, case: Case) -> None:
    """A softcap below the logits changes the output: where the capped and uncapped exact results
    differ by more than both bounds, the kernel's outputs with and without the cap must differ
    (a cap that is accepted but not applied passes every bound check of the uncapped problem)."""
    o = outcome(spec, case)
    cap = float(o.kw.get("softcap") or 0.0)
    if cap <= 0 or o.out.numel() == 0:
        return
    kw0 = {**o.kw, "softcap": 0.0}
    plain = attention_oracle(o.q, o.k, o.v, **{k: v for k, v in kw0.items() if k in ORACLE_KEYS})
    b1 = o.cmp.bound
    b0 = compare_attention(o.out, plain, block_n=o.block_n, n_blocks=o.n_blocks, fp32_dot=o.fp32_dot).bound
    with np.errstate(invalid="ignore"):
        apart = np.abs(o.oracle.out - plain.out) > b0 + b1
    if not np.nan_to_num(apart, nan=0).any():
        return
    y0 = to_float64(_call(spec, o.q, o.k, o.v, kw0))
    y1 = o.out64
    same = apart & (y0 == y1)
    if same.any():
        raise AssertionError(describe(spec, case, o, same, f"softcap={cap} did not change outputs whose exact values "
                                      "it changes", expected=o.oracle.out, actual=y1))


@prop(FAMILY, "lse_agrees_with_weights")
def lse_agrees_with_weights(spec: KernelSpec, case: Case) -> None:
    """The lse is the log of the softmax's own normaliser, so it merges: the keys cut in two
    halves, lse = log(exp(lse_1) + exp(lse_2)) within the three lse bounds. Checks the
    convention (natural log, the scaled and capped scores, -inf for an empty half) without the
    oracle's lse. Unmasked problems only (a mask would move with the cut)."""
    o = outcome(spec, case)
    N = o.k.shape[2]
    if o.lse is None or o.out.numel() == 0 or _masked(o) or o.kw.get("kv_lens") is not None or N < 2:
        return
    cut = N // 2
    kw = {k: v for k, v in o.kw.items() if k != "num_splits"}
    halves = []
    for sl in (slice(0, cut), slice(cut, N)):
        k, v = o.k[:, :, sl], o.v[:, :, sl]
        _, lse_h = spec.fn(o.q, k, v, **kw, return_lse=True)
        bn, nb = blocking(spec, o.q.shape[-1], k.shape[2], o.q.dtype, kw)
        orc = attention_oracle(o.q, k, v, **{kk: vv for kk, vv in kw.items() if kk in ORACLE_KEYS})
        halves.append((to_float64(lse_h), compare_lse(lse_h, orc, block_n=bn, n_blocks=nb, fp32_dot=o.fp32_dot).bound))
    whole = to_float64(o.lse)
    merged = np.logaddexp(halves[0][0], halves[1][0])
    bound = (compare_lse(o.lse, o.oracle, block_n=o.block_n, n_blocks=o.n_blocks, fp32_dot=o.fp32_dot).bound
             + halves[0][1] + halves[1][1])
    with np.errstate(invalid="ignore"):
        err = np.where(np.isnan(whole) & np.isnan(merged), 0.0, np.abs(whole - merged))
    bad = ~(np.nan_to_num(err, nan=np.inf) <= bound + 1e-12) & ~(np.isinf(whole) & (whole == merged))
    if bad.any():
        raise AssertionError(describe(spec, case, o, bad, "lse differs from the merge of its two key halves",
                                      expected=merged, err=err, bound=bound, actual=whole))


@prop(FAMILY, "varlen_sequences_isolated")
def varlen_sequences_isolated(spec: KernelSpec, case: Case) -> None:
    """Nothing crosses a sequence boundary: with every other sequence and the tokens past the last
    one set to NaN, the same varlen call (same cu_seqlens and max_seqlen: the same launch and
    tiling) gives the remaining sequences' bits unchanged; both parities are tried. Comparing a
    sequence with itself run alone as a dense batch cannot be bitwise: a correct kernel may tile a
    short dense call differently (our launcher packs GQA heads for decode-shaped calls) and reduce
    in another order; each sequence is judged against its oracle within its bound already."""
    o = outcome(spec, case)
    args, kw = varlen_inputs(case)
    q, k, v, cu_q, cu_k = args
    cq, ck = cu_q.tolist(), cu_k.tolist()
    want_lse = spec.has("lse")
    for parity in (0, 1):
        keep = [b for b in range(len(cq) - 1) if b % 2 == parity and cq[b + 1] > cq[b]]
        if not keep:
            continue
        poisoned = []
        for x, cu in ((q, cq), (k, ck), (v, ck)):
            y = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(x)
            y[cu[-1]:] = float("nan")
            for b in range(len(cu) - 1):
                if b % 2 != parity:
                    y[cu[b]:cu[b + 1]] = float("nan")
            poisoned.append(y)
        out, _ = _split(spec.varlen_fn(*poisoned, cu_q, cu_k, **kw, **({"return_lse": True} if want_lse else {})),
                        want_lse)
        for b in keep:
            part = o.parts[b]
            _bitwise(spec, case, part, out[cq[b]:cq[b + 1]].transpose(0, 1)[None],
                     f"sequence {b} with its {'odd' if parity == 0 else 'even'}-numbered neighbours set to NaN",
                     expected=part.out)


# ---- bad input ---------------------------------------------------------------------------------

def bad_variants(spec: KernelSpec, case: Case) -> dict[str, tuple[type[Exception], tuple, dict]]:
    q, k, v, kw = case_inputs(case)
    B, H, M, D = q.shape
    N = k.shape[2]
    other = torch.float32 if q.dtype != torch.float32 else torch.float16
    lens = torch.full((B,), N, dtype=torch.int32, device=q.device)
    kw = {kk: vv for kk, vv in kw.items() if kk != "kv_lens"}
    out = {
        "q_rank_3": (ValueError, (q[0], k, v), kw),
        "k_rank_5": (ValueError, (q, k[None], v), kw),
        "mixed_dtypes": (TypeError, (q, k.to(other), v), kw),
        "int_dtype": (TypeError, (q.to(torch.int32), k.to(torch.int32), v.to(torch.int32)), kw),
        "float64": (TypeError, (q.double(), k.double(), v.double()), kw),
        "k_v_lengths_differ": (ValueError, (q, k, torch.cat([v, v], dim=2)), kw),
        "head_dims_differ": (ValueError, (q, torch.cat([k, k], dim=3), torch.cat([v, v], dim=3)), kw),
        "batch_differs": (ValueError, (q, torch.cat([k, k]), torch.cat([v, v])), kw),
        "head_dim_257": (ValueError, tuple(torch.zeros(1, 1, 2, 257, dtype=q.dtype, device=q.device)
                                           for _ in range(3)), {}),
        "wrong_device": (ValueError, (q.to("meta"), k.to("meta"), v.to("meta")), kw),
        "kv_lens_float": (TypeError, (q, k, v), {**kw, "kv_lens": lens.float()}),
        "kv_lens_shape": (ValueError, (q, k, v), {**kw, "kv_lens": torch.cat([lens, lens])}),
        "kv_lens_above_n": (ValueError, (q, k, v), {**kw, "kv_lens": lens + 1}),
        "kv_lens_negative": (ValueError, (q, k, v), {**kw, "kv_lens": lens * 0 - 1}),
        "kv_lens_list": (TypeError, (q, k, v), {**kw, "kv_lens": lens.tolist()}),
        "causal_not_bool": (TypeError, (q, k, v), {**kw, "causal": "yes"}),
    }
    if spec.has("gqa"):  # heads that do not divide
        out["heads_not_divisible"] = (ValueError, (torch.cat([q, q[:, :1]], dim=1), k, v), kw)
    if spec.has("window"):
        out["window_below_minus_1"] = (ValueError, (q, k, v), {**kw, "window": (-2, 0)})
        out["window_not_pair"] = (TypeError, (q, k, v), {**kw, "window": 3})
    if spec.has("softcap"):
        out["softcap_negative"] = (ValueError, (q, k, v), {**kw, "softcap": -1.0})
        out["softcap_nan"] = (ValueError, (q, k, v), {**kw, "softcap": float("nan")})
    if spec.has("attn_mask"):
        out["mask_not_broadcastable"] = (ValueError, (q, k, v), {**kw, "attn_mask": torch.ones(
            M + 1, N + 1, dtype=torch.bool, device=q.device)})
        out["mask_int"] = (TypeError, (q, k, v), {**kw, "attn_mask": torch.ones(M, N, dtype=torch.int32,
                                                                                 device=q.device)})
    if spec.has("splits"):
        out["num_splits_negative"] = (ValueError, (q, k, v), {**kw, "num_splits": -1})
    out["causal_align_unknown"] = (ValueError, (q, k, v), {**kw, "causal_align": "middle"})
    return out


def bad_varlen_variants(spec: KernelSpec, q, k, v, cu_q, cu_k, kw) -> dict[str, tuple[type[Exception], tuple, dict]]:
    tq, tk = q.shape[0], k.shape[0]
    bump = cu_k.clone()
    bump[1] = tk + 5
    dec = cu_q.clone()
    if len(dec) > 2:
        dec[1], dec[2] = dec[2] + 1, dec[1]
    return {
        "cu_seqlens_int64": (TypeError, (q, k, v, cu_q.long(), cu_k), kw),
        "cu_seqlens_not_monotone": (ValueError, (q, k, v, dec, cu_k), kw),
        "cu_seqlens_out_of_range": (ValueError, (q, k, v, cu_q, bump), kw),
        "cu_seqlens_lengths_differ": (ValueError, (q, k, v, cu_q, cu_k[:-1]), kw),
        "max_seqlen_too_small": (ValueError, (q, k, v, cu_q, cu_k), {**kw, "max_seqlen_q": 0}),
        "varlen_rank_4": (ValueError, (q[None], k, v, cu_q, cu_k), kw),
    }


def _expect_raises(spec_name: str, fn, variants, *, typed: bool = True) -> list[str]:
    """typed: the documented exception type (ours); else any exception counts as a rejection."""
    failures = []
    for name, (exc, args, kw) in variants.items():
        exc = exc if typed else Exception
        try:
            fn(*args, **kw)
        except exc:
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: raised {type(e).__name__}: {e} (expected {exc.__name__})")
            continue
        failures.append(f"{name}: no exception (expected {exc.__name__})")
    return failures


@prop(FAMILY, "rejects_bad_input")
def rejects_bad_input(spec: KernelSpec, case: Case) -> None:
    """Bad ranks, shapes, dtypes, devices, kv_lens and feature options raise TypeError/ValueError
    naming the problem; with varlen, bad cu_seqlens too."""
    typed = spec.validates_input == "typed"
    failures = _expect_raises(spec.name, spec.fn, bad_variants(spec, case), typed=typed)
    if spec.has("varlen"):
        q, k, v, _ = case_inputs(case)
        qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # batch 0 as 2 packed sequences
        tq, tk = qp.shape[0], kp.shape[0]
        cu_q = torch.tensor([0, tq // 2, tq], dtype=torch.int32, device=q.device)
        cu_k = torch.tensor([0, tk // 2, tk], dtype=torch.int32, device=q.device)
        kw = {"max_seqlen_q": tq, "max_seqlen_k": tk}
        failures += _expect_raises(spec.name, spec.varlen_fn, bad_varlen_variants(spec, qp, kp, vp, cu_q, cu_k, kw),
                                   typed=typed)
    if failures:
        raise AssertionError(f"{spec.name} does not reject bad input:\n  " + "\n  ".join(failures))


__all__ = ["CORE_PROPERTIES", "METAMORPHIC_PROPERTIES", "VARLEN_PROPERTIES", "Outcome", "Specials", "blocking",
           "describe", "outcome", "specials", "visible"]


def _features_used(case: Case) -> set[str]:
    """The optional features a dense case asks for (a fixture may predate a declaration)."""
    q, k, v, kw = case_inputs(case)
    keyword = signature.KEYWORDS[FAMILY]
    used = {f for f in ("attn_mask", "window", "softcap", "splits")
            if not signature.asks_nothing(keyword[f], kw.get(keyword[f]))}
    return used | {f for f, on in (("gqa", q.shape[1] != k.shape[1]), ("dv", v.shape[-1] != q.shape[-1])) if on}


def fit_to_declarations(spec: KernelSpec, case: Case) -> Case | None:
    """The case as the kernel's declarations allow it, or None when it needs something the kernel
    does not declare (the caller rejects it: a declared-unsupported call is never made).

    contiguous_only gives contiguous copies of q, k, v (same values); every other declaration
    (key counts, head dims, M = N, causal, alignment, kv_lens, custom scale) rejects the case.
    """
    if is_varlen(case):
        return case  # varlen is its own feature, declared through varlen_fn
    q, k = case.tensors["q"], case.tensors["k"]
    m, n, d = q.shape[2], k.shape[2], q.shape[3]
    kw = case.kwargs
    causal = bool(kw.get("causal"))
    if not spec.supports(q.dtype, n) or not spec.supports_head_dim(d):
        return None
    if (spec.square_only and m != n) or (causal and not spec.causal):
        return None
    if (causal or kw.get("window") is not None) and kw.get("causal_align", "top_left") not in spec.causal_align:
        return None
    if ("kv_lens" in case.tensors and not spec.kv_lens) or (kw.get("scale") is not None and not spec.custom_scale):
        return None
    if any(not spec.has(f) for f in _features_used(case)) or not within_declared_numel(spec, case.tensors):
        return None
    if not spec.contiguous_only:
        return case
    tensors = {name: (t.contiguous() if name in ("q", "k", "v") else t) for name, t in case.tensors.items()}
    return Case(tensors=tensors, kwargs=dict(kw), label=case.label + "/contiguous")
