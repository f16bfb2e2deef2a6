"""Property tests for every registered attention-family kernel, for every dtype it supports.

Each adversarial class of NUMERICS.md section 4 item 13 gets its own Hypothesis test; every example
is checked against the certified oracle within the derived componentwise bound
(`oracles.bounds.attention_error_bound`), for the special values of NUMERICS.md section 2
(derived from the inputs alone, not from the oracle), for an untouched input and for the output's
shape and dtype. One kernel call serves all of them. Metamorphic properties (V of all ones, key
and query permutations, hidden padding and layout invariance, launch configurations, determinism)
run on the union of the classes.

Key permutation is NOT bitwise: the online softmax visits keys in blocks, so permuting keys moves
them between blocks (other running maxima, other rescales) and reorders the fp32 sums in P @ V.
The exact result is permutation invariant, so the permuted output must lie within the bound of
the unpermuted oracle. Query permutation IS bitwise (rows are independent: the same instructions
on the same values), as are hidden padding, layout and the launch configurations a spec lists.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import AttentionComparison, AttentionOracle, _visibility, attention_oracle, compare_attention
from flashcheck.oracles.formats import FP32, Format, format_of, to_float64
from flashcheck.reports.attention import blocking, sdpa_error_ratio, sdpa_output
from flashcheck.strategies.attention import CLASSES, LAYOUTS, ODD_HEAD_DIMS, attention_cases, case_inputs
from flashcheck.strategies.sample import draw_examples
from flashcheck.harness import Case, check, prop, storage_snapshot

FAMILY = "attention"
CORE_PROPERTIES = ("output_contract", "input_untouched", "special_values", "matches_oracle")
METAMORPHIC_PROPERTIES = ("deterministic", "configs_identical", "hidden_and_layout_invariance", "ones_v",
                          "query_permutation", "key_permutation")
# The metamorphic test calls the kernel several times per example: smaller shapes on the CPU.
META_LIMITS = dict(max_m=32, max_n=48, max_head_dim=32) if INTERPRET else {}


# ---- one kernel call per case ------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    """The output's bit patterns (NaN payloads included), for bitwise comparisons."""
    c = t.detach().contiguous()
    return c.view({2: torch.int16, 4: torch.int32}[c.element_size()]).cpu()


@dataclass
class Outcome:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kw: dict
    out: torch.Tensor
    fmt: Format
    before: dict
    after: dict
    block_n: int
    n_blocks: int
    _oracle: AttentionOracle | None = None
    _cmp: AttentionComparison | None = None

    @property
    def oracle(self) -> AttentionOracle:
        if self._oracle is None:
            self._oracle = attention_oracle(self.q, self.k, self.v, **self.kw)
        return self._oracle

    @property
    def cmp(self) -> AttentionComparison:
        if self._cmp is None:
            self._cmp = compare_attention(self.out, self.oracle, block_n=self.block_n, n_blocks=self.n_blocks)
        return self._cmp

    @property
    def out64(self) -> np.ndarray:
        return to_float64(self.out)


_last: tuple[str, Case, Outcome] | None = None


def outcome(spec: KernelSpec, case: Case) -> Outcome:
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    q, k, v, kw = case_inputs(case)
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    out = spec.fn(q, k, v, **kw)
    after = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    bn, nb = blocking(spec, q.shape[-1], k.shape[2], q.dtype)
    o = Outcome(q, k, v, kw, out, format_of(q.dtype), before, after, bn, nb)
    _last = (spec.name, case, o)
    return o


def _call(spec: KernelSpec, q, k, v, kw, **extra) -> torch.Tensor:
    return spec.fn(q, k, v, **kw, **extra)


# ---- failure messages --------------------------------------------------------------------------

def _shapes(o: Outcome) -> str:
    parts = [f"{n} {tuple(t.shape)} stride={t.stride()} offset={t.storage_offset()}"
             for n, t in (("q", o.q), ("k", o.k), ("v", o.v))]
    kv = o.kw.get("kv_lens")
    extra = f" kv_lens={kv.tolist()}" if kv is not None else ""
    return "; ".join(parts) + f"; causal={o.kw.get('causal')} scale={o.kw.get('scale')}{extra}"


