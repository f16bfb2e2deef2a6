"""Known-bad cross-entropy, softmax-backward and log-softmax kernels: each reproduces one real bug class
(docs/NUMERICS.md section 9.7; /work/shared/REAL_BUGS.md "Cross-entropy and softmax backward").

Each entry is a template of training_templates.py with its `BUG` constexpr switching exactly one defect
on; BUG = 0 is the fixed twin. Cross-entropy entries take every option as a keyword and have no
autograd: their gradient is the declared `with_grad` (their `flashcheck` dict), so the suite reaches it
as an author's kernel's. Run one with
`pytest --kernel flashcheck/suite/zoo/training_bugs.py:NAME --family cross_entropy -x`.

Each trigger is a Case; `property_hint` lists the properties that must fail on it (the broken kernel)
and pass on the fixed twin (tests/test_zoo.py): together the entries witness every property of the
four families, so none of them is vacuous.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from flashcheck.kernels import DEVICE
from flashcheck.oracles.formats import format_of
from flashcheck.oracles.log_softmax import log_softmax_oracle
from flashcheck.oracles.softmax import softmax_oracle
from flashcheck.strategies.case import Case
from flashcheck.strategies.floats import Layout, materialize
from flashcheck.strategies.cross_entropy import labels
from flashcheck.suite.zoo.kernel import ZooKernel
from flashcheck.suite.zoo import training_templates as T

IGNORE = -100


# ---- cross-entropy ---------------------------------------------------------------------------------

def _ce(bug: int, name: str, doc: str) -> Callable[..., torch.Tensor]:
    def fn(logits, target, *, ignore_index=IGNORE, label_smoothing=0.0, reduction="mean", weight=None, z_loss=0.0,
           softcap=None, inplace_backward=False):
        return T.ce_launch(logits, target, bug, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction, weight=weight, z_loss=z_loss, softcap=softcap,
                           inplace_backward=inplace_backward)[0]

    def with_grad(logits, target, grad_output=None, **options):
        return T.ce_launch(logits, target, bug, grad_output=grad_output, want_grad=True, **options)

    fn.__name__ = fn.__qualname__ = name
    with_grad.__name__ = with_grad.__qualname__ = f"{name}_with_grad"
    fn.__doc__ = doc
    fn.flashcheck = {"with_grad": with_grad}  # type: ignore[attr-defined]
    return fn


cross_entropy_fixed = _ce(T.CE_NONE, "cross_entropy_fixed", "The fixed twin of every cross-entropy entry.")
ce_bf16_true_class = _ce(T.BF16_TRUE_CLASS, "ce_bf16_true_class", """The true class's p written through the
16-bit logits buffer before 1 is subtracted: at softmax 0.999 in bf16, p rounds to 1 and the gradient
to 0 (100% off); random logits never show it. Liger PR #1329 (REAL_BUGS CE 1).""")
ce_grad_output_0 = _ce(T.GRAD_OUTPUT_0, "ce_grad_output_0", """reduction='none' with a per-row grad_output:
every row's gradient scaled by grad_output[0]. Liger PR #1298, #968, #678 (REAL_BUGS CE 2).""")
ce_offsets_wrap = _ce(T.WRAP_OFFSETS, "ce_offsets_wrap", """Row offsets in int32: past 2^31 elements they
wrap and another row (or padding) is read. Here wrapped at FAKE_INT32_LIMIT elements so the CPU's inputs
reach it. Liger PR #47, flash-attention c79de85f, unsloth eaff11e, pytorch #85786 (REAL_BUGS CE 4).""")
ce_all_ignored_zero = _ce(T.ALL_IGNORED_ZERO, "ce_all_ignored_zero", """'mean' over rows that are all ignored
returns 0 (a clamped denominator), not NaN: torch's 0/0 by design (pytorch #116349, REAL_BUGS CE 6).""")
ce_ignored_grad = _ce(T.IGNORED_GRAD, "ce_ignored_grad", """An ignored row's loss is 0 but its gradient is
left as computed (p, or NaN from its garbage): the varlen tests that overwrite padded gradients with 0
before comparing never see it (REAL_BUGS: FlashAttention 3/4; torch's CPU backward, NUMERICS 9.2).""")
ce_smoothing_inf_nan = _ce(T.SMOOTH_MASK_MUL, "ce_smoothing_inf_nan", """Label smoothing over a masked vocabulary:
-inf logits dropped from the smoothing sum by a 0/1 factor, inf * 0 = NaN where the loss is +inf
(NUMERICS 9.2; the masking-by-multiply class of the softmax zoo; ml-cross-entropy PR #59's padded columns).""")
ce_softcap_chain = _ce(T.SOFTCAP_CHAIN, "ce_softcap_chain", """A logit softcap whose backward omits the chain
factor 1 - tanh^2(x / c): the gradient with respect to the capped logits returned for the raw ones
(tokamax PR #1121, flash-attention PR #2402: REAL_BUGS attention 9).""")
ce_zloss_grad = _ce(T.ZLOSS_GRAD, "ce_zloss_grad", """The z-loss z lse^2 in the loss, its gradient term
2 z lse p_j missing: rows sum to 0 instead of 2 z lse (PaLM's z-loss, flash-attn's lse_square_scale).""")
ce_mean_by_count = _ce(T.MEAN_BY_COUNT, "ce_mean_by_count", """Class weights applied to each row but the
'mean' divided by the count of counted rows, not the sum of their weights (torch's weighted mean;
REAL_BUGS CE 6).""")
ce_target_stride = _ce(T.TARGET_STRIDE, "ce_target_stride", """Labels read as if contiguous: a strided or
offset label view gives each row another row's target, or the buffer's padding (flash-attention bedf8774,
Torch-FL PR #172: REAL_BUGS CE 9, 11).""")
ce_lse_low_precision = _ce(T.LSE_LOW_PRECISION, "ce_lse_low_precision", """The row's lse kept in a bf16 buffer
(for the backward) and the loss formed from it: a confident row's loss goes negative and depends on a
shift of the logits (TransformerEngine PR #3193, Liger #512: REAL_BUGS CE 3, 7).""")
ce_grad_into_logits = _ce(T.GRAD_INTO_LOGITS, "ce_grad_into_logits", """The gradient written into the logits'
buffer although inplace_backward was not asked (Liger's and flash-attn's in-place design as a default:
the caller's logits are gone; REAL_BUGS CE 1).""")
ce_inplace_strides = _ce(T.INPLACE_STRIDES, "ce_inplace_strides", """inplace_backward writes the gradient as
if the logits were contiguous: a padded or transposed logits view gets the wrong elements, and its padding
is overwritten (Torch-FL PR #172: REAL_BUGS CE 11).""")


