"""Adapter: catie-aq/flashT5's `flash_attention_v2_bias` (FlagAttention's kernels with an additive
bias), in flashcheck's attention signature, with a zero bias of shape (1, 1, M, N) (adding 0.0 to a
score is exact, so the attention is the plain one).

    flashcheck check tests/public_kernels/flasht5.py:attention --family attention -k backward

The kernel file is flashT5's, unchanged (sources.json pins it). Its forward and backward are
`torch.library.custom_op`s registered for CUDA only; on a CPU machine (the Triton interpreter) this
adapter registers the same Python bodies for the CPU too, and _cpu_shim answers their CUDA queries
(capability 9.0: BLOCK_M = BLOCK_N = 32 forward and backward).
"""
from __future__ import annotations

import torch

from tests.public_kernels import _cpu_shim, _vendor_path

_FILE = "flasht5_flash_attention_v2_bias.py"
_registered = False


def _load():
    global _registered
    _vendor_path.require(_FILE)
    import flasht5_flash_attention_v2_bias as mod
    if _cpu_shim.INTERPRET and not _registered:
        for op in (mod.flash_attn_v2_fwd, mod.flash_attn_v2_bwd):
            op.register_kernel("cpu")(op._init_fn)
        _cpu_shim.install(mod, (9, 0))
        _registered = True
    return mod


def attention(q, k, v, *, causal=False, scale=None):
    mod = _load()
    bias = torch.zeros((1, 1, q.shape[2], k.shape[2]), dtype=q.dtype, device=q.device)
    return mod.flash_attention_v2_bias(q, k, v, bias, causal=causal, sm_scale=scale)


attention.flashcheck = {
    "dtypes": ["fp16", "bf16"],
    "head_dims": [16, 32, 64, 128],         # assert Dk in {16, 32, 64, 128}
    "causal": True,
    "causal_align": ["bottom_right"],
    "gqa": False,                           # one head count for q, k, v
    "dv": False,
    "block_n": 32,
    "backward_blocks": [32, 32],
}
