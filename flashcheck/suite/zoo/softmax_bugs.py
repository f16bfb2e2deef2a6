"""Known-bad softmax kernels: each reproduces one real bug class of NUMERICS.md section 5.

Each entry is a kernel template of softmax_templates.py (row, online, split-row, chunked, out=
view) with its `BUG` constexpr switching exactly one defect on; BUG = 0 is the "fixed twin".

Every public attribute below is a plain `fn(x)` (with a `flashcheck` dict when it declares launch
configurations) that validates its input like a production kernel, so the suite catches the bug,
not a missing TypeError. Run one with
`pytest --kernel flashcheck/suite/zoo/softmax_bugs.py:NAME --family softmax -x`.

Three entries are GPU-only (`ZooKernel.gpu_only` gives the reason; tests/test_zoo.py skips them
under the interpreter and the CPU kill matrix leaves them out): int32 offset overflow (xformers
#719; it needs M * N > 2^31 elements, 4 GiB in fp16, out of the interpreter's reach), an
unguarded fast exp (the hardware's `ex2.approx.f16`, inline PTX the interpreter cannot run) and
a race between the programs of a one-launch split softmax (the interpreter runs them in order).
`exp_clamp_nan` depends on the GPU's NaN-ignoring `tl.maximum`, which the interpreter follows
(flashcheck.interpreter.gpu), so the CPU catches it.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np
import torch

from flashcheck.kernels import DEVICE
from flashcheck.suite.zoo.kernel import ZooKernel
from flashcheck.suite.zoo.softmax_templates import (
    EXP_CLAMP, EXP_CLAMP_NAN, FAST_EXP, FP16_SUM, INT32_OFFSETS, LAST_SPAN_MERGES, MERGE_NAN, NAN_SWALLOW, NO_MAX,
    NO_RESCALE, NONE, READ_PAST, RESCALE_NAN, ROUND_EXP, SENTINEL, STICKY, STRIDES, TAIL, WRITE_PAST, ZERO_PAD,
    _chunked, _online, _out_view, _row, _split,
)

# --------------------------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------------------------

def online_rescale_nan(x: torch.Tensor) -> torch.Tensor:
    """exp(-inf - -inf) = NaN in the online rescale: a row whose first chunk (256) is all -inf
    makes the running max -inf - -inf. FlashInfer #4267/#4451 and PR #1178; FlashAttention #1930;
    PyTorch #127055; vLLM PR #4405."""
    return _online(x, RESCALE_NAN)


def sticky_max_zero(x: torch.Tensor) -> torch.Tensor:
    """A guard that swaps a -inf running max for 0 and keeps it: after a fully masked leading
    chunk, logits all below -90 are exponentiated against 0 and underflow (0 / 0 = NaN or lost
    precision). FlashAttention #2082."""
    return _online(x, STICKY)


def finite_sentinel(x: torch.Tensor) -> torch.Tensor:
    """A finite sentinel (-5e4) for -inf, in the padding lanes and for -inf inputs: rows whose
    logits all lie below it are dominated by the padding; fully masked rows come out uniform.
    FlashInfer #4267 (-5e4), HabanaAI vllm-fork #275."""
    return _row(x, SENTINEL)


