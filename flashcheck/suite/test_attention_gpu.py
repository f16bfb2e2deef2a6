"""GPU-only attention tests: element offsets past 2^31, and split-KV across streams and graphs.

A kernel that computes a batch, head, row or key offset in int32 reads the wrong element once the
offset passes 2^31 (FlashAttention and xformers have both shipped such overflows). Each case here
is a small problem whose views sit in storages of more than 2^31 elements, with strides that carry
one kind of offset past 2^31 (an int32 stride times an index: a stride of 2^31 or more reaches a
kernel as int64 and hides an int32 index); the padding between the view's elements is NaN, so a
wrong address shows as NaN or as an error past the bound. Every output is checked against the certified oracle
(`oracles.attention.attention_oracle`) with the kernel's bound (`compare_attention`). The storages
take 4-6 GB each, out of reach of the Triton interpreter: the module skips there.

`test_varlen_offsets_past_2_31` does the same for varlen's sequence starts (a packed tensor whose
second sequence starts past 2^31), and `test_split_partials_past_2_31` for split-KV's partial
states (a split's base past 2^31; an output of more than 2^31 elements), checked on sampled rows.
Not covered: a partial-state row index (split x rows) past 2^31, which needs 2^31 rows of fp32
states (128 GiB at head dim 16), more than one GPU holds.

`test_split_kv_on_streams` and `test_split_kv_in_cuda_graphs` run split-KV calls of two shapes in
turn, on two streams at once, and replayed from a CUDA graph beside eager calls. The interpreter
runs one program and one call at a time, so scratch state that a kernel keeps between its programs
or its launches (arrival counters, partial states) is only exercised here.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck import kernels

from flashcheck.plugin import devices

from flashcheck.isolation import faults
from flashcheck.targets.external import declared_as
from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties.limits import within_declared_numel
from flashcheck.oracles.attention import attention_oracle, compare_attention
from flashcheck.properties.attention.outcome import _call, blocking, fp32_dot

pytestmark = pytest.mark.skipif(kernels.INTERPRET, reason="GPU only: storages of more than 2^31 elements are "
                                "out of reach of the Triton interpreter")

FAMILY = "attention"
D = 64
# Strides under 2^31 (so they reach the kernel as int32, as most strides do) times an index
# that carries the offset past 2^31: an index or product left in int32 overflows.
BIG = 2**30 + 64  # index 2 lands at 2^31 + 128 (a multiple of 16: 16-byte loads stay aligned)
ROW = 2**25  # row 64 (a key block's start) lands at 2^31


@pytest.fixture
def big_memory(request: pytest.FixtureRequest):
    """Several GB per test: such tests take turns on the GPU (`devices.exclusive_memory`)."""
    with devices.exclusive_memory(request.node.nodeid):
        yield


def _view(shape: tuple[int, ...], strides: tuple[int, ...], seed: int) -> torch.Tensor:
    """An fp16 view of `shape` and `strides` in a NaN-filled storage just large enough: normal values
    in the view, NaN between its elements (any read outside the view poisons the output)."""
    size = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    buf = torch.full((size,), float("nan"), dtype=torch.float16, device="cuda")
    view = buf.as_strided(shape, strides)
    g = torch.Generator("cuda").manual_seed(seed)
    view.copy_(torch.randn(shape, device="cuda", generator=g, dtype=torch.float32))
    return view


def _contiguous(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    return _view(shape, strides, seed)


def _mask(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A boolean keep-mask (each row keeps key 0) or a float bias (0 or -inf, key 0 kept) as a view
    of `shape` and `strides`."""
    size = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    t = torch.zeros((size,), dtype=dtype, device="cuda").as_strided(shape, strides)
    keep = torch.rand(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) < 0.7
    keep[..., 0] = True
    t.copy_(keep if dtype == torch.bool else torch.where(keep, 0.0, float("-inf")).to(dtype))
    return t


# name -> (q, k, v, kwargs, the feature it needs or None): each carries one kind of offset past 2^31
def _rows_of_keys():  # key block 64.. of k and v
    return _contiguous((1, 1, 16, D), 1), _view((1, 1, 80, D), (0, 0, ROW, 1), 2), \
        _view((1, 1, 80, D), (0, 0, ROW, 1), 3), {}, None


def _rows_of_queries():  # query rows 64..79
    return _view((1, 1, 80, D), (0, 0, ROW, 1), 4), _contiguous((1, 1, 16, D), 5), \
        _contiguous((1, 1, 16, D), 6), {}, None


def _batches():  # batch 2 of q, k and v
    return tuple(_view((3, 1, 16, D), (BIG, 16 * D, D, 1), s) for s in (7, 8, 9)) + ({}, None)


