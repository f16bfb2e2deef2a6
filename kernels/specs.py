"""The production kernels, registered once each."""
from __future__ import annotations

import math

import torch

from ._runtime import INTERPRET as _INTERPRET
from .attention_spec import AttentionSpec
from .registry import register
from .softmax_spec import SoftmaxSpec
from .softmax import (
    DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT, ROW_MAX_N, softmax, softmax_online, softmax_row, softmax_split,
)
from .softmax_depth import online_depth, row_depth, softmax_depth, split_depth


register(SoftmaxSpec(
    name="softmax_row",
    family="softmax",
    fn=softmax_row,
    max_n=ROW_MAX_N,
    sizes=(ROW_MAX_N,),
    # Per-thread sequential adds plus tree levels of tl.sum on the GPU (and NumPy's pairwise
    # sum in the interpreter), for any rows-per-program: see kernels.softmax_depth.row_depth.
    depth=row_depth,
    # tl.sum's order follows the launch layout: rows per program, warps and block width all
    # change it (a soak run found block_n=2048 changing fp32 bits), so none of these knobs is
    # a bit-identical configuration; each must still meet the bound. Two rows in 16 warps keep
    # at most 128 values a thread at N = ROW_MAX_N (4 rows in 2 warps held 2048, spilled, and
    # took minutes to compile on an H200).
    tunings=({"rows_per_program": 1}, {"rows_per_program": 2, "num_warps": 16}, {"block_n": 2048}),
    description="one program holds whole rows in registers",
))


# The GPU's chunks (4096 lanes; split spans of 32768 columns, merged 1024 pairs at a time) leave
# most drawn rows in one chunk and one span, where the rescale between chunks, the merge of
# several spans and its loop never run: a GPU mutation run left six mutants of the merge alive
# that the interpreter's small chunks kill at once. So on a GPU each also runs at the
# interpreter's chunk sizes, which must meet the bound too; in the interpreter those are the
# defaults already.
SMALL_CHUNKS = {"softmax_online": () if _INTERPRET else ({"block_n": 64},),
                "softmax_split": () if _INTERPRET else ({"block_n": 32, "chunks_per_block": 2, "merge_block": 4},)}

# Online and split-row: the bits depend on the chunk sizes (block_n, chunks_per_block,
# merge_block: the sums reassociate) but not on num_warps (per-lane state plus a fixed
# pairwise tree), so only num_warps variants are listed as identical-bit configs.
register(SoftmaxSpec(
    name="softmax_online",
    family="softmax",
    fn=softmax_online,
    depth=online_depth,
    configs=({"num_warps": 1}, {"num_warps": 4}, {"num_warps": 16}),
    tunings=SMALL_CHUNKS["softmax_online"],
    description="one program per row, running (max, sum) per lane over chunks, then a normalize pass",
))

register(SoftmaxSpec(
    name="softmax_split",
    family="softmax",
    fn=softmax_split,
    depth=split_depth,
    configs=({"num_warps": 1}, {"num_warps": 4}, {"num_warps": 16}),
    tunings=SMALL_CHUNKS["softmax_split"],
    description="many programs per row give (max, sum) pairs; a normalize pass merges them (looped) and writes",
))

register(SoftmaxSpec(
    name="softmax",
    family="softmax",
    fn=softmax,
    depth=softmax_depth,
    # where the dispatcher leaves the row kernel (fp32, then 16-bit rows)
    sizes=tuple(sorted({DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT})),
    description="dispatcher: row / online / split-row from (M, N, dtype) and the GPU's SM count",
))


# ---- attention (kernels/attention.py) --------------------------------------------------------
from .attention import (  # noqa: E402
    MAX_HEAD_DIM as _ATTN_MAX_D, attention as _attention, attention_varlen as _attention_varlen,
    attn_config as _attn_config,
)
from .attention_args import normalize_window as _normalize_window  # noqa: E402
from .attention_plan import edged_tile as _edged_tile  # noqa: E402
from .attention_backward_config import bound_blocks as _bound_blocks  # noqa: E402


def _attention_backward_blocking(head_dim: int, head_dim_v: int, m: int, n: int, dtype, options) -> tuple[int, int]:
    """(block_m, block_n) of the backward's default launch for this call's options: the bound's."""
    return _bound_blocks(head_dim, dtype, dv=head_dim_v, window=options.get("window"),
                         attn_mask=options.get("attn_mask"))


def _attention_blocking(head_dim: int, n: int, dtype, options) -> tuple[int, int]:
    """(keys per block, key blocks per row) of the default launch for this call's options (an edged
    tile may block the keys differently): what the error bound needs."""
    mask = options.get("attn_mask")
    edged = _edged_tile(bool(options.get("causal")), _normalize_window(options.get("window")),
                        mask is not None and mask.dtype == torch.bool)
    bn = _attn_config(head_dim, dtype, n=n, edged=edged).block_n
    return bn, max(1, math.ceil(n / bn))


