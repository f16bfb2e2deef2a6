"""Known-bad attention kernels: each reproduces one real bug class of NUMERICS.md section 5.

One flash-style forward kernel (online softmax over key blocks, fp32 accumulation, base-2
exponentials) with a `BUG` constexpr that switches exactly one defect on; BUG = 0 is the correct
kernel (the fixed twin). It deliberately loops over every key block up to N and masks with
`tl.where` (the naive structure most of the real bugs were found in), loads Q/K/V as fp32
(bf16 as raw bits under the interpreter, NUMERICS.md section 6) and runs fp32 dots with
input_precision="ieee"; P is not rounded to 16 bits (more accurate than the error model needs).

Each public attribute is `fn(q, k, v, *, causal=False, scale=None, kv_lens=None)` and validates
its inputs with the production kernel's checks, so only its bug can be caught. Run one with
`pytest --kernel tests/zoo/attention_bugs.py:NAME --family attention -x`.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np
import torch

from flashcheck import kernels  # noqa: F401  (the interpreter switch, before triton)
from flashcheck.kernels import DEVICE
from flashcheck.kernels._common import INTERPRET, LOG2E, bf16_as_bits, kernel_view, load_f32_zero, store_f32, tl, triton
from flashcheck.kernels.attention import _check_inputs, effective_scale
from flashcheck.tests.zoo import ZooKernel

NONE, NAN_KV, HEAD_DIM_CUT, CAUSAL_OFF_BY_ONE, KV_LENS_IGNORED, RESCALE_NAN, FP16_SCORES = range(7)
CUT_BLOCK_D = 64  # the block the head dim gets cut to (Triton #621: D = 80 with a 64 block)


@triton.jit
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
    B, H, M, D = q.shape
    N = k.shape[2]
    # zeros: columns a cut head dim never writes stay the same from run to run
    o = torch.zeros((B, H, M, D), dtype=q.dtype, device=q.device)
    if o.numel() == 0 or N == 0:
        return o
    block = 32 if INTERPRET else 64
    block_d = max(16, triton.next_power_of_2(D))
    if bug == HEAD_DIM_CUT:
        block_d = min(block_d, CUT_BLOCK_D)
    qk_scale = float(np.float32(np.float32(effective_scale(scale, D)) * np.float32(LOG2E)))
    kl = kv_lens.to(torch.int32) if kv_lens is not None else torch.zeros(1, dtype=torch.int32, device=q.device)
    xs = [kernel_view(t) for t in (q, k, v, o)]
    _attn_kernel[(triton.cdiv(M, block), B * H)](
        *xs, kl, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, M, N, D, qk_scale,
        BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, CAUSAL=bool(causal), HAS_KVLEN=kv_lens is not None,
        BF16_BITS=bf16_as_bits(q.dtype), BUG=bug)
    return o


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

ZOO: dict[str, ZooKernel] = {}
for _name, (_cls, _trig) in _CLASSES.items():
    _fn = globals()[_name]
    ZOO[_name] = ZooKernel(
        name=_name, family="attention", bug_class=_cls, references=" ".join(inspect.getdoc(_fn).split()),
        broken=_fn, fixed=functools.partial(_attention, bug=NONE), trigger=_trig,
        caps=dict(getattr(_fn, "flashcheck", {})),
        property_hint="special_values" if _name in ("nan_kv_padding", "rescale_nan") else "matches_oracle",
    )

__all__ = list(ZOO)
