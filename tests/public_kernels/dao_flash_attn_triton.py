"""Adapter: Dao-AILab/flash-attention's flash_attn/flash_attn_triton.py (`FlashAttnFunc`, the
"experimental" Triton FlashAttention with its own backward), in flashcheck's attention signature.
Its layout is (B, M, H, D): q, k, v are handed over as transposed views, o handed back the same way.

    flashcheck check tests/public_kernels/dao_flash_attn_triton.py:attention --family attention -k backward

The kernel file is flash-attention's, unchanged (sources.json pins it). It was written for
triton 2.0.0.dev20221202: its kernels call `tl.dot(a, b, trans_b=True)`, a keyword Triton removed
(2.1), so on this Triton it does not compile (sources.json records the run).
"""
from __future__ import annotations

from tests.public_kernels import _vendor_path

_FILE = "dao_flash_attn_triton.py"


def attention(q, k, v, *, causal=False, scale=None):
    _vendor_path.require(_FILE)
    import dao_flash_attn_triton as mod
    o = mod.FlashAttnFunc.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, causal, scale)
    return o.transpose(1, 2)


attention.flashcheck = {
    "dtypes": ["fp16", "bf16"],             # assert q.dtype in [torch.float16, torch.bfloat16]
    "max_head_dim": 128,                    # assert d <= 128
    "causal": True,
    "causal_align": ["top_left"],           # offs_m >= offs_n, with no offset for N - M
    "gqa": False,
    "dv": False,
    "block_n": 128,
    "backward_blocks": [128, 128],
}
