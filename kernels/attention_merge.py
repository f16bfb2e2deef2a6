"""Split-KV's merge for the fused attention kernel (`kernels/attention.py`), run inside that
kernel: each split of a row's keys leaves its unnormalised state (acc, m, l) in fp32, and the
split that finishes a tile last (an arrival counter per tile) combines the tile's splits, one more
online-softmax step per split in split order 0 .. S-1, and writes o (and lse).

One launch, not two: a decode call reads a few MB of K/V, and on an H200 the second (merge)
launch was a large part of both the GPU's and the host's time per call on short caches
(reports/attention_bench.md, decode and launch sections)."""
from __future__ import annotations

import torch

from ._common import tl, triton

# -- the workspace ---------------------------------------------------------------------------------------
# A split launch needs its splits' partial states (fp32) and one arrival counter (int32) per
# (query tile, batch-head), zero when the launch starts: the tile's last split sets its counter
# back to 0 once it has merged. Launches of one stream run in order, so one workspace per stream
# serves them all; two streams never share one. A decode call's workspace is a few hundred KB,
# and making it per call cost the host more than the kernel's GPU time (two allocations and the
# views of them: about 40 us a call on an H200's host).
_WORKSPACES: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_CACHED_FLOATS = 1 << 24  # larger states (split prefill) are made per call: 64 MB is not kept


def split_workspace(counters: int, floats: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(zeroed int32 counters, fp32 states) of at least these sizes for a split launch on the
    current stream of `device`. While a CUDA graph captures, fresh ones each call (their zero
    fill is captured with the launch): a graph may replay on another stream than it was captured
    on, beside eager calls or another graph."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return (torch.zeros(counters, dtype=torch.int32, device=device),
                torch.empty(floats, dtype=torch.float32, device=device))
    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index))  # what Triton launches on
    kept, states = _WORKSPACES.get(key, (None, None))
    # Each buffer only grows: calls of two sizes in turn never reallocate (nor re-zero) each other's.
    if kept is None or kept.numel() < counters:
        kept = torch.zeros(max(counters, 1024), dtype=torch.int32, device=device)
    if floats <= _CACHED_FLOATS and (states is None or states.numel() < floats):
        states = torch.empty(floats, dtype=torch.float32, device=device)
    _WORKSPACES[key] = kept, states
    if states is None or states.numel() < floats:
        return kept, torch.empty(floats, dtype=torch.float32, device=device)
    return kept, states


# -- the merge ------------------------------------------------------------------------------------------

@triton.jit
def _arrive(counter_ptr):
    """Count this split in; True in the program that completes its tile. Every thread's stores of
    the split's state come before the count (the CTA barrier, then a release at GPU scope), and
    the last arrival's loads after it (acquire): the pattern of a grid barrier. The last arrival
    resets the counter for the next launch on the stream."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == tl.num_programs(2) - 1
    if last:
        tl.store(counter_ptr, 0)
    return last


@triton.jit
def _split_states(ws_ptr, PART_O, PART_L):
    """Where the splits' states live in the workspace: acc of split s at s * PART_O (o's layout),
    then m, l and l32 of split s at s * PART_L (o's row order), each after the previous one's
    splits."""
    splits = tl.num_programs(2).to(tl.int64)
    m_part = ws_ptr + splits * PART_O
    l_part = m_part + splits * PART_L
    return ws_ptr, m_part, l_part, l_part + splits * PART_L


@triton.jit
def _merge_splits_tile(acc_part, m_part, l_part, l32_part, rows, a_offs, row_ok, o_mask, PART_O, PART_L,
                       BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, RETURN_LSE: tl.constexpr,
                       NATURAL: tl.constexpr):
    """The tile's merged state (acc, l, l32, m) from its splits' states (`_split_states`): split
    s's m, l, l32 at s * PART_L + rows, its acc at s * PART_O + a_offs. -inf safe: a split whose keys are all masked
    has m = -inf, l = 0, acc = 0 and contributes nothing; a row whose every split is empty keeps
    m = -inf, l = 0. NATURAL: the splits' m are in natural units (a float attn_mask), else base 2."""
    m_run = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_run = tl.zeros((BLOCK_M,), tl.float32)
    l32_run = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for s in range(0, tl.num_programs(2)):
        si = tl.cast(s, tl.int64)
        m_s = tl.load(m_part + si * PART_L + rows, mask=row_ok, other=float("-inf"))
        m_new = tl.maximum(m_run, m_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        if NATURAL:
            alpha = tl.math.exp2((m_run - m_ref) * 1.4426950408889634)
            beta = tl.math.exp2((m_s - m_ref) * 1.4426950408889634)
        else:
            alpha = tl.math.exp2(m_run - m_ref)
            beta = tl.math.exp2(m_s - m_ref)
        l_run = l_run * alpha + tl.load(l_part + si * PART_L + rows, mask=row_ok, other=0.0) * beta
        if RETURN_LSE:
            l32_run = l32_run * alpha + tl.load(l32_part + si * PART_L + rows, mask=row_ok, other=0.0) * beta
        a_s = tl.load(acc_part + si * PART_O + a_offs, mask=o_mask, other=0.0)
        acc = acc * alpha[:, None] + a_s * beta[:, None]
        m_run = m_new
    return acc, l_run, l32_run, m_run
