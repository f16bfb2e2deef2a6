"""The attention family's metamorphic properties (METAMORPHIC_PROPERTIES, VARLEN_PROPERTIES): one
kernel against itself on related inputs.

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


import numpy as np
import torch

from flashcheck.families import prop
from flashcheck.strategies.case import Case
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import attention_oracle, compare_attention, compare_lse
from flashcheck.oracles.bounds import ones_v_tolerance
from flashcheck.oracles.formats import same_bits, to_float64
from flashcheck.strategies.attention import varlen_inputs
from flashcheck.properties.attention.outcome import (
    FAMILY, ORACLE_KEYS, Outcome, _call, _lens, _shapes, _split, blocking, describe, outcome, specials,
)


# ---- metamorphic properties --------------------------------------------------------------------

def _bitwise(spec, case, o, other: torch.Tensor, what: str, expected: torch.Tensor | None = None) -> None:
    ref = o.out if expected is None else expected
    if tuple(other.shape) != tuple(ref.shape):
        raise AssertionError(f"{spec.name}: {what}: shape {tuple(other.shape)} != {tuple(ref.shape)}")
    same = same_bits(other.cpu(), ref.cpu(), nan_payloads=True).numpy()  # a rerun repeats even its NaNs' bits
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
    call = lambda *t: _split(spec.varlen_fn(*t, cu_q, cu_k, **kw, **({"return_lse": True} if want_lse else {})),  # noqa: E731
                             want_lse)[0]
    # A view whose tokens share memory (legal input) cannot be poisoned one sequence at a time: both
    # runs then take fresh dense copies, and the clean one is the reference.
    aliased = any(_aliases(x) for x in (q, k, v))
    fresh = (lambda x: torch.empty(x.size(), dtype=x.dtype, device=x.device)) if aliased else \
        (lambda x: torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device))
    ref = call(*(fresh(x).copy_(x) for x in (q, k, v))) if aliased else None
    for parity in (0, 1):
        keep = [b for b in range(len(cq) - 1) if b % 2 == parity and cq[b + 1] > cq[b]]
        if not keep:
            continue
        poisoned = []
        for x, cu in ((q, cq), (k, ck), (v, ck)):
            y = fresh(x).copy_(x)
            y[cu[-1]:] = float("nan")
            for b in range(len(cu) - 1):
                if b % 2 != parity:
                    y[cu[b]:cu[b + 1]] = float("nan")
            poisoned.append(y)
        out = call(*poisoned)
        for b in keep:
            part = o.parts[b]
            base = part.out if ref is None else ref[cq[b]:cq[b + 1]].transpose(0, 1)[None]
            _bitwise(spec, case, part, out[cq[b]:cq[b + 1]].transpose(0, 1)[None],
                     f"sequence {b} with its {'odd' if parity == 0 else 'even'}-numbered neighbours set to NaN",
                     expected=base)


def _aliases(x: torch.Tensor) -> bool:
    """Whether two elements of the view share memory."""
    if x.numel() <= 1:
        return False
    dims = sorted((abs(st), n) for st, n in zip(x.stride(), x.shape) if n > 1)
    span = 1
    for st, n in dims:  # non-overlapping iff each stride clears the extent of the smaller ones
        if st < span:
            return True
        span = st * (n - 1) + span
    return False
