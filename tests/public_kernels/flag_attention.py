"""Adapter: FlagOpen/FlagAttention's `flag_attn.flash.attention` (FlashAttention-2 in Triton, with its
own dq and dk/dv backward kernels), in flashcheck's attention signature.

    flashcheck check tests/public_kernels/flag_attention.py:attention --family attention -k backward

The kernel file is FlagAttention's, unchanged (sources.json pins it). On a CPU machine its wrapper's
CUDA queries (flash.py, split_kv.py) are answered by _cpu_shim (capability 9.0: the wrapper's fallback tiles, BLOCK_M =
BLOCK_N = 32 forward and backward, which is what an H100 gets too).
"""
from __future__ import annotations

from tests.public_kernels import _cpu_shim, _vendor_path

_FILES = tuple(f"flag_attn/{n}" for n in ("__init__.py", "dropout.py", "flash.py", "paged.py", "piecewise.py",
                                          "split_kv.py", "total.py", "testing/__init__.py", "testing/dropout.py",
                                          "testing/flash.py", "testing/paged.py", "testing/piecewise.py"))


def attention(q, k, v, *, causal=False, scale=None):
    _vendor_path.require(*_FILES)
    import flag_attn.flash
    import flag_attn.split_kv
    for mod in (flag_attn.flash, flag_attn.split_kv):
        _cpu_shim.install(mod, (9, 0))
    return flag_attn.flash.attention(q, k, v, causal=causal, sm_scale=scale)


attention.flashcheck = {
    "dtypes": ["fp16", "bf16"],             # its tests and benchmarks: fp16, bf16
    "head_dims": [16, 32, 64, 128],         # assert Dk in {16, 32, 64, 128}
    "causal": True,
    "causal_align": ["bottom_right"],       # P_SEQ = N - M: the last query sees every key
    "gqa": True,                            # H % Hk == 0, dk/dv summed over each group
    "dv": False,                            # assert Dq == Dk == Dv
    "block_n": 32,
    "backward_blocks": [32, 32],            # get_bwd_config off sm80/sm86
}
