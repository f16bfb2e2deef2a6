"""A plain FlashAttention-2 style forward in Triton, written the way a kernel author would write it:
one program per query block and head, an online softmax over key blocks, `kv_lens` padding, causal
(top-left), grouped heads and any strides. It is not flashcheck's production kernel
(kernels/attention.py): it is the kind of kernel an author points `flashcheck check` at, and the
one the cold-verdict measurement of reports/gpu_run.md times.

    flashcheck check examples/triton_attention.py:attention --family attention -n auto
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _attn_fwd(Q, K, V, O, LENS, sm_scale,
              sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
              H, GROUP, M, N, D, DV,
              CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, IEEE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    # 64-bit offsets: a view of more than 2^31 elements (the suite's GPU tests make them) wraps in 32.
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    n_keys = N
    if HAS_LENS:
        n_keys = tl.minimum(tl.load(LENS + b).to(tl.int32), N)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    hi = n_keys
    if CAUSAL:
        hi = tl.minimum(hi, (pid_m + 1) * BLOCK_M)
    for start in range(0, hi, BLOCK_N):
        offs_n = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
        k = tl.load(K + b * skb + hk * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
                    mask=(offs_n[None, :] < n_keys) & (offs_d[:, None] < D), other=0.0)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * sm_scale
        valid = offs_n[None, :] < n_keys
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf: subtract 0 instead, so exp gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_dv[None, :] * svd,
                    mask=(offs_n[:, None] < n_keys) & (offs_dv[None, :] < DV), other=0.0)
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    # A row with no key at all is a row of zeros.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
             out.to(O.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_dv[None, :] < DV))


def attention(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """softmax(scale * q k^T) v over q [B, Hq, M, D], k [B, Hkv, N, D], v [B, Hkv, N, Dv]."""
    B, H, M, D = q.shape
    Hkv, N, DV = k.shape[1], k.shape[2], v.shape[3]
    if H % Hkv:
        raise ValueError(f"query heads {H} are not a multiple of key heads {Hkv}")
    o = torch.empty((B, H, M, DV), dtype=q.dtype, device=q.device)
    if M == 0 or B * H == 0:
        return o
    scale = D ** -0.5 if scale is None else scale
    block_d, block_dv = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))
    wide = max(block_d, block_dv) > 64 or q.dtype == torch.float32
    block = 32 if wide else 64
    lens = kv_lens if kv_lens is not None else o  # any pointer: not read without HAS_LENS
    grid = (triton.cdiv(M, block), B * H)
    _attn_fwd[grid](q, k, v, o, lens, scale, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                    H, H // Hkv, M, N, D, DV,
                    CAUSAL=causal, HAS_LENS=kv_lens is not None, IEEE=q.dtype == torch.float32,
                    BLOCK_M=block, BLOCK_N=block, BLOCK_D=block_d, BLOCK_DV=block_dv,
                    num_warps=4, num_stages=2)
    return o