def no_max_subtraction(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum exp(x) without subtracting the max: [1000, 1001] overflows to inf / inf, very
    negative rows underflow to 0 / 0. tt-metal #12661, vLLM #56578."""
    return _row(x, NO_MAX)


def zero_padding(x: torch.Tensor) -> torch.Tensor:
    """Padding lanes (N up to the power-of-two block) read as 0 instead of -inf: each adds
    exp(0 - max) to the sum, and becomes the max of an all-negative row. verl PR #5349,
    PyTorch #196678."""
    return _row(x, ZERO_PAD)


def tail_dropped(x: torch.Tensor) -> torch.Tensor:
    """Only the full 512-wide tiles are processed: the last N mod 512 columns are neither summed
    nor written (rows shorter than 512 not at all). JAX #27224; the CuTe row kernel that splits
    N by 512."""
    return _online(x, TAIL, block=512)


def strides_ignored(x: torch.Tensor) -> torch.Tensor:
    """Offsets computed as row * N + col: right for contiguous inputs only; transposed, sliced,
    padded or offset views read the wrong elements (here: the NaN guard data around the view).
    FlagGems PR #5723, MLX PR #658, burn #4815."""
    return _row(x, STRIDES)


def nan_swallowed(x: torch.Tensor) -> torch.Tensor:
    """NaN dropped instead of propagated: a maxnum-style max (tl.maximum ignores NaN on the GPU)
    plus a where that masks NaN out as if it were -inf. intel torch-xpu-ops PR #5022."""
    return _row(x, NAN_SWALLOW)


def fp16_denominator(x: torch.Tensor) -> torch.Tensor:
    """The running denominator is kept in fp16 (rounded after every 256-chunk): 2^-11 relative
    per step, stalling for long uniform rows. ik_llama.cpp PR #1196, tinygrad PR #4985."""
    return _online(x, FP16_SUM)


def exp_rounded_16bit(x: torch.Tensor) -> torch.Tensor:
    """Each exponential rounded to the 16-bit input format (fp16, bf16) before it is summed and
    divided: `p = tl.exp(x - m).to(x.dtype)`, the attention kernels' P in 16 bits carried over to a
    softmax, whose contract is 1 ULP. Every term is off by up to half a 16-bit ULP; rounded the same
    way over a long row of near-equal logits they shift the sum by a relative 2^-11 (fp16) and the
    quotient by about 1.5 ULP. fp32 inputs are unaffected. ik_llama.cpp PR #1196 (16-bit softmax
    terms), the FP16-P shortcut of flash kernels (NUMERICS.md section 3: legal for attention only)."""
    return _row(x, ROUND_EXP)


def missing_rescale(x: torch.Tensor) -> torch.Tensor:
    """The accumulated sum is not rescaled by exp(m_old - m_new) when a later chunk raises the
    max: rows increasing across chunk boundaries get a denominator that is far too large.
    ROCm CK_TILE PR #6498."""
    return _online(x, NO_RESCALE)


def int32_offsets(x: torch.Tensor) -> torch.Tensor:
    """Row offsets that wrap at 2^31 elements, as 32-bit offset arithmetic does: past 2^31
    elements rows are read from and written to the wrong place. xformers #719 (M * N > 2^31).
    Modelled as offset mod 2^31 so the wrapped access stays in bounds (a wrong answer the oracle
    sees rather than an illegal-address fault). GPU only: the trigger is a 4 GiB fp16 tensor."""
    return _row(x, INT32_OFFSETS)


def fast_exp_unguarded(x: torch.Tensor) -> torch.Tensor:
    """exp through the hardware's half-precision `ex2.approx.f16` with no guard on dtype or range:
    the argument is rounded to fp16 (relative error |t| 2^-11 in the result) and results below
    2^-24 flush to 0, for fp32 data too. A fast-math shortcut, not a reproduced upstream report.
    GPU only: the interpreter computes exp2 exactly in NumPy and cannot run inline PTX."""
    return _row(x, FAST_EXP)


def split_merge_nan(x: torch.Tensor) -> torch.Tensor:
    """Split-row merge of per-span (max, sum) pairs without the empty-state guard: merging an
    all -inf span (-inf, 0) into the initial (-inf, 0) computes exp(-inf - -inf) = NaN.
    FlashInfer #4051 (merge of two empty states)."""
    return _split(x, MERGE_NAN)


def split_merge_race(x: torch.Tensor) -> torch.Tensor:
    """A one-launch split-row softmax that leaves the merge of a row's partial (max, sum) pairs to
    the program of its last span, without waiting for the others, as if programs ran in launch
    order: on a GPU they run concurrently, and the last span (often a short tail) is done first and
    merges partials not yet stored (stale workspace). The fixed twin counts finished spans with an
    acq_rel atomic ticket and lets the last finisher merge (the "last block reduces" pattern: CUDA's
    threadFenceReduction sample; Triton split-K semaphores). GPU only: the interpreter runs the
    programs one after another in launch order, exactly the assumption the bug makes."""
    return _split(x, LAST_SPAN_MERGES, one_launch=True)


def exp_clamp_nan(x: torch.Tensor) -> torch.Tensor:
    """The exponent clamped to keep exp2 in range, `tl.maximum((x - m) * log2e, -200)`: on a GPU
    tl.maximum ignores NaN (PTX max.f32, maxnum) and a NaN logit becomes exp2(-200) = 0, so its row
    comes out finite instead of NaN. Triton's interpreter propagated NaN (np.maximum) and could not
    see it; flashcheck.interpreter.gpu makes it follow the GPU. intel torch-xpu-ops PR #5022 (tl.maximum
    does not propagate NaN by default); the fix: propagate_nan=tl.PropagateNan.ALL (the fixed twin)."""
    return _row(x, EXP_CLAMP)


def config_dependent_bits(x: torch.Tensor, *, block_n: int = 256) -> torch.Tensor:
    """The sum's rounding depends on the launch configuration (block_n): every configuration is
    within the error bound, but the same input gives different bits under different launch
    parameters (batch- and tile-dependent reductions: the 'batch invariance' failures of LLM
    inference, Thinking Machines, 'Defeating Nondeterminism in LLM Inference', 2025; split-K
    reductions whose result depends on the tile). Only the configurations property sees it."""
    return _chunked(x, block_n)


config_dependent_bits.flashcheck = {"configs": ({"block_n": 512}, {"block_n": 1024})}


def out_strides_ignored(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`out=` accepted but written as if contiguous: a strided output view gets its rows in the
    wrong places, over the bytes around it. The output-side twin of the strides class (FlagGems
    PR #5723, MLX PR #658: kernels that assume contiguous tensors). Only the guard-band property,
    which passes an `out=` view inside a sentinel buffer, sees it."""
    return _out_view(x, out, bug=True)


def read_past_row(x: torch.Tensor) -> torch.Tensor:
    """The load mask off by one (`cols <= N`): every row reads one element past its end, the next
    row's first element (the last row: past the tensor), into its max and sum. Triton #10336 (a masked
    load whose length exceeds the view reads past it silently), triton #4577 (illegal memory access
    in a user softmax kernel). Caught on the CPU by the interpreter's bounds check (flashcheck.interpreter.bounds),
    on a GPU by the oracle (wrong sums) or an illegal-address fault."""
    return _row(x, READ_PAST)


def write_past_row(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The store mask off by one (`cols <= N`): every row writes a 0 one element past its end, over
    the next row's first element (a race on a GPU) and, for the last row, past the output. Caught on
    the CPU by the interpreter's bounds check, on a GPU by the guard-band property (the write lands
    in the sentinel bytes around an out= view) or an illegal-address fault. The store-side twin of
    read_past_row (triton #4577: illegal memory access in a user softmax kernel)."""
    return _out_view(x, out, bug=False, kernel_bug=WRITE_PAST)


# ---- fixed twins and triggers (tests/test_zoo.py) -------------------------------------------------

def _fixed_config(x: torch.Tensor, *, block_n: int = 256) -> torch.Tensor:
    return _chunked(x, 256)


def _fixed_out(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return _out_view(x, out, bug=False)


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64)).to(dtype).to(DEVICE)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _lead_masked(n: int, block: int, low: bool) -> dict:
    v = _rng().standard_normal((2, n))
    if low:
        v = -100.0 - 20.0 * _rng(1).random((2, n))
    v[:, :block] = -np.inf
    return {"x": _t(v)}