def describe(spec: KernelSpec, case: Case, o: Outcome, bad: np.ndarray, what: str,
             expected: np.ndarray | None = None, err: np.ndarray | None = None,
             bound: np.ndarray | None = None, ulps: np.ndarray | None = None) -> str:
    score = np.where(bad, np.nan_to_num(err, nan=np.inf) if err is not None else 1.0, -1.0)
    idx = np.unravel_index(int(np.argmax(score)), score.shape)
    y = o.out64
    lines = [f"{spec.name} [{o.fmt.name}] {what}: {int(bad.sum())} of {bad.size} elements ({case.label})",
             f"  {_shapes(o)}",
             f"  worst at [b, h, m, d] = {list(map(int, idx))}: kernel={float(y[idx])!r}"
             + (f" expected={float(expected[idx])!r}" if expected is not None else "")
             + (f" |err|={float(err[idx]):.4g} bound={float(bound[idx]):.4g}" if err is not None else "")
             + (f" ulps={float(ulps[idx]):g}" if ulps is not None else "")]
    return "\n".join(lines)


# ---- what the inputs say about special values ----------------------------------------------------

@dataclass
class Specials:
    zero_rows: np.ndarray  # (B, H, M): rows that see no key
    nan: np.ndarray  # (B, H, M, D): must be NaN
    may_nan: np.ndarray  # (B, H, M, D): may be NaN (causal: NaN value of an existing, unseen key)


def specials(o: Outcome) -> Specials:
    q, k, v = to_float64(o.q), to_float64(o.k), to_float64(o.v)
    B, H, M, D = q.shape
    N = k.shape[2]
    kv = o.kw.get("kv_lens")
    lens = kv.tolist() if kv is not None else [N] * B
    causal = bool(o.kw.get("causal"))
    vis = np.stack([np.broadcast_to(_visibility(M, N, lens[b], causal), (H, M, N)) for b in range(B)]) \
        if B else np.zeros((0, H, M, N), dtype=bool)
    exist = np.stack([np.broadcast_to(_visibility(M, N, lens[b], False), (H, M, N)) for b in range(B)]) \
        if B else vis
    any_vis = vis.any(-1)
    row_nan = any_vis & (~np.isfinite(q).all(-1) | (vis & ~np.isfinite(k).all(-1)[:, :, None, :]).any(-1))
    v_bad = (~np.isfinite(v)).astype(np.float64)
    col_nan = (vis.astype(np.float64) @ v_bad) > 0
    nan = row_nan[..., None] | col_nan
    may = nan | (((exist & ~vis).astype(np.float64) @ v_bad) > 0) if causal else nan
    return Specials(~any_vis, nan, may)


# ---- core properties ---------------------------------------------------------------------------

