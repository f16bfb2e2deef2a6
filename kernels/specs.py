"""The production kernels, registered once each."""
from __future__ import annotations

import math

from .registry import KernelSpec, register
from .softmax import ROW_MAX_N, row_config, softmax, softmax_row


def _row_depth(n: int) -> int:
    return max(1, math.ceil(math.log2(row_config(1, n).block_n)))


register(KernelSpec(
    name="softmax_row",
    family="softmax",
    fn=softmax_row,
    max_n=ROW_MAX_N,
    depth=_row_depth,
    configs=({"rows_per_program": 1}, {"rows_per_program": 4, "num_warps": 2}, {"block_n": 2048}),
    description="one program holds whole rows in registers",
))
