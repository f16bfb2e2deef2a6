"""Launch-level facts of the production attention kernel that the GPU taught us (found by
`reports/quality/memcheck_sweep.py` under compute-sanitizer on an H100): they hold on any machine."""
from __future__ import annotations

import importlib

import pytest
import torch
from triton.runtime.errors import OutOfResources

A = importlib.import_module("flashcheck.kernels.attention")
P = importlib.import_module("flashcheck.kernels.attention_plan")
C = importlib.import_module("flashcheck.kernels.attention_config")


@pytest.mark.parametrize("d, dv", [(40, 24), (64, 32), (32, 64), (128, 64), (80, 48), (64, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_q_k_and_v_tiles_share_one_width(d: int, dv: int, dtype: torch.dtype) -> None:
    # A V tile narrower than K's made Triton 3.6 emit an out-of-bounds shared-memory read in the
    # bf16 P @ V wgmma (illegal memory access in varlen and GQA cases with Dv != D).
    cfg = A.attn_config(d, dtype, dv=dv)
    assert cfg.block_d == cfg.block_dv >= max(d, dv)


def test_wide_offsets_follow_the_mask_strides() -> None:
    # A mask view whose key stride makes (BLOCK_N - 1) * stride pass 2^31 needs 64-bit offsets
    # even when q, k, v and o are small (the interpreter segfaulted, the GPU would wrap).
    cfg = A.attn_config(64, torch.float16, n=48)
    q = torch.zeros(1, 1, 16, 64, dtype=torch.float16)
    mask = torch.empty_strided((1, 1, 16, 48), (0, 0, 1, 2**25), dtype=torch.bool, device="meta")
    qs = q.stride()
    assert not P._wide(cfg, qs, qs, qs, qs)
    assert P._wide(cfg, qs, qs, qs, qs, mask.stride())


def test_fewer_stages_when_shared_memory_runs_out() -> None:
    tried = []

    def run(stages: int) -> None:
        tried.append(stages)
        if stages > 2:
            raise OutOfResources(262144, 232448, "shared memory")

    key = ("test", object())
    A._with_stages_that_fit(run, key, 3, fixed=False)
    A._with_stages_that_fit(run, key, 3, fixed=False)  # remembered: no second failed compile
    assert tried == [3, 2, 2]
    with pytest.raises(OutOfResources):  # a depth the caller asked for is never changed
        A._with_stages_that_fit(run, ("other",), 3, fixed=True)


def test_grid_limit_is_a_clear_error() -> None:
    q = torch.zeros(65536, 1, 1, 16, device=A.DEVICE)
    with pytest.raises(ValueError, match="grid limit"):
        A.attention(q, q, q)


def test_the_bounds_key_blocking_is_the_launchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error bound needs the key blocking the launch really uses, and an edged tile (causal, a
    window, a boolean mask) may block the keys differently from the plain one (bf16 D128): the
    spec's blocking (kernels/specs.py) must agree with the plan's block_n for every option and
    every GPU tile, checked here on the GPU's tables whatever the machine."""
    from flashcheck.kernels import get

    for mod in (C, P):
        monkeypatch.setattr(mod, "INTERPRET", False)
    P.launch_plan.cache_clear()
    monkeypatch.setattr(P, "launch_plan", P.launch_plan.__wrapped__)  # no plan built on the GPU's tables outlives the test
    spec, n = get("attention"), 4096
    masks = {torch.bool: torch.ones(1, 1, 64, n, dtype=torch.bool), torch.float32: torch.zeros(1, 1, 64, n)}
    options = [{}, {"causal": True}, {"window": (16, -1)}, {"window": (-1, 0)}, {"window": (8, 8)},
               {"attn_mask": masks[torch.bool]}, {"attn_mask": masks[torch.float32]}]
    differ = set()
    for dtype, table in C._GPU_TABLE.items():
        for d in table:
            q = torch.empty(1, 2, 64, d, dtype=dtype)
            k = torch.empty(1, 2, n, d, dtype=dtype)
            for opts in options:
                mask = opts.get("attn_mask")
                plan = P.launch_plan(
                    dtype, q.shape, q.stride(), k.shape, k.stride(), k.shape, k.stride(), q.shape, q.stride(),
                    None if mask is None else (mask.dtype, mask.expand(1, 2, 64, n).stride()), None,
                    batch=1, m_max=64, n_max=n, varlen=False, causal=bool(opts.get("causal")), scale=None,
                    has_kv_lens=False, window=opts.get("window", (-1, -1)), softcap=0.0, causal_align="top_left",
                    return_lse=False, num_splits=1, pack_gqa=None, block_m=None, block_n=None, num_warps=None,
                    num_stages=None, rowsum_fp32=False)
                bn = plan.cfg.block_n
                assert spec.key_blocking(d, n, dtype, opts) == (bn, n // bn), (dtype, d, opts)
                differ |= {(dtype, d)} if bn != C._GPU_TABLE[dtype][d][1] else set()
    assert differ == {(dt, d) for (dt, d), t in C._GPU_EDGED.items() if t[1] != C._GPU_TABLE[dt][d][1]}, differ


def test_row_sum_method_ignores_tile_overrides() -> None:
    # The launch knobs of KernelSpec.configs must keep the bits: the row-sum method may follow
    # (dtype, head dim, edged) only.
    for dtype, d, edged in C._ROWSUM_DOT:
        base = A.attn_config(d, dtype, edged=edged)
        assert base.rowsum_dot
        for kw in ({"block_m": 16}, {"block_m": 128, "num_warps": 8}, {"num_stages": 1}):
            assert A.attn_config(d, dtype, edged=edged, **kw).rowsum_dot, kw


def test_an_automatic_split_count_is_bounded_by_a_split_per_key_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_splits=0 lets the launcher choose; the bound cannot know the count, so it takes a split
    per key block, which the GPU's choice (`auto_splits`, at least 2 blocks a split) never exceeds."""
    from flashcheck.kernels.registry import get
    from flashcheck.properties.attention.outcome import blocking

    spec = get("attention")
    for n in (1, 100, 4096, 70000):
        bn, nb = blocking(spec, 64, n, torch.float16, {})
        assert blocking(spec, 64, n, torch.float16, {"num_splits": 0}) == (bn, nb + (nb if nb > 1 else 0))
        assert blocking(spec, 64, n, torch.float16, {"num_splits": 3}) == (bn, nb + 3)
        assert blocking(spec, 64, n, torch.float16, {"num_splits": 1}) == (bn, nb)
    monkeypatch.setattr(C, "INTERPRET", False)
    monkeypatch.setattr(C, "_sm_count", lambda: 132)
    for programs in (1, 8, 32, 131, 132, 500):
        for n in (1, 127, 128, 1024, 4096, 65536, 1 << 20):
            for block_n in (32, 64, 128):
                assert C.auto_splits(programs, n, block_n) <= max(1, -(-n // block_n))
