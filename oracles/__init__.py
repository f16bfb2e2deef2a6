"""Exact oracles: formats and ULP metric, correct and certified rounding, softmax / log-sum-exp,
log-softmax / softmax-backward / cross-entropy oracles, and the derived kernel error bounds."""
from .attention import AttentionComparison, AttentionOracle, attention_oracle, compare_attention
from .attention_backward import AttentionBackward, attention_backward_oracle, attention_backward_quantities
from .attention_backward_bound import attention_backward_bound
from .cross_entropy import (
    cross_entropy_grad_bound,
    cross_entropy_grad_oracle,
    cross_entropy_loss_bound,
    cross_entropy_oracle,
)
from .cross_entropy_bound import cross_entropy_full_grad_bound, cross_entropy_full_loss_bound
from .bounds import attention_error_bound, ftz_allowed, softmax_relative_error, softmax_sum_bound, softmax_ulp_bound
from .formats import (
    BF16,
    BY_NAME,
    FORMATS,
    FP16,
    FP32,
    Format,
    format_of,
    round_float64,
    to_float64,
    ulp_distance,
    ulp_of,
)
from .rounding import UndecidedRounding, round_certified, round_fraction, round_mpf
from .log_softmax import (
    log_softmax_backward_bound,
    log_softmax_backward_oracle,
    log_softmax_bound,
    log_softmax_oracle,
    softmax_backward_bound,
    softmax_backward_oracle,
)
from .softmax import logsumexp_oracle, softmax_oracle

__all__ = [
    "AttentionBackward",
    "AttentionComparison",
    "AttentionOracle",
    "attention_backward_bound",
    "attention_backward_oracle",
    "attention_backward_quantities",
    "attention_error_bound",
    "attention_oracle",
    "compare_attention",
    "cross_entropy_full_grad_bound",
    "cross_entropy_full_loss_bound",
    "cross_entropy_grad_bound",
    "cross_entropy_grad_oracle",
    "cross_entropy_loss_bound",
    "cross_entropy_oracle",
    "BF16",
    "BY_NAME",
    "FORMATS",
    "FP16",
    "FP32",
    "Format",
    "UndecidedRounding",
    "format_of",
    "ftz_allowed",
    "log_softmax_backward_bound",
    "log_softmax_backward_oracle",
    "log_softmax_bound",
    "log_softmax_oracle",
    "logsumexp_oracle",
    "round_certified",
    "round_float64",
    "round_fraction",
    "round_mpf",
    "softmax_backward_bound",
    "softmax_backward_oracle",
    "softmax_oracle",
    "softmax_relative_error",
    "softmax_sum_bound",
    "softmax_ulp_bound",
    "to_float64",
    "ulp_distance",
    "ulp_of",
]
