"""Exact oracles: formats and ULP metric, correct and certified rounding, softmax / log-sum-exp
oracles, and the derived kernel error bounds."""
from .attention import AttentionComparison, AttentionOracle, attention_oracle, compare_attention
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
from .softmax import logsumexp_oracle, softmax_oracle

__all__ = [
    "AttentionComparison",
    "AttentionOracle",
    "attention_error_bound",
    "attention_oracle",
    "compare_attention",
    "BF16",
    "BY_NAME",
    "FORMATS",
    "FP16",
    "FP32",
    "Format",
    "UndecidedRounding",
    "format_of",
    "ftz_allowed",
    "logsumexp_oracle",
    "round_certified",
    "round_float64",
    "round_fraction",
    "round_mpf",
    "softmax_oracle",
    "softmax_relative_error",
    "softmax_sum_bound",
    "softmax_ulp_bound",
    "to_float64",
    "ulp_distance",
    "ulp_of",
]