def _heads(m: int):  # query heads 4 and 5, key/value head 2 (GQA: 6 query heads, 3 kv heads)
    def case():  # 16 query rows: packed GQA rows (one program per kv head); 48: one per query head
        q = _view((1, 6, m, D), (0, 2**29 + 64, D, 1), 10)
        return q, _view((1, 3, 16, D), (0, BIG, D, 1), 11), _view((1, 3, 16, D), (0, BIG, D, 1), 12), {}, "gqa"
    return case


def _mask_rows():  # a boolean mask's rows 32..47
    q, k, v = _contiguous((1, 1, 48, D), 13), _contiguous((1, 1, 16, D), 14), _contiguous((1, 1, 16, D), 15)
    return q, k, v, {"attn_mask": _mask((1, 1, 48, 16), (0, 0, 2**26, 1), torch.bool, 16)}, "attn_mask"


def _mask_keys(dtype: torch.dtype):  # a mask's key block 64.. (boolean keep-mask or float bias)
    def case():
        q, k, v = _contiguous((1, 1, 16, D), 17), _contiguous((1, 1, 80, D), 18), _contiguous((1, 1, 80, D), 19)
        return q, k, v, {"attn_mask": _mask((1, 1, 16, 80), (0, 0, 1, ROW), dtype, 20)}, "attn_mask"
    return case


# In-tile offsets past 2^31 ((BLOCK - 1) * stride): the launcher then asks for 64-bit in-tile
# offsets (WIDE); the strides are chosen so that any key block of 32 or more keys, any head-dim
# block of 64, passes 2^31 inside one tile.
ROW_WIDE = 2**26 + 2**22  # key 31 at 2.2e9
DIM_WIDE = 2**25 + 2**21  # element 63 of a head at 2.2e9


def _query_tile_rows():  # query rows 128..143: a later query tile (BLOCK_M up to 128) starts past 2^31
    return _view((1, 1, 144, D), (0, 0, 2**24, 1), 34), _contiguous((1, 1, 16, D), 35), \
        _contiguous((1, 1, 16, D), 36), {}, None


def _wide_key_rows():  # key rows 0..47 of one block, 71M elements apart
    return _contiguous((1, 1, 16, D), 21), _view((1, 1, 48, D), (0, 0, ROW_WIDE, 1), 22), \
        _view((1, 1, 48, D), (0, 0, ROW_WIDE, 1), 23), {}, None


def _wide_head_dims():  # k's and v's head dims 35M elements apart
    return _contiguous((1, 1, 16, D), 24), _view((1, 1, 16, D), (0, 0, 1, DIM_WIDE), 25), \
        _view((1, 1, 16, D), (0, 0, 1, DIM_WIDE), 26), {}, None


def _batches_packed():  # batch 2 with packed GQA rows (one program per (batch, kv head))
    q = _view((3, 6, 16, D), (BIG, 16 * D, D, 1), 27)
    return q, _view((3, 3, 16, D), (BIG, 16 * D, D, 1), 28), _view((3, 3, 16, D), (BIG, 16 * D, D, 1), 29), {}, "gqa"


CASES = {"key_rows": _rows_of_keys, "query_tile_rows": _query_tile_rows, "key_rows_wide": _wide_key_rows, "head_dims_wide": _wide_head_dims,
         "batches_packed": _batches_packed, "query_rows": _rows_of_queries, "batches": _batches,
         "heads_packed": _heads(16), "heads": _heads(48),
         "mask_rows": _mask_rows, "mask_keys": _mask_keys(torch.bool), "bias_keys": _mask_keys(torch.float16)}


@pytest.mark.parametrize("which", sorted(CASES))
def test_offsets_past_2_31(spec: KernelSpec, which: str, big_memory: None) -> None:
    """Views whose batch, head, row, key or mask offsets pass 2^31 elements: within the bound."""
    if spec.contiguous_only:
        pytest.skip(f"{spec.name} declares contiguous_only: these are strided views")
    if not spec.supports(torch.float16) or not spec.supports_head_dim(D):
        pytest.skip(f"{spec.name} does not take fp16 with head dim {D}")
    q, k, v, kw, needs = CASES[which]()
    if needs is not None and not spec.has(needs):
        pytest.skip(f"{spec.name} does not declare {needs}")
    if not within_declared_numel(spec, {"q": q, "k": k, "v": v}):
        pytest.skip(f"{spec.name} declares {declared_as(spec, 'max_numel')}")
    out = _call(spec, q, k, v, kw)
    torch.cuda.synchronize()
    _assert_within(spec, out, q, k, v, kw, which, f"test_offsets_past_2_31' -k '{which}")


