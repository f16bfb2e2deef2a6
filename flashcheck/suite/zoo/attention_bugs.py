"""Known-bad attention kernels: each reproduces one real bug class of NUMERICS.md section 5.

One flash-style forward kernel (online softmax over key blocks, fp32 accumulation, base-2
exponentials) with a `BUG` constexpr that switches exactly one defect on; BUG = 0 is the correct
kernel (the fixed twin). It deliberately loops over every key block up to N and masks with
`tl.where` (the naive structure most of the real bugs were found in), loads Q/K/V as fp32
(bf16 as raw bits under the interpreter, NUMERICS.md section 6) and runs fp32 dots with
input_precision="ieee"; P is not rounded to 16 bits (more accurate than the error model needs).

Each public attribute is `fn(q, k, v, *, causal=False, scale=None, kv_lens=None)` and validates
its inputs with the production kernel's checks, so only its bug can be caught. Run one with
`pytest --kernel flashcheck/suite/zoo/attention_bugs.py:NAME --family attention -x`.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np
import torch

from flashcheck import kernels  # noqa: F401  (the interpreter switch, before triton)
from flashcheck.kernels import DEVICE
from flashcheck.kernels._common import INTERPRET, LOG2E, bf16_as_bits, kernel_view, load_f32_zero, store_f32, tl, triton
from flashcheck.kernels.attention_args import _check_cu, _check_inputs, _check_options, _check_qkv
from flashcheck.oracles.attention import effective_scale
from flashcheck.suite.zoo.kernel import ZooKernel

NONE, NAN_KV, HEAD_DIM_CUT, CAUSAL_OFF_BY_ONE, KV_LENS_IGNORED, RESCALE_NAN, FP16_SCORES = range(7)
CUT_BLOCK_D = 64  # the block the head dim gets cut to (Triton #621: D = 80 with a 64 block)


@triton.jit(do_not_specialize=["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som",
                              "H", "M", "N"])
def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, kvlen_ptr,
                 sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                 H, M, N, D, qk_scale,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_KVLEN: tl.constexpr, BF16_BITS: tl.constexpr, BUG: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    n_valid = N
    if HAS_KVLEN:
        if BUG != 4:  # KV_LENS_IGNORED: every stored key counts
            n_valid = tl.load(kvlen_ptr + b).to(tl.int32)
    q_mask = (offs_m < M)[:, None] & d_mask[None, :]
    q = load_f32_zero(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, q_mask, BF16_BITS)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + offs_n
        if BUG == 1:  # NAN_KV: loads masked by the stored length N only, not by kv_lens
            key_ok = cols < N
        else:
            key_ok = cols < n_valid
        kt = load_f32_zero(k_ptr + b * skb + h * skh + cols[None, :] * skn + offs_d[:, None] * skd,
                           key_ok[None, :] & d_mask[:, None], BF16_BITS)
        v = load_f32_zero(v_ptr + b * svb + h * svh + cols[:, None] * svn + offs_d[None, :] * svd,
                          key_ok[:, None] & d_mask[None, :], BF16_BITS)
        s = tl.dot(q, kt, input_precision="ieee")
        if BUG == 6:  # FP16_SCORES: the dot's result kept in fp16 (overflows past 65504)
            s = s.to(tl.float16).to(tl.float32)
        s = s * qk_scale
        vis = (cols < n_valid)[None, :]
        if CAUSAL:
            if BUG == 3:  # CAUSAL_OFF_BY_ONE: a query does not see its own key
                vis = vis & (cols[None, :] < offs_m[:, None])
            else:
                vis = vis & (cols[None, :] <= offs_m[:, None])
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if BUG == 5:  # RESCALE_NAN: exp2(-inf - -inf) for a row that has seen only masked keys
            m_ref = m_new
        else:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    store_f32(o_ptr + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod, o, q_mask, BF16_BITS)


def _attention(q, k, v, *, causal=False, scale=None, kv_lens=None, bug: int = NONE) -> torch.Tensor:
    _check_inputs(q, k, v, causal, scale, kv_lens)
    # zeros: columns a cut head dim never writes stay the same from run to run
    o = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if o.numel() and k.shape[2]:
        _run(q, k, v, o, q.shape[2], k.shape[2], causal=causal, scale=scale, kv_lens=kv_lens, bug=bug)
    return o


def _run(q, k, v, o, M: int, N: int, *, causal, scale, kv_lens=None, bug: int = NONE) -> None:
    """One launch on (B, H, seq, D) views: queries [0, M), keys [0, N) of them."""
    B, H, _, D = q.shape
    block_d = max(16, triton.next_power_of_2(D))
    # 64-row tiles of a 256-wide head need 320-344 KB of shared memory: past any GPU's limit
    block = 32 if INTERPRET or block_d > 128 else 64
    if bug == HEAD_DIM_CUT:
        block_d = min(block_d, CUT_BLOCK_D)
    qk_scale = float(np.float32(np.float32(effective_scale(scale, D)) * np.float32(LOG2E)))
    kl = kv_lens.to(torch.int32) if kv_lens is not None else torch.zeros(1, dtype=torch.int32, device=q.device)
    xs = [kernel_view(t) for t in (q, k, v, o)]
    _attn_kernel[(triton.cdiv(M, block), B * H)](
        *xs, kl, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, M, N, D, qk_scale,
        BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, CAUSAL=bool(causal), HAS_KVLEN=kv_lens is not None,
        BF16_BITS=bf16_as_bits(q.dtype), BUG=bug)


def nan_kv_padding(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """NaN leak from padded K/V: keys past kv_lens get score -inf, but K and V are loaded up to
    the stored length, so NaN or garbage stored there reaches P @ V as 0 * NaN = NaN.
    FlashAttention #1395/#1745, vLLM PR #30887, PyTorch #101967."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=NAN_KV)