def _past_2_31_trigger() -> dict:
    """(2^21 + 2, 1024) fp16: 2^31 + 2048 elements; `rows`: the rows to compare (the oracle of the
    whole tensor is out of reach), on both sides of the 2^31-element boundary."""
    m, n = (1 << 21) + 2, 1024
    x = torch.randn(m, n, generator=torch.Generator(device=DEVICE).manual_seed(0), device=DEVICE,
                    dtype=torch.float16)
    return {"x": x, "rows": [0, (1 << 21) - 1, 1 << 21, m - 1]}


def _halfway_trigger() -> dict:
    """fp16 rows of 2000: a max of 0, a background whose exponential rounds down by nearly half an
    fp16 ULP, 32 probes whose exponentials round up as much (strategies.softmax._halfway_row)."""
    from flashcheck.oracles.formats import FP16
    from flashcheck.strategies.softmax import _halfway_row

    rng = _rng()
    return {"x": _t(np.stack([_halfway_row(2000, rng, FP16) for _ in range(4)]), torch.float16)}


def _guarded_out_trigger() -> dict:
    x = _t(_rng().standard_normal((3, 300)))
    buf = torch.full((3 * 310 + 5,), 7.0, device=DEVICE)
    return {"x": x, "out": buf[5:].as_strided((3, 300), (310, 1))}