register(AttentionSpec(
    name="attention",
    family="attention",
    fn=_attention,
    max_head_dim=_ATTN_MAX_D,
    # Launch knobs that change no arithmetic: rows per program (each row is computed by the same
    # instructions; on the GPU 16 rows per warp are kept) and the pipelining depth. block_n is
    # left out on purpose: it changes the online-softmax blocking, hence the rounding.
    configs=(({"block_m": 16},) if _INTERPRET else ({"num_stages": 2},)),
    # Within the bound, not bitwise: split-KV keeps the key blocking but adds one rescale per
    # split (the bound's n_blocks grows by num_splits; 7 splits is more than the CPU's metamorphic
    # cases have key blocks, 64 more than most GPU cases have). pack_gqa puts a group's heads in
    # one 16-row tile: on a GPU another tile shape (another MMA, another row-sum layout) may sum
    # in another order (an fp32 varlen case differed by 1 ulp from its dense decode-shaped call).
    tunings=(({"num_splits": 2}, {"num_splits": 7}, {"pack_gqa": True}) if _INTERPRET
             else ({"num_splits": 2}, {"num_splits": 3}, {"num_splits": 64}, {"pack_gqa": True})),
    varlen_fn=_attention_varlen,
    blocking=_attention_blocking,
    # its backward (kernels/attention_backward.py): autograd, three deterministic launches (no atomics)
    autograd=True,
    deterministic_backward=True,
    backward_blocking=_attention_backward_blocking,
    description="fused attention forward: online softmax in exp2, fp32 accumulators, P in 16 bits",
))


# ---- the training families (issue 52: kernels/softmax_backward.py, log_softmax.py, cross_entropy.py) -----
# Each dispatcher, and the forms it chooses only past the interpreter's row lengths (CPU-sized rows are
# all row-kernel rows): registered on their own, so their chunks, spans and merges run on drawn rows.
import functools as _functools  # noqa: E402

from .cross_entropy import BLOCK_V as _BLOCK_V, cross_entropy, cross_entropy_with_grad  # noqa: E402
from .cross_entropy_spec import CrossEntropySpec  # noqa: E402
from .log_softmax import (  # noqa: E402
    log_softmax, log_softmax_backward, log_softmax_backward_chunked, log_softmax_backward_depth,
    log_softmax_backward_split, log_softmax_depth, log_softmax_online,
)
from .row_spec import LogSoftmaxBackwardSpec, LogSoftmaxSpec, SoftmaxBackwardSpec  # noqa: E402
from .softmax_backward import backward_depth, softmax_backward, softmax_backward_chunked, softmax_backward_split  # noqa: E402

# The backwards: each family's dispatcher and its chunked and split forms, at each form's depth.
for _type, _family, _forms, _depth in (
        (SoftmaxBackwardSpec, "softmax_backward", (softmax_backward, softmax_backward_chunked, softmax_backward_split),
         backward_depth),
        (LogSoftmaxBackwardSpec, "log_softmax_backward",
         (log_softmax_backward, log_softmax_backward_chunked, log_softmax_backward_split), log_softmax_backward_depth)):
    for _fn, _variant in zip(_forms, (None, "chunked", "split")):
        register(_type(name=_fn.__name__, family=_family, fn=_fn, depth=_functools.partial(_depth, variant=_variant),
                       description=f"{_family.replace('_', ' ')}: {_variant or 'dispatcher (row / chunked / split)'}"))

register(LogSoftmaxSpec(name="log_softmax", family="log_softmax", fn=log_softmax, depth=log_softmax_depth,
                        description="log-softmax: dispatcher (row / online)"))
register(LogSoftmaxSpec(name="log_softmax_online", family="log_softmax", fn=log_softmax_online,
                        depth=_functools.partial(log_softmax_depth, variant="online"),
                        description="log-softmax: one program a row, an online (max, sum) over chunks"))


register(CrossEntropySpec(name="cross_entropy", family="cross_entropy", fn=cross_entropy,
                          with_grad=cross_entropy_with_grad, block_v=_BLOCK_V, arithmetic="fused",
                          description="fused cross-entropy: loss and gradient in one launch, autograd"))
if not _INTERPRET:
    # The same launch through its explicit entry point (no autograd: the gradient rounded once). The
    # interpreter's budget checks the autograd path only (the with_grad path runs there for kernels without autograd).
    register(CrossEntropySpec(name="cross_entropy_with_grad", family="cross_entropy",
                              fn=lambda logits, target, **kw: cross_entropy_with_grad(logits, target, **kw)[0],
                              with_grad=cross_entropy_with_grad, block_v=_BLOCK_V, arithmetic="fused",
                              description="fused cross-entropy through cross_entropy_with_grad"))