def head_dim_cut(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """The head dim cut to the block: BLOCK_D = 64 for D = 80 (or any D > 64): dims past 64 drop
    out of Q K^T and are never written. Triton #621."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=HEAD_DIM_CUT)


def causal_off_by_one(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """Causal mask j < i instead of j <= i: every query misses its own key (row 0 sees nothing).
    The off-by-one / alignment class of causal masks (top-left vs bottom-right, M != N:
    FlashAttention 2.1 changed the alignment; PyTorch SDPA is_causal is top-left)."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=CAUSAL_OFF_BY_ONE)


def kv_lens_ignored(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """kv_lens accepted but ignored: keys past each batch's valid length are attended to. The
    key-padding class of FlashAttention #1395, vLLM PR #30887 (padding that must not be seen)."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=KV_LENS_IGNORED)


def rescale_nan(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """exp(-inf - -inf) = NaN in the online rescale: a query row whose keys are all masked
    (kv_len = 0) gives NaN instead of zeros. FlashInfer #4267/#4451, FlashAttention #1930,
    PyTorch #127055 (SDPA NaN for fully masked rows), vLLM PR #4405."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=RESCALE_NAN)


def fp16_scores(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """The Q K^T dot kept in fp16 (out_dtype=fp16): scores past 65504 overflow to inf (inf - inf
    = NaN) and every score loses 13 bits. The fp16 overflow class of tt-metal #12661 and
    vLLM #56578 (no fp32 headroom for large logits)."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens, bug=FP16_SCORES)


# ---- fixed twin and triggers (tests/test_zoo.py) ---------------------------------------------------

def _qkv(b=1, h=1, m=40, n=40, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(dtype).to(DEVICE) for s in (m, n, n)]


def _trigger_nan_kv():
    q, k, v = _qkv(b=2, n=40)
    k[:, :, 20:] = float("nan")
    v[:, :, 20:] = float("nan")
    return dict(q=q, k=k, v=v, kv_lens=torch.tensor([20, 20], dtype=torch.int32, device=DEVICE))


def _trigger_head_dim():
    q, k, v = _qkv(d=80)
    return dict(q=q, k=k, v=v)


def _trigger_causal():
    q, k, v = _qkv(m=40, n=40)
    return dict(q=q, k=k, v=v, causal=True)


def _trigger_kv_lens():
    q, k, v = _qkv(b=2, n=40)
    return dict(q=q, k=k, v=v, kv_lens=torch.tensor([13, 40], dtype=torch.int32, device=DEVICE))


def _trigger_rescale():
    q, k, v = _qkv(b=2, n=40)
    return dict(q=q, k=k, v=v, kv_lens=torch.tensor([0, 40], dtype=torch.int32, device=DEVICE))


def _trigger_fp16_scores():
    q, k, v = _qkv(d=16)
    q, k = q * 100.0, k * 100.0  # scores ~ 1e5: past fp16's 65504
    return dict(q=q, k=k, v=v)


_CLASSES = {
    "nan_kv_padding": ("NaN leak from padded K/V", _trigger_nan_kv),
    "head_dim_cut": ("head dim cut to the block", _trigger_head_dim),
    "causal_off_by_one": ("causal mask off by one", _trigger_causal),
    "kv_lens_ignored": ("kv_lens ignored (key padding attended)", _trigger_kv_lens),
    "rescale_nan": ("exp(-inf - -inf) = NaN in the online rescale (fully masked rows)", _trigger_rescale),
    "fp16_scores": ("scores kept in fp16 (overflow)", _trigger_fp16_scores),
}

def _varlen_flash(q, k, v, cu_q, cu_k, *, max_seqlen_q, max_seqlen_k, causal=False, scale=None,
                  bug: bool = False) -> torch.Tensor:
    """Packed sequences through the flash kernel above, one launch per sequence on views of the
    packed tensors from the sequence's first row on. The bug: the key count of every launch is
    max_seqlen_k, not the sequence's own length (cu_seqlens_k[b + 1] - cu_seqlens_k[b])."""
    _check_qkv(q, k, v, 3, "(total, H, D)")
    if k.shape[0] != v.shape[0] or not (q.shape[1] == k.shape[1] == v.shape[1]) or not (
            q.shape[2] == k.shape[2] == v.shape[2]):
        raise ValueError(f"this kernel takes MHA with one head dim: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    _check_options(causal, scale, None, 0.0, "top_left", False, 1)
    cq = _check_cu("cu_seqlens_q", cu_q, None, q.shape[0], max_seqlen_q, "max_seqlen_q")
    ck = _check_cu("cu_seqlens_k", cu_k, len(cq) - 1, k.shape[0], max_seqlen_k, "max_seqlen_k")
    o = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    from_row = lambda t, r: t[r:].transpose(0, 1)[None]  # noqa: E731  (1, H, rows from r on, D)
    for b in range(len(cq) - 1):
        m, n = cq[b + 1] - cq[b], (max_seqlen_k if bug else ck[b + 1] - ck[b])
        if m and n:
            _run(from_row(q, cq[b]), from_row(k, ck[b]), from_row(v, ck[b]), from_row(o, cq[b]), m, n,
                 causal=causal, scale=scale)
    return o


def varlen_past_cu_seqlens(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """Varlen keys counted by max_seqlen_k instead of cu_seqlens_k: every sequence attends to
    max_seqlen_k keys from its first one on, the next sequences' keys and, for the last ones, rows
    past the packed K/V (an out-of-bounds read). The dense entry point is correct; `varlen_fn`
    carries the bug. The varlen boundary class of vLLM PR #27547 and FlashInfer #4347, past the
    packed end. Caught on the CPU by the interpreter's bounds check, on a
    GPU by the oracle (other sequences' keys) or an illegal-address fault."""
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens)


def _varlen_past_fn(q, k, v, cu_q, cu_k, **kw):
    return _varlen_flash(q, k, v, cu_q, cu_k, bug=True, **kw)


def _varlen_within_fn(q, k, v, cu_q, cu_k, **kw):
    return _varlen_flash(q, k, v, cu_q, cu_k, bug=False, **kw)


def _varlen_fixed(q, k, v, *, causal=False, scale=None, kv_lens=None):
    return _attention(q, k, v, causal=causal, scale=scale, kv_lens=kv_lens)


def _trigger_varlen_past():
    """The last sequence is shorter than max_seqlen_k: its keys run 2 rows past the packed K/V."""
    g = torch.Generator().manual_seed(3)
    lq, lk = [3, 1, 5], [6, 1, 4]
    q, k, v = (torch.randn(sum(n), 2, 8, generator=g).to(DEVICE) for n in (lq, lk, lk))
    cu = lambda ls: torch.tensor(np.concatenate([[0], np.cumsum(ls)]), dtype=torch.int32, device=DEVICE)  # noqa: E731
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=5, max_seqlen_k=6)


# What the one-defect flash kernel above takes: the issue-4 contract (MHA, top-left causal,
# kv_lens, D = Dv), declared so the suite never draws a feature it lacks.
LEGACY_CAPS = {"gqa": False, "dv": False, "window": False, "softcap": False, "varlen": False, "lse": False,
               "attn_mask": False, "splits": False, "causal_align": ["top_left"]}
ZOO: dict[str, ZooKernel] = {}
for _name, (_cls, _trig) in _CLASSES.items():
    _fn = globals()[_name]
    _fn.flashcheck = dict(LEGACY_CAPS)
    ZOO[_name] = ZooKernel(
        name=_name, family="attention", bug_class=_cls, references=" ".join(inspect.getdoc(_fn).split()),
        broken=_fn, fixed=functools.partial(_attention, bug=NONE), trigger=_trig,
        caps=dict(getattr(_fn, "flashcheck", {})),
        property_hint="special_values" if _name in ("nan_kv_padding", "rescale_nan") else "matches_oracle",
    )
varlen_past_cu_seqlens.flashcheck = dict(LEGACY_CAPS, varlen=True, varlen_fn=_varlen_past_fn)
_varlen_fixed.flashcheck = dict(LEGACY_CAPS, varlen=True, varlen_fn=_varlen_within_fn)
ZOO["varlen_past_cu_seqlens"] = ZooKernel(
    name="varlen_past_cu_seqlens", family="attention", bug_class="varlen keys past cu_seqlens (out-of-bounds read)",
    references=" ".join(inspect.getdoc(varlen_past_cu_seqlens).split()), broken=varlen_past_cu_seqlens,
    fixed=_varlen_fixed, trigger=_trigger_varlen_past, caps=dict(varlen_past_cu_seqlens.flashcheck),
    property_hint="interpreter bounds check / matches_oracle")



# ---- the feature bug classes (issue 9): the production kernel with one defect at its seams -------
#
# Each wraps `kernels.attention.attention` (or `attention_varlen`) and gets exactly one thing wrong
# where real kernels did: the head mapping, the softcap, a window edge, a sequence boundary, the
# merge of split states, the lse of empty rows, the sense of a boolean mask. The fixed twin is the
# same wrapper with the defect switched off, so the production kernel's correctness is all they
# share. They declare what they take (`flashcheck` capabilities), so the suite draws only that.

from flashcheck.kernels.attention import attention as _prod, attention_varlen as _prod_varlen  # noqa: E402
from flashcheck.oracles.attention import visibility as _visibility  # noqa: E402


def _gqa(q, k, v, *, bug: bool = False, **kw):
    g = q.shape[1] // k.shape[1]
    if g > 1:  # MHA on K/V expanded per query head: repeat_interleave (h // g) is right, repeat (h % Hkv) not
        expand = (lambda t: t.repeat(1, g, 1, 1)) if bug else (lambda t: t.repeat_interleave(g, dim=1))
        k, v = expand(k), expand(v)
    return _prod(q, k, v, **kw)


def gqa_head_mapping(q, k, v, **kw):
    """GQA head mapping: query head h reads kv head h % Hkv instead of h // (Hq / Hkv) (the two
    agree only for MQA and MHA). HipKittens PR #22, fla #1029, FreeToken PR #177."""
    return _gqa(q, k, v, bug=True, **kw)


def _softcap(q, k, v, *, bug: bool = False, softcap=0.0, **kw):
    return _prod(q, k, v, softcap=0.0 if bug else softcap, **kw)


def softcap_ignored(q, k, v, **kw):
    """softcap accepted but not applied: the scores go uncapped into the softmax.
    sgl-kernel-xpu PR #491, unsloth-zoo PR #593."""
    return _softcap(q, k, v, bug=True, **kw)


def _window(q, k, v, *, bug: bool = False, window=None, **kw):
    if bug and window is not None and int(window[0]) >= 0:
        window = (int(window[0]) + 1, int(window[1]))  # the left edge one key too far
    return _prod(q, k, v, window=window, **kw)


def window_off_by_one(q, k, v, **kw):
    """Sliding window off by one: the left edge admits one key too many (left = 0 sees the
    previous key). transformers #39408, FlashAttention #895."""
    return _window(q, k, v, bug=True, **kw)


def _varlen(q, k, v, cu_q, cu_k, *, bug: bool = False, max_seqlen_q, max_seqlen_k, return_lse=False, **kw):
    """Each sequence on its own (dense), the buggy one reading one key past its end."""
    o = torch.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    _prod_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **kw)  # validation
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        end = min(ck[b + 1] + (1 if bug else 0), k.shape[0])
        as4 = lambda t: t.transpose(0, 1)[None]  # noqa: E731
        ob, lb = _prod(as4(q[cq[b]:cq[b + 1]]), as4(k[ck[b]:end]), as4(v[ck[b]:end]), return_lse=True, **kw)
        o[cq[b]:cq[b + 1]] = ob[0].transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = lb[0]
    return (o, lse) if return_lse else o


def _varlen_boundary_fn(q, k, v, cu_q, cu_k, **kw):
    return _varlen(q, k, v, cu_q, cu_k, bug=True, **kw)


def _varlen_fixed_fn(q, k, v, cu_q, cu_k, **kw):
    return _varlen(q, k, v, cu_q, cu_k, bug=False, **kw)


def varlen_boundary(q, k, v, **kw):
    """Varlen boundary crossing: each packed sequence's keys run one past its end, into the next
    sequence (the dense entry point is the production kernel; `varlen_fn` carries the bug).
    FlashInfer #4347, vLLM PR #27547."""
    return _prod(q, k, v, **kw)


def varlen_fixed(q, k, v, **kw):
    return _prod(q, k, v, **kw)


varlen_boundary.flashcheck = {"varlen_fn": _varlen_boundary_fn}
varlen_fixed.flashcheck = {"varlen_fn": _varlen_fixed_fn}


def _split_merge(q, k, v, *, bug: bool = False, causal=False, scale=None, kv_lens=None, causal_align="top_left",
                 softcap=0.0, return_lse=False, splits: int = 2, **kw):
    """Split-KV by hand: each split is a production call on its keys (a boolean mask carries the
    global causal/kv_lens visibility), then the splits' (o, lse) are merged in torch."""
    _check_inputs(q, k, v, causal, scale, kv_lens, causal_align=causal_align, softcap=softcap)
    B, Hq, M, _ = q.shape
    N = k.shape[2]
    lens = kv_lens.tolist() if kv_lens is not None else [N] * B
    vis = torch.from_numpy(np.stack([_visibility(M, N, lens[b], bool(causal), None, causal_align)
                                     for b in range(B)])[:, None]).to(q.device)
    cuts = [round(i * N / splits) for i in range(splits + 1)]
    os, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        o_s, l_s = _prod(q, k[:, :, a:b], v[:, :, a:b], scale=scale, softcap=softcap, attn_mask=vis[..., a:b],
                         return_lse=True)
        os.append(o_s.float())
        lses.append(l_s)
    lse = torch.stack(lses)  # (S, B, Hq, M)
    m = lse.max(dim=0).values
    if not bug:  # -inf safe: a row whose every split is empty keeps weight 0, not exp(-inf - -inf)
        m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    w = torch.exp(lse - m)
    tot = w.sum(0)
    o = (w[..., None] * torch.stack(os)).sum(0) / torch.where(tot == 0, torch.ones_like(tot), tot)[..., None]
    o = o.to(q.dtype)
    out_lse = m + torch.log(tot)
    return (o, out_lse) if return_lse else o


def split_merge_empty(q, k, v, **kw):
    """Merge of empty split states: the merge takes exp(lse_s - max lse) with every split of a row
    empty (lse = -inf): exp(-inf - -inf) = NaN where zeros are due. FlashInfer #4051."""
    return _split_merge(q, k, v, bug=True, **kw)


_SPLIT_CAPS = {"window": False, "attn_mask": False, "splits": False, "gqa": True}
split_merge_empty.flashcheck = dict(_SPLIT_CAPS)


def _lse_convention(q, k, v, *, bug: bool = False, return_lse=False, **kw):
    o, lse = _prod(q, k, v, return_lse=True, **kw)
    if bug:  # FlashAttention 2 writes +inf for rows with no key; this kernel declares -inf
        lse = torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)
    return (o, lse) if return_lse else o


def lse_empty_rows(q, k, v, **kw):
    """LSE convention for empty rows: +inf (FlashAttention 2's choice) while declaring -inf (the
    torch.logsumexp convention) — whoever consumes it (a merge, the backward) gets it backwards.
    FlashAttention PR #1851, FlashInfer #2169."""
    return _lse_convention(q, k, v, bug=True, **kw)


def _mask_sense(q, k, v, *, bug: bool = False, attn_mask=None, **kw):
    if bug and attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask  # True read as "masked out" (the SDPA convention inverted)
    return _prod(q, k, v, attn_mask=attn_mask, **kw)


def inverted_bool_mask(q, k, v, **kw):
    """Boolean attn_mask inverted: True taken as "masked out" instead of SDPA's "takes part" (one
    public SDPA-style Triton kernel; its own tests never pass a boolean mask)."""
    return _mask_sense(q, k, v, bug=True, **kw)


def _qkv_gqa(b=1, hq=6, hkv=2, m=5, n=40, d=16, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, s: torch.randn(b, h, s, d, generator=g).to(dtype).to(DEVICE)  # noqa: E731
    return mk(hq, m), mk(hkv, n), mk(hkv, n)


def _trigger_gqa():
    q, k, v = _qkv_gqa()
    return dict(q=q, k=k, v=v)


def _trigger_softcap():
    q, k, v = _qkv(d=16)
    return dict(q=q * 4, k=k * 4, v=v, softcap=1.0)


def _trigger_window():
    q, k, v = _qkv(m=20, n=20)
    return dict(q=q, k=k, v=v, window=(0, 0))


def _trigger_varlen():
    g = torch.Generator().manual_seed(2)
    lq, lk = [3, 1, 5], [4, 1, 6]
    q = torch.randn(sum(lq), 2, 8, generator=g).to(DEVICE)
    k = torch.randn(sum(lk), 2, 8, generator=g).to(DEVICE)
    v = torch.randn(sum(lk), 2, 8, generator=g).to(DEVICE)
    cu = lambda ls: torch.tensor(np.concatenate([[0], np.cumsum(ls)]), dtype=torch.int32, device=DEVICE)  # noqa: E731
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=5, max_seqlen_k=6)


def _trigger_split():
    q, k, v = _qkv(b=2, n=40)
    return dict(q=q, k=k, v=v, kv_lens=torch.tensor([0, 40], dtype=torch.int32, device=DEVICE))


def _trigger_lse():
    q, k, v = _qkv(b=2, n=40)
    return dict(q=q, k=k, v=v, kv_lens=torch.tensor([0, 40], dtype=torch.int32, device=DEVICE), return_lse=True)


def _trigger_mask():
    q, k, v = _qkv(m=8, n=12)
    mask = torch.zeros(8, 12, dtype=torch.bool, device=DEVICE)
    mask[:, :3] = True
    return dict(q=q, k=k, v=v, attn_mask=mask)


_FEATURE_CLASSES = {
    "gqa_head_mapping": ("GQA head mapping", _trigger_gqa, functools.partial(_gqa, bug=False), "matches_oracle"),
    "softcap_ignored": ("softcap accepted but not applied", _trigger_softcap,
                        functools.partial(_softcap, bug=False), "matches_oracle"),
    "window_off_by_one": ("window off by one", _trigger_window, functools.partial(_window, bug=False),
                          "matches_oracle"),
    "varlen_boundary": ("varlen boundary crossing", _trigger_varlen, varlen_fixed, "matches_oracle"),
    "split_merge_empty": ("merge of empty split states", _trigger_split,
                          functools.partial(_split_merge, bug=False), "special_values"),
    "lse_empty_rows": ("LSE convention for empty rows", _trigger_lse, functools.partial(_lse_convention, bug=False),
                       "special_values"),
    "inverted_bool_mask": ("boolean attn_mask inverted", _trigger_mask, functools.partial(_mask_sense, bug=False),
                           "matches_oracle"),
}
for _name, (_cls, _trig, _fixed, _hint) in _FEATURE_CLASSES.items():
    _fn = globals()[_name]
    ZOO[_name] = ZooKernel(
        name=_name, family="attention", bug_class=_cls, references=" ".join(inspect.getdoc(_fn).split()),
        broken=_fn, fixed=_fixed, trigger=_trig, caps=dict(getattr(_fn, "flashcheck", {})), property_hint=_hint,
    )

__all__ = list(ZOO)