_TRIGGERS = {
    "online_rescale_nan": lambda: _lead_masked(600, 256, low=False),
    "sticky_max_zero": lambda: _lead_masked(600, 256, low=True),
    "finite_sentinel": lambda: {"x": _t(-1.0e5 - 1.0e4 * _rng().random((2, 300)))},
    "no_max_subtraction": lambda: {"x": _t([[1000.0, 1001.0]])},
    "zero_padding": lambda: {"x": _t(_rng().standard_normal((2, 300)))},
    "tail_dropped": lambda: {"x": _t(_rng().standard_normal((2, 1000)))},
    "strides_ignored": lambda: {"x": _t(_rng().standard_normal((64, 32))).t()},
    "nan_swallowed": lambda: {"x": _t([[1.0, np.nan, 2.0]])},
    "fp16_denominator": lambda: {"x": _t(_rng().standard_normal((2, 1000)))},
    "missing_rescale": lambda: {"x": _t(np.cumsum(0.1 * _rng().random((2, 600)), axis=1))},
    "exp_rounded_16bit": _halfway_trigger,
    "split_merge_nan": lambda: _lead_masked(600, 256, low=False),
    "int32_offsets": _past_2_31_trigger,
    "fast_exp_unguarded": lambda: {"x": _t(np.linspace(-30.0, 0.0, 300)[None, :].repeat(2, 0))},
    "config_dependent_bits": lambda: {"x": _t(_rng().standard_normal((4, 1500)))},
    # many rows of 16 spans, the last a short tail: on a GPU some row merges early with near certainty
    "split_merge_race": lambda: {"x": _t(_rng().standard_normal((256, 3900)))},
    "exp_clamp_nan": lambda: {"x": _t([[1.0, np.nan, 2.0], [0.5, -1.0, 3.0]])},
    "out_strides_ignored": _guarded_out_trigger,
    "read_past_row": lambda: {"x": _t(_rng().standard_normal((3, 300)))},
    "write_past_row": _guarded_out_trigger,
}