def _assert_within(spec: KernelSpec, out: torch.Tensor, q, k, v, kw: dict, what: str, replay: str,
                   oracle=None) -> None:
    oracle = attention_oracle(q, k, v, **kw) if oracle is None else oracle
    bn, nb = blocking(spec, D, k.shape[2], q.dtype, kw)
    c = compare_attention(out, oracle, block_n=bn, n_blocks=nb, fp32_dot=fp32_dot(spec))
    bad = c.violations
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(np.where(bad, c.bound_ratio(), -1.0)), bad.shape))
        raise AssertionError(
            f"{spec.name} [{what}]: {int(bad.sum())} of {bad.size} outputs exceed the bound; worst at "
            f"{list(idx)}: kernel={float(c.actual[idx])!r} expected={float(c.oracle[idx])!r} "
            f"bound={float(c.bound[idx]):.3g}\n"
            f"  q {tuple(q.shape)} stride={q.stride()}; k {tuple(k.shape)} stride={k.stride()}; "
            f"v {tuple(v.shape)} stride={v.stride()}; {sorted(kw)}\n"
            f"  replay: pytest '{__name__.replace('.', '/')}.py::{replay}'")


def test_varlen_offsets_past_2_31(spec: KernelSpec, big_memory: None) -> None:
    """Packed varlen tensors whose second sequence starts past 2^31 elements (token strides under
    2^31 times the sequence's first token): each sequence within the bound of its own dense oracle."""
    if not spec.has("varlen"):
        pytest.skip(f"{spec.name} declares no varlen entry point")
    if spec.contiguous_only:
        pytest.skip(f"{spec.name} declares contiguous_only: these are strided views")
    if not spec.supports(torch.float16) or not spec.supports_head_dim(D):
        pytest.skip(f"{spec.name} does not take fp16 with head dim {D}")
    lens = [2, 1]  # sequence 1 starts at token 2: element 2 * BIG > 2^31 in q, k and v
    q, k, v = (_view((3, 1, D), (BIG, D, 1), s) for s in (30, 31, 32))
    if not within_declared_numel(spec, {"q": q, "k": k, "v": v}):
        pytest.skip(f"{spec.name} declares {declared_as(spec, 'max_numel')}")
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    out = spec.varlen_fn(q, k, v, cu, cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    out = out[0] if isinstance(out, tuple) else out
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(cu.tolist()[:-1], cu.tolist()[1:])):
        dense = [t[a:b].permute(1, 0, 2).unsqueeze(0) for t in (q, k, v)]  # (1, H, len, D) views
        _assert_within(spec, out[a:b].permute(1, 0, 2).unsqueeze(0), *dense, {}, f"varlen sequence {i}",
                       "test_varlen_offsets_past_2_31")


# Split-KV's partial states (splits x o's elements, fp32) indexed past 2^31: a split's base
# offset split * o.numel() (case "split_base": o of 2^26 elements, 48 splits; the empty splits
# store their -inf states too) and a row offset row * Dv inside o (case "output_rows": o of more
# than 2^31 elements). Head dim 16 and one key block keep them cheap; 64 rows are checked.
SPLIT_CASES = {"split_base": (2**22, 48), "output_rows": (2**27 + 2**20, 2)}


@pytest.mark.parametrize("which", sorted(SPLIT_CASES))
def test_split_partials_past_2_31(spec: KernelSpec, which: str, big_memory: None) -> None:
    """Split-KV whose partial states pass 2^31 elements: sampled rows within the bound."""
    m, splits = SPLIT_CASES[which]
    d = 16
    if not spec.has("splits"):
        pytest.skip(f"{spec.name} does not declare num_splits")
    if not spec.supports(torch.float16) or not spec.supports_head_dim(d):
        pytest.skip(f"{spec.name} does not take fp16 with head dim {d}")
    g = torch.Generator("cuda").manual_seed(33)
    q = torch.randn((1, 1, m, d), device="cuda", generator=g, dtype=torch.float32).to(torch.float16)
    k, v = (torch.randn((1, 1, 64, d), device="cuda", generator=g, dtype=torch.float32).to(torch.float16)
            for _ in range(2))
    if not within_declared_numel(spec, {"q": q, "k": k, "v": v}):
        pytest.skip(f"{spec.name} declares {declared_as(spec, 'max_numel')}")
    kw = {"num_splits": splits}
    out = _call(spec, q, k, v, kw)
    torch.cuda.synchronize()
    rows = torch.cat([torch.linspace(0, m - 17, 48, device="cuda").long(), torch.arange(m - 16, m, device="cuda")])
    _assert_within(spec, out[:, :, rows], q[:, :, rows], k, v, kw, f"{which}: rows {rows[:3].tolist()}...",
                   f"test_split_partials_past_2_31' -k '{which}")
    del out, q