def _ce_case(values, targets, *, dtype=torch.float32, layout: Layout = Layout(), label_step: int = 1,
             reduction: str = "mean", weight=None, grad_output=None, shift: float | None = None,
             **options) -> Case:
    fmt = format_of(dtype)
    tensors = {"logits": materialize(np.asarray(values, dtype=np.float64), fmt, layout, DEVICE),
               "target": labels(targets, guard=options.get("ignore_index", IGNORE), step=label_step)}
    if weight is not None:
        tensors["weight"] = torch.tensor(weight, dtype=dtype, device=DEVICE)
    if grad_output is not None:
        tensors["grad_output"] = torch.tensor(grad_output, dtype=dtype, device=DEVICE)
    if shift is not None:
        tensors["shift"] = torch.tensor(shift, dtype=torch.float64)
    kwargs = {"ignore_index": IGNORE, "label_smoothing": 0.0, "reduction": reduction, **options}
    return Case(tensors=tensors, kwargs=kwargs, label="trigger")


def _normal(m: int, n: int, seed: int, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
    return loc + scale * np.random.default_rng(seed).standard_normal((m, n))


CE_ENTRIES = [
    (ce_bf16_true_class, "true-class gradient through the 16-bit logits (p - 1 as bf16(p) - 1)",
     "Liger PR #1329", "grad_matches_oracle",
     lambda: _ce_case([[8.875] + [0.0] * 7, [0.0] * 3 + [8.875] + [0.0] * 4], [0, 3], dtype=torch.bfloat16,
                      reduction="sum")),
    (ce_grad_output_0, "reduction='none' scaled by grad_output[0]", "Liger PR #1298, #968, #678",
     "grad_matches_oracle",
     lambda: _ce_case(_normal(3, 5, 1), [0, 2, 4], reduction="none", grad_output=[1.0, 3.0, -2.0])),
    (ce_offsets_wrap, "int32 row offsets wrapping (a small stand-in limit on the CPU)",
     "Liger PR #47; flash-attention c79de85f; unsloth eaff11e; pytorch #85786", "nan_guard_invisible, loss_matches_oracle",
     lambda: _ce_case(_normal(4, 100, 2), [1, 5, 50, 99], layout=Layout(row_pad=64), reduction="none")),
    (ce_all_ignored_zero, "'mean' of all-ignored rows 0, not NaN", "pytorch #116349",
     "mean_is_sum_over_weights, loss_matches_oracle",
     lambda: _ce_case(_normal(2, 4, 3), [IGNORE, IGNORE])),
    (ce_ignored_grad, "ignored rows' gradient not zeroed", "FlashAttention 3/4 varlen tests (masked_fill_ before comparing)",
     "grad_matches_oracle",
     lambda: _ce_case(_normal(3, 4, 4), [1, IGNORE, 2], reduction="sum")),
    (ce_smoothing_inf_nan, "label smoothing with -inf logits: NaN (a 0/1 mask multiplied in)",
     "NUMERICS 9.2; ml-cross-entropy PR #59", "loss_matches_oracle",
     lambda: _ce_case([[0.0, -np.inf, 1.0, 2.0], [0.5, 1.0, 2.0, 3.0]], [2, 0], reduction="none",
                      label_smoothing=0.1)),
    (ce_softcap_chain, "softcap backward without the 1 - tanh^2 chain factor", "tokamax PR #1121; flash-attention PR #2402",
     "grad_matches_oracle",
     lambda: _ce_case([[40.0, -35.0, 10.0, 0.0, 25.0, -50.0], [5.0, 60.0, -5.0, 30.0, 1.0, 2.0]], [1, 3],
                      softcap=30.0)),
    (ce_zloss_grad, "z-loss gradient missing its 2 z lse p term", "PaLM z-loss; flash-attn lse_square_scale",
     "grad_rows_sum, grad_matches_oracle",
     lambda: _ce_case(_normal(2, 5, 5, loc=100.0), [1, 4], z_loss=1e-3, reduction="sum")),
    (ce_mean_by_count, "weights ignored in the mean's denominator", "torch weighted mean; REAL_BUGS CE 6",
     "mean_is_sum_over_weights, loss_matches_oracle",
     lambda: _ce_case(_normal(3, 4, 6), [0, 3, 1], weight=[2.0, 0.5, 1.0, 4.0])),
    (ce_target_stride, "target read with the wrong stride", "flash-attention bedf8774; Torch-FL PR #172",
     "matches_log_softmax, loss_matches_oracle",
     lambda: _ce_case(_normal(3, 5, 7), [1, 3, 4], label_step=2, reduction="none")),
    (ce_lse_low_precision, "lse kept in bf16: negative and shift-dependent losses", "TransformerEngine PR #3193; Liger #512",
     "loss_nonnegative, shift_invariant",
     lambda: _ce_case([[8.890625] + [0.0] * 7], [0], reduction="none", shift=64.0)),
    (ce_grad_into_logits, "gradient written into the logits without inplace_backward", "Liger, flash-attn in-place design",
     "input_untouched",
     lambda: _ce_case(_normal(2, 6, 8), [0, 5])),
    (ce_inplace_strides, "inplace_backward ignoring the logits' strides", "Torch-FL PR #172",
     "inplace_backward",
     lambda: _ce_case(_normal(3, 5, 9), [0, 2, 4], layout=Layout(row_pad=3))),
]


# ---- softmax backward, log-softmax backward, log-softmax ------------------------------------------

def _row_case(names: tuple[str, ...], arrays: list[np.ndarray], layouts: list[Layout], dtype=torch.float32,
              shift: float | None = None) -> Case:
    fmt = format_of(dtype)
    tensors = {n: materialize(a, fmt, lay, DEVICE) for n, a, lay in zip(names, arrays, layouts)}
    if shift is not None:
        tensors["shift"] = torch.tensor(shift, dtype=torch.float64)
    return Case(tensors=tensors, label="trigger")


def _bwd_case(log: bool, dy: np.ndarray, *, dtype=torch.float32, layouts=(Layout(), Layout()), seed: int = 0,
              x: np.ndarray | None = None) -> Case:
    x = _normal(*dy.shape, seed) if x is None else x
    fwd = log_softmax_oracle(x, format_of(dtype)) if log else softmax_oracle(x, format_of(dtype))
    return _row_case(("logp", "dy") if log else ("y", "dy"), [fwd, dy], list(layouts), dtype)


def _bwd(log: bool, bug: int, name: str, doc: str) -> Callable[..., torch.Tensor]:
    def fn(a: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        return T.bwd_launch(a, dy, log=log, bug=bug)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


softmax_backward_fixed = _bwd(False, T.SB_NONE, "softmax_backward_fixed", "The fixed twin of the softmax-backward entries.")
sb_log_formula = _bwd(False, T.LOG_FORMULA, "sb_log_formula",
                      "Softmax backward with log-softmax's sum: y (dy - sum dy), not y (dy - sum y dy).")
sb_dy_strides = _bwd(False, T.DY_STRIDES, "sb_dy_strides",
                     "dy read with y's strides: two layouts taken for one (Torch-FL PR #172, REAL_BUGS CE 11).")
sb_dx_into_dy = _bwd(False, T.DX_INTO_DY, "sb_dx_into_dy", """dx computed in place into dy's storage (Megatron/Apex
fused softmax backward): the caller's gradient is gone.""")
log_softmax_backward_fixed = _bwd(True, T.SB_NONE, "log_softmax_backward_fixed",
                                  "The fixed twin of the log-softmax backward entries.")
lsb_contiguous_rows = _bwd(True, T.CONTIGUOUS_ROWS, "lsb_contiguous_rows",
                           "Log-softmax backward reading its inputs as if contiguous (REAL_BUGS CE 11).")
lsb_dx_into_dy = _bwd(True, T.DX_INTO_DY, "lsb_dx_into_dy", "dx computed in place into dy's storage.")
lsb_sum_16bit = _bwd(True, T.SUM_16BIT, "lsb_sum_16bit", """The row's sum of dy kept in the inputs' 16-bit dtype
(REAL_BUGS CE 3 and 7: intermediates in low precision; the Triton tutorial's fp16 dS).""")


def log_softmax_fixed(x: torch.Tensor) -> torch.Tensor:
    """The fixed twin of the log-softmax entries."""
    return T.log_softmax_launch(x, bug=T.LS_NONE)


def ls_log_of_softmax(x: torch.Tensor) -> torch.Tensor:
    """log(softmax(x)): exp(x - m) underflows to 0 below -103 and log 0 = -inf, where the log-softmax is
    a finite x - lse."""
    return T.log_softmax_launch(x, bug=T.LOG_OF_SOFTMAX)


def ls_no_max(x: torch.Tensor) -> torch.Tensor:
    """x - log sum exp(x) without the max: -inf at x = 88.72 (hb-pytorch #61, found by Hypothesis)."""
    return T.log_softmax_launch(x, bug=T.NO_MAX)


def ls_row_stride_ignored(x: torch.Tensor) -> torch.Tensor:
    """Rows taken N elements apart whatever the row stride: NaN from the padding (vllm #42684)."""
    return T.log_softmax_launch(x, bug=T.ROW_STRIDE_IGNORED)


def ls_into_input(x: torch.Tensor) -> torch.Tensor:
    """The log-probabilities written over the logits (a fused LM head saving memory): the input is gone."""
    return T.log_softmax_launch(x, bug=T.INTO_INPUT)


ROW_ENTRIES = [
    (sb_log_formula, softmax_backward_fixed, "softmax_backward", "softmax backward with log-softmax's dy - sum(dy)",
     "issue 52", "matches_oracle, rows_sum", lambda: _bwd_case(False, _normal(2, 6, 10))),
    (sb_dy_strides, softmax_backward_fixed, "softmax_backward", "dy read with y's strides", "Torch-FL PR #172",
     "nan_guard_invisible, matches_oracle",
     lambda: _bwd_case(False, _normal(3, 6, 11), layouts=(Layout(), Layout(row_pad=5)))),
    (sb_dx_into_dy, softmax_backward_fixed, "softmax_backward", "dx written into dy", "Megatron/Apex fused softmax",
     "input_untouched", lambda: _bwd_case(False, _normal(2, 6, 12))),
    (lsb_contiguous_rows, log_softmax_backward_fixed, "log_softmax_backward", "inputs read as if contiguous",
     "Torch-FL PR #172; vllm #42684", "nan_guard_invisible, matches_oracle",
     lambda: _bwd_case(True, _normal(3, 6, 13), layouts=(Layout(row_pad=5), Layout()))),
    (lsb_dx_into_dy, log_softmax_backward_fixed, "log_softmax_backward", "dx written into dy", "in-place backward",
     "input_untouched", lambda: _bwd_case(True, _normal(2, 6, 14))),
    (lsb_sum_16bit, log_softmax_backward_fixed, "log_softmax_backward", "sum of dy kept in 16 bits",
     "TransformerEngine PR #3193; Triton tutorial 06", "rows_sum, matches_oracle",
     # uniform rows and a constant dy: dx = c (1 - 6 p) cancels to ~0; the sum 6c = 5997 rounds to 5996 in fp16
     lambda: _bwd_case(True, np.full((2, 6), 999.5), dtype=torch.float16, x=np.zeros((2, 6)))),
    (ls_log_of_softmax, log_softmax_fixed, "log_softmax", "log(softmax) underflowing to -inf", "issue 52",
     "matches_oracle", lambda: _row_case(("x",), [np.array([[0.0, -200.0, 1.0], [1.0, 2.0, 3.0]])], [Layout()])),
    (ls_no_max, log_softmax_fixed, "log_softmax", "no max subtraction: exp overflows at 88.72", "hb-pytorch #61",
     "shift_invariant", lambda: _row_case(("x",), [np.array([[0.0, 1.0, 2.0, 0.5]])], [Layout()], shift=100.0)),
    (ls_row_stride_ignored, log_softmax_fixed, "log_softmax", "row stride ignored", "vllm #42684",
     "nan_guard_invisible, matches_oracle",
     lambda: _row_case(("x",), [_normal(3, 5, 15)], [Layout(row_pad=4)])),
    (ls_into_input, log_softmax_fixed, "log_softmax", "log-probabilities written over the logits",
     "fused LM heads in place", "input_untouched", lambda: _row_case(("x",), [_normal(2, 5, 16)], [Layout()])),
]

ZOO: dict[str, ZooKernel] = {
    **{fn.__name__: ZooKernel(name=fn.__name__, family="cross_entropy", bug_class=bug, references=refs, broken=fn,
                              fixed=cross_entropy_fixed, trigger=trigger, property_hint=hint)
       for fn, bug, refs, hint, trigger in CE_ENTRIES},
    **{fn.__name__: ZooKernel(name=fn.__name__, family=family, bug_class=bug, references=refs, broken=fn, fixed=fixed,
                              trigger=trigger, property_hint=hint)
       for fn, fixed, family, bug, refs, hint, trigger in ROW_ENTRIES},
}