@prop(FAMILY, "output_contract")
def output_contract(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    if not isinstance(o.out, torch.Tensor):
        raise AssertionError(f"{spec.name} returned {type(o.out).__name__}, not a tensor")
    want = (*o.q.shape[:3], o.v.shape[3])
    if tuple(o.out.shape) != want or o.out.dtype != o.q.dtype or o.out.device.type != o.q.device.type:
        raise AssertionError(f"{spec.name} returned {tuple(o.out.shape)} {o.out.dtype} on {o.out.device}, "
                             f"expected {want} {o.q.dtype} on {o.q.device} ({_shapes(o)})")


@prop(FAMILY, "input_untouched")
def input_untouched(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    for name, b in o.before.items():
        if not torch.equal(b, o.after[name]):
            changed = int((b != o.after[name]).sum())
            raise AssertionError(f"{spec.name} modified the storage of {name} ({changed} bytes; {case!r})")


@prop(FAMILY, "special_values")
def special_values(spec: KernelSpec, case: Case) -> None:
    """Rows that see no key are exact zeros; NaN in a visible key (or the query) makes the row NaN,
    in a visible value its column; nothing else is NaN or inf: stored NaN past kv_lens or outside
    the views never leaks."""
    o = outcome(spec, case)
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


@prop(FAMILY, "matches_oracle")
def matches_oracle(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    c = o.cmp
    may = specials(o).may_nan & ~specials(o).nan
    bad = c.violations & ~(may & np.isnan(c.actual))
    if bad.any():
        raise AssertionError(describe(spec, case, o, bad, "exceed the error bound", expected=c.oracle,
                                      err=c.err, bound=c.bound, ulps=c.dist))


# ---- metamorphic properties --------------------------------------------------------------------

def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return (_bits(a) == _bits(b)).numpy()


def _bitwise(spec, case, o, other: torch.Tensor, what: str, expected: torch.Tensor | None = None) -> None:
    ref = o.out if expected is None else expected
    if tuple(other.shape) != tuple(ref.shape):
        raise AssertionError(f"{spec.name}: {what}: shape {tuple(other.shape)} != {tuple(ref.shape)}")
    same = _equal_bits(other, ref)
    if not same.all():
        raise AssertionError(describe(spec, case, o, ~same, f"{what} changed the output bits",
                                      expected=to_float64(other)))


@prop(FAMILY, "deterministic")
def deterministic(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    _bitwise(spec, case, o, _call(spec, o.q, o.k, o.v, o.kw), "a second run")


@prop(FAMILY, "configs_identical")
def configs_identical(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    for cfg in spec.configs:
        _bitwise(spec, case, o, _call(spec, o.q, o.k, o.v, o.kw, **cfg), f"launch config {cfg}")


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
    o = outcome(spec, case)
    kv = o.kw.get("kv_lens")
    lens = kv.tolist() if kv is not None else None
    q2 = o.q.detach().clone(memory_format=torch.contiguous_format)
    out2 = _call(spec, q2, _hidden_zeroed(o.k, lens), _hidden_zeroed(o.v, lens), o.kw)
    _bitwise(spec, case, o, out2, "contiguous copies with zeroed hidden keys")


@prop(FAMILY, "ones_v")
def ones_v(spec: KernelSpec, case: Case) -> None:
    """V of all ones (NaN stored in hidden rows) gives exactly 1 in fp16/bf16 (the weights sum to
    what the row sum divides by); fp32 within the accumulation part of the bound."""
    o = outcome(spec, case)
    kv = o.kw.get("kv_lens")
    v1 = torch.ones(o.v.shape, dtype=o.v.dtype, device=o.v.device)
    if kv is not None:
        for b, n in enumerate(kv.tolist()):
            v1[b, :, n:, :] = float("nan")
    y = to_float64(_call(spec, o.q, o.k, v1, o.kw))
    s = specials(Outcome(o.q, o.k, v1, o.kw, o.out, o.fmt, {}, {}, o.block_n, o.n_blocks))
    expected = np.where(np.broadcast_to(s.zero_rows[..., None], y.shape), 0.0, 1.0)
    expected = np.where(s.nan, np.nan, expected)
    tol = (3 * o.block_n + 4 * o.n_blocks + 8) * 2.0**-24 + 2.0**-24 if o.fmt == FP32 else 0.0
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
    """Permuting query rows permutes output rows, bit for bit (not causal: the mask moves)."""
    o = outcome(spec, case)
    if o.kw.get("causal") or o.q.shape[2] < 2:
        return
    m = o.q.shape[2]
    perm = torch.from_numpy(np.random.default_rng(m).permutation(m)).to(o.q.device)
    y = _call(spec, o.q[:, :, perm], o.k, o.v, o.kw)
    _bitwise(spec, case, o, y, "permuting the queries", expected=o.out[:, :, perm])


@prop(FAMILY, "key_permutation")
def key_permutation(spec: KernelSpec, case: Case) -> None:
    """Permuting the existing keys and values together (not causal) keeps the exact result, so the
    permuted output must meet the bound of the unpermuted oracle (not bitwise: see the module doc)."""
    o = outcome(spec, case)
    if o.kw.get("causal"):
        return
    B, N = o.k.shape[0], o.k.shape[2]
    kv = o.kw.get("kv_lens")
    lens = kv.tolist() if kv is not None else [N] * B
    rng = np.random.default_rng(N)
    k2, v2 = o.k.detach().clone(), o.v.detach().clone()
    for b in range(B):
        perm = torch.from_numpy(rng.permutation(lens[b])).to(o.k.device)
        k2[b, :, : lens[b]] = o.k[b, :, perm]
        v2[b, :, : lens[b]] = o.v[b, :, perm]
    y = _call(spec, o.q, k2, v2, o.kw)
    c = compare_attention(y, o.oracle, block_n=o.block_n, n_blocks=o.n_blocks)
    if c.violations.any():
        raise AssertionError(describe(spec, case, Outcome(o.q, k2, v2, o.kw, y, o.fmt, {}, {}, o.block_n,
                                                          o.n_blocks), c.violations,
                                      "after permuting keys and values, exceed the bound of the oracle",
                                      expected=c.oracle, err=c.err, bound=c.bound, ulps=c.dist))


# ---- bad input ---------------------------------------------------------------------------------

def _bad_variants(case: Case) -> dict[str, tuple[type[Exception], tuple, dict]]:
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
    return out


@prop(FAMILY, "rejects_bad_input")
def rejects_bad_input(spec: KernelSpec, case: Case) -> None:
    """Bad ranks, shapes, dtypes, devices and kv_lens raise TypeError/ValueError naming the problem."""
    failures = []
    for name, (exc, args, kw) in _bad_variants(case).items():
        try:
            spec.fn(*args, **kw)
        except exc:
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: raised {type(e).__name__}: {e} (expected {exc.__name__})")
            continue
        failures.append(f"{name}: no exception (expected {exc.__name__})")
    if failures:
        raise AssertionError(f"{spec.name} does not reject bad input:\n  " + "\n  ".join(failures))


# ---- tests -------------------------------------------------------------------------------------

def _class_strategy(spec: KernelSpec, dtype: torch.dtype, cls: str):
    """The class's strategy at the CPU defaults, or up to the kernel's head dim on a GPU."""
    limits = {} if INTERPRET else {"max_head_dim": spec.max_head_dim}
    return CLASSES[cls](dtype=dtype, **limits)


@pytest.mark.parametrize("cls", sorted(CLASSES))
@given(data=st.data())
def test_adversarial_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
    case = data.draw(_class_strategy(spec, dtype, cls), label="case")
    for name in CORE_PROPERTIES:
        check(spec, name, case)


@given(data=st.data())
def test_metamorphic(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(attention_cases(dtype=dtype, **META_LIMITS), label="case")
    for name in METAMORPHIC_PROPERTIES:
        check(spec, name, case)


def _fixed_case(dtype: torch.dtype, *, b=2, h=2, m=5, n=7, d=8, causal=False, kv_lens=None) -> Case:
    g = torch.Generator().manual_seed(0)
    t = [torch.randn(b, h, s, d, generator=g).to(dtype).to(DEVICE) for s in (m, n, n)]
    tensors = {"q": t[0], "k": t[1], "v": t[2]}
    if kv_lens is not None:
        tensors["kv_lens"] = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    return Case(tensors=tensors, kwargs={"causal": causal, "scale": None}, label="fixed")


def test_bad_input_raises(spec: KernelSpec, dtype: torch.dtype) -> None:
    if not spec.validates_input:
        pytest.skip(f"{spec.name} does not declare input validation (capability validates_input)")
    check(spec, "rejects_bad_input", _fixed_case(dtype))


SPECIAL_CASES = {
    "kv_len_zero_and_one": dict(kv_lens=[0, 1]),
    "kv_len_zero_causal": dict(kv_lens=[0, 7], causal=True),
    "causal_m_gt_n": dict(m=9, n=4, causal=True),
    "causal_m_lt_n": dict(m=3, n=9, causal=True),
    "single_key": dict(n=1),
}


@pytest.mark.parametrize("which", sorted(SPECIAL_CASES))
def test_special_cases(spec: KernelSpec, dtype: torch.dtype, which: str) -> None:
    case = _fixed_case(dtype, **SPECIAL_CASES[which])
    for name in CORE_PROPERTIES + ("ones_v", "hidden_and_layout_invariance"):
        check(spec, name, case)


def test_nan_in_visible_key_and_value(spec: KernelSpec, dtype: torch.dtype) -> None:
    """NaN in a visible key: its rows NaN; in a visible value: that column of those rows NaN;
    everything else finite and within the bound."""
    case = _fixed_case(dtype, kv_lens=[7, 4])
    case.tensors["k"][0, 1, 3, 2] = float("nan")
    case.tensors["v"][1, 0, 2, 5] = float("nan")
    case.tensors["k"][1, 1, 6, 0] = float("nan")  # hidden (kv_len 4): must not leak
    case.tensors["v"][1, 1, 5, 1] = float("nan")  # hidden
    for name in CORE_PROPERTIES:
        check(spec, name, case)
    y = to_float64(outcome(spec, case).out)
    assert np.isnan(y[0, 1]).all() and np.isnan(y[1, 0, :, 5]).all()
    assert np.isfinite(y[1, 1]).all() and np.isfinite(y[0, 0]).all()


def test_sdpa_error_ratio_reported(spec: KernelSpec, dtype: torch.dtype) -> None:
    """Our max error over SDPA's (same dtype, same device), both against the oracle: reported,
    not asserted (the FlashAttention suite's criterion). Run with -s to read the numbers."""
    ratios = []
    for case in draw_examples(CLASSES["benign"](dtype=dtype), 3):
        q, k, v, kw = case_inputs(case)
        out = spec.fn(q, k, v, **kw)
        r = sdpa_error_ratio(out, sdpa_output(q, k, v, **kw), attention_oracle(q, k, v, **kw))
        assert r is None or (r >= 0 and not math.isnan(r))
        ratios.append(r)
    print(f"\n{spec.name} [{format_of(dtype).name}] error / SDPA error on benign cases: {ratios}")


# ---- the strategies reach their classes ----------------------------------------------------------

def _scaled_spread(case: Case) -> float:
    q, k, v, kw = case_inputs(case)
    from flashcheck.oracles.attention import effective_scale

    q64, k64 = to_float64(q), to_float64(k)
    s = np.einsum("bhmd,bhnd->bhmn", np.nan_to_num(q64), np.nan_to_num(k64)) * effective_scale(kw["scale"],
                                                                                               q.shape[-1])
    return float((s.max(-1) - s.min(-1)).max()) if s.size else 0.0


def _raw_max_score(case: Case) -> float:
    q, k, _, _ = case_inputs(case)
    s = np.einsum("bhmd,bhnd->bhmn", to_float64(q), to_float64(k))
    return float(np.abs(s).max()) if s.size else 0.0


def _lens(case: Case) -> list[int]:
    kv = case.tensors.get("kv_lens")
    return kv.tolist() if kv is not None else []


def _is_bshd(t: torch.Tensor) -> bool:
    B, H, S, D = t.shape
    return t.stride() == (S * H * D, D, H * D, 1) and H > 1 and S > 1


def _hidden_poisoned(case: Case) -> bool:
    k, v = to_float64(case.tensors["k"]), to_float64(case.tensors["v"])
    fmt = format_of(case.tensors["k"].dtype)
    return any(n < k.shape[2] and not (np.isfinite(k[b, :, n:]).all() and np.abs(v[b, :, n:]).max() < fmt.max_finite)
               for b, n in enumerate(_lens(case)))


REACHES = {
    "benign": lambda cs: True,
    "wide_logit_spread": lambda cs: max(_scaled_spread(c) for c in cs) > 88,
    "fp16_overflowing_scores": lambda cs: all(_raw_max_score(c) > 65504 for c in cs),
    "odd_head_dims": lambda cs: any(c.tensors["q"].shape[-1] & (c.tensors["q"].shape[-1] - 1) for c in cs)
    and all(c.tensors["q"].shape[-1] in ODD_HEAD_DIMS for c in cs),
    "ragged_lengths": lambda cs: all(c.tensors["q"].shape[2] != c.tensors["k"].shape[2] for c in cs),
    "kv_lens_edges": lambda cs: {0, 1} <= {x for c in cs for x in _lens(c)}
    and any(c.tensors["k"].shape[2] in _lens(c) for c in cs)
    and any(x % 16 and 1 < x < c.tensors["k"].shape[2] for c in cs for x in _lens(c)),
    "causal_rectangular": lambda cs: all(c.kwargs["causal"] for c in cs)
    and any(c.tensors["q"].shape[2] > c.tensors["k"].shape[2] for c in cs)
    and any(c.tensors["q"].shape[2] < c.tensors["k"].shape[2] for c in cs),
    "fully_masked_rows": lambda cs: all(0 in _lens(c) for c in cs),
    "nan_in_hidden_kv": lambda cs: all(_hidden_poisoned(c) for c in cs if max(_lens(c)) < c.tensors["k"].shape[2])
    and any(np.isnan(to_float64(c.tensors["v"])).any() for c in cs),
    "nan_in_visible_kv": lambda cs: all(any(np.isnan(to_float64(c.tensors[n])).any() for n in "qkv") for c in cs),
    "strided_layouts": lambda cs: all(not c.tensors["q"].is_contiguous() and not c.label.endswith("/bhsd")
                                      for c in cs)
    and any(_is_bshd(c.tensors["q"]) for c in cs),
    "tied_scores": lambda cs: True,
}


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_strategy_reaches_its_class(cls: str) -> None:
    examples = draw_examples(CLASSES[cls](dtype=torch.float16), 30)
    assert REACHES[cls](examples), f"strategy {cls} never produced its defining input in 30 examples"


def test_every_layout_is_drawn() -> None:
    labels = {c.label.rsplit("/", 1)[-1] for c in draw_examples(attention_cases(dtype=torch.bfloat16), 60)}
    assert set(LAYOUTS) <= labels, labels