# Two split-KV shapes (B, Hq, M, N, splits) at head dim D: different tile counts and split counts, so
# state left by one call (an arrival counter not reset, a partial state of another shape) shows in
# the next one.
STREAM_SHAPES = ((2, 4, 1, 700, 4), (1, 8, 3, 300, 3))
SIDE_BY_SIDE = 12  # calls per stream queued behind the gate: long enough a run side by side to overlap


def _split_cases(spec: KernelSpec) -> list[tuple]:
    """(q, k, v, kw) for each of STREAM_SHAPES, or a skip when the kernel takes none of them."""
    if not spec.has("splits"):
        pytest.skip(f"{spec.name} does not declare num_splits")
    if not spec.supports(torch.float16) or not spec.supports_head_dim(D):
        pytest.skip(f"{spec.name} does not take fp16 with head dim {D}")
    cases = []
    for i, (b, hq, m, n, splits) in enumerate(STREAM_SHAPES):
        hkv = 2 if spec.has("gqa") else hq
        q, k, v = (_contiguous(shape, 40 + 3 * i + j)
                   for j, shape in enumerate(((b, hq, m, D), (b, hkv, n, D), (b, hkv, n, D))))
        cases.append((q, k, v, {"num_splits": splits}))
    return cases


def _unguarded(spec: KernelSpec, case: tuple):
    """The kernel itself, not through the suite's call hook: the hook synchronises the device after
    every call (to name the kernel of a fault), which would run the streams' calls one after
    another and cannot be captured in a graph. A fault here surfaces at the test's synchronise."""
    fn = getattr(spec.fn, "__wrapped__", spec.fn)
    q, k, v, kw = case
    first = lambda r: r[0] if isinstance(r, (tuple, list)) else r  # noqa: E731  (out, lse) -> out
    return lambda: first(faults.unsynchronised_call(fn, spec.name, (q, k, v), kw))


def _gated(*streams: torch.cuda.Stream) -> None:
    """Hold the streams behind one gate (a few milliseconds of sleep on a third stream), so the
    calls queued on them meanwhile start together when it opens and run side by side (the host
    alone issues them more slowly than they run, and each stream's own sleep would end at a
    different time)."""
    gate = torch.cuda.Stream()
    gate.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(gate):
        torch.cuda._sleep(20_000_000)
    opened = torch.cuda.Event()
    opened.record(gate)
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
        s.wait_event(opened)


def _assert_all_within(spec: KernelSpec, cases: list[tuple], outs: list[tuple], replay: str) -> None:
    torch.cuda.synchronize()
    oracles = [attention_oracle(q, k, v, **kw) for q, k, v, kw in cases]
    for i, what, out in outs:
        q, k, v, kw = cases[i]
        _assert_within(spec, out, q, k, v, kw, f"split-KV {what}", replay, oracles[i])


def test_split_kv_on_streams(spec: KernelSpec) -> None:
    """Split-KV calls of two shapes in turn on one stream, then side by side on two streams:
    every output within the bound."""
    cases = _split_cases(spec)
    run = [_unguarded(spec, c) for c in cases]
    outs = [(i, "in turn on one stream", run[i]()) for i in (0, 1, 0, 1)]
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    _gated(*streams)
    for _ in range(SIDE_BY_SIDE):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs.append((i, f"on stream {i} beside stream {1 - i}", run[i]()))
    _assert_all_within(spec, cases, outs, "test_split_kv_on_streams")


def test_split_kv_in_cuda_graphs(spec: KernelSpec) -> None:
    """A split-KV call captured in a CUDA graph on one stream, then replayed on another while eager
    calls of both shapes run on the capturing stream: every output within the bound. A workspace
    that the capture took from its stream would be shared by the replays and those eager calls.
    Skips a kernel that cannot be captured."""
    cases = _split_cases(spec)
    run = [_unguarded(spec, c) for c in cases]
    capturing = torch.cuda.Stream()  # warmed up on the stream that captures, as torch asks
    capturing.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capturing):
        run[0]()
    capturing.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=capturing):
            captured = run[0]()
    except Exception as e:  # noqa: BLE001  (capture is a capability, not part of the numerics contract)
        pytest.skip(f"{spec.name} cannot be captured in a CUDA graph: {type(e).__name__}: {e}")
    replaying = torch.cuda.Stream()
    _gated(replaying, capturing)
    outs = []
    for _ in range(SIDE_BY_SIDE):
        with torch.cuda.stream(replaying):
            graph.replay()
            outs.append((0, "replayed from a CUDA graph beside eager calls", captured.clone()))
        with torch.cuda.stream(capturing):
            outs += [(i, "eager on the capturing stream beside a graph replay", run[i]()) for i in (0, 1)]
    _assert_all_within(spec, cases, outs, "test_split_kv_in_cuda_graphs")
