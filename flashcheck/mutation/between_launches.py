"""Hand-written mutants of what a launch leaves for the next one: split-KV's arrival counters and
its per-stream workspace (kernels/attention_merge.py). No AST operator writes these: they live in
launcher code and in a store that has no arithmetic to perturb.

Only a GPU can kill them. Under the interpreter every launch runs alone, one program at a time,
on a fresh workspace (CPU tensors take no cached one), so nothing is ever shared between
launches or streams. On a GPU, flashcheck/suite/test_attention_gpu.py's
`test_split_kv_on_streams` and `test_split_kv_in_cuda_graphs` are where they die."""
from __future__ import annotations

from dataclasses import dataclass

OPERATOR = "between_launches"


@dataclass(frozen=True)
class HandMutant:
    """`old` (exactly once in kernels/<module>.py, whole lines) becomes `new`."""

    module: str
    function: str
    old: str
    new: str
    description: str
    specs: tuple[str, ...] = ("attention",)


HAND_MUTANTS: tuple[HandMutant, ...] = (
    HandMutant("attention_merge", "_arrive", "        tl.store(counter_ptr, 0)\n", "        pass\n",
               "the tile's last split leaves its arrival counter set: the stream's next launch miscounts"),
    HandMutant("attention_merge", "split_workspace",
               "    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index))",
               "    key = (device.index, 0)",
               "one workspace for every stream of a device: launches side by side share counters and states"),
    HandMutant("attention_merge", "split_workspace",
               '    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():',
               '    if device.type != "cuda":',
               "a CUDA graph's capture takes its stream's cached workspace, which the graph's replays then "
               "share with eager calls on that stream"),
)