_CLASSES = {
    "online_rescale_nan": ("exp(-inf - -inf) = NaN in the online rescale", "matches_oracle"),
    "sticky_max_zero": ("guard that swaps a -inf max for 0 (sticky max)", "matches_oracle"),
    "finite_sentinel": ("finite sentinel for -inf", "matches_oracle"),
    "no_max_subtraction": ("no max subtraction / overflow", "matches_oracle"),
    "zero_padding": ("padding filled with 0 instead of -inf", "matches_oracle"),
    "tail_dropped": ("tail dropped when N is not a multiple of the tile", "matches_oracle"),
    "strides_ignored": ("strides ignored", "matches_oracle"),
    "nan_swallowed": ("NaN swallowed by the max", "matches_oracle"),
    "fp16_denominator": ("fp16 accumulation of the denominator", "matches_oracle"),
    "missing_rescale": ("missing rescale of the accumulator when the max grows", "matches_oracle"),
    "exp_rounded_16bit": ("exponentials rounded to 16 bits before the sum (FP16-P in a softmax)",
                          "matches_oracle (long_uniform/halfway)"),
    "split_merge_nan": ("exp(-inf - -inf) = NaN in a merge of two empty states (split-row)", "matches_oracle"),
    "int32_offsets": ("int32 offset overflow (M * N > 2^31)", "test_softmax_gpu past 2^31 elements"),
    "fast_exp_unguarded": ("unguarded fast exp (ex2.approx.f16)", "matches_oracle"),
    "config_dependent_bits": ("launch configurations give different bits", "configs_identical"),
    "split_merge_race": ("race in a split-row merge (reads other programs' partials without waiting)",
                         "matches_oracle / configs_and_determinism (GPU)"),
    "exp_clamp_nan": ("NaN swallowed by tl.maximum (maxnum) in an exponent clamp", "special_values"),
    "out_strides_ignored": ("output strides ignored (writes outside the out= view)", "guard_bands"),
    "read_past_row": ("out-of-bounds read (load mask off by one)", "interpreter bounds check / matches_oracle"),
    "write_past_row": ("out-of-bounds write (store mask off by one)", "interpreter bounds check / guard_bands"),
}

_FIXED = {
    "online_rescale_nan": functools.partial(_online, bug=NONE),
    "sticky_max_zero": functools.partial(_online, bug=NONE),
    "finite_sentinel": functools.partial(_row, bug=NONE),
    "no_max_subtraction": functools.partial(_row, bug=NONE),
    "zero_padding": functools.partial(_row, bug=NONE),
    "tail_dropped": functools.partial(_online, bug=NONE, block=512),
    "strides_ignored": functools.partial(_row, bug=NONE),
    "nan_swallowed": functools.partial(_row, bug=NONE),
    "fp16_denominator": functools.partial(_online, bug=NONE),
    "missing_rescale": functools.partial(_online, bug=NONE),
    "exp_rounded_16bit": functools.partial(_row, bug=NONE),
    "split_merge_nan": functools.partial(_split, bug=NONE),
    "int32_offsets": functools.partial(_row, bug=NONE),
    "fast_exp_unguarded": functools.partial(_row, bug=NONE),
    "config_dependent_bits": _fixed_config,
    "split_merge_race": functools.partial(_split, bug=NONE, one_launch=True),
    "exp_clamp_nan": functools.partial(_row, bug=EXP_CLAMP_NAN),
    "out_strides_ignored": _fixed_out,
    "read_past_row": functools.partial(_row, bug=NONE),
    "write_past_row": _fixed_out,
}

_GPU_ONLY = {
    "int32_offsets": "needs a tensor of more than 2^31 elements (4 GiB fp16): out of the interpreter's reach",
    "fast_exp_unguarded": "inline PTX (ex2.approx.f16): the interpreter cannot run it and computes exp2 exactly",
    "split_merge_race": "a race between programs: the interpreter runs them one after another in launch order, "
                        "so the last span's program always finds the other partials stored",
}
# The GPU-only entries' catching tests, where one was written for them (the rest run the suite).
_GPU_TARGETS = {
    "int32_offsets": ("flashcheck/suite/test_softmax_gpu.py::test_past_2_31_elements",),
}

ZOO: dict[str, ZooKernel] = {}
for _name, (_cls, _hint) in _CLASSES.items():
    _fn = globals()[_name]
    ZOO[_name] = ZooKernel(
        name=_name, family="softmax", bug_class=_cls,
        references=" ".join(inspect.getdoc(_fn).split()),
        broken=_fn, fixed=_FIXED[_name], trigger=_TRIGGERS[_name],
        caps=dict(getattr(_fn, "flashcheck", {})), property_hint=_hint, gpu_only=_GPU_ONLY.get(_name, ""),
        targets=_GPU_TARGETS.get(_name, ()),
    )

__all__ = list(ZOO)
