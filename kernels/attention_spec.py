"""The attention family's spec type: the features and limits an attention kernel declares."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .registry import KernelSpec, _hooked, family_spec

# Attention features a kernel may lack (NUMERICS.md section 1); strategies never draw an
# undeclared one. Field names match an external kernel's `flashcheck` capability dict.
ATTENTION_FEATURES = ("gqa", "dv", "window", "softcap", "varlen", "lse", "attn_mask", "splits", "causal", "kv_lens")
CAUSAL_ALIGNS = ("top_left", "bottom_right")


@family_spec("attention")
@dataclass(frozen=True, repr=False)
class AttentionSpec(KernelSpec):
    """fn(q, k, v, *, causal=False, scale=None, kv_lens=None, ...) -> o; the defaults claim every
    feature, so an undeclared limit fails instead of hiding."""

    max_head_dim: int = 256
    head_dims: Callable[[int], bool] | None = None  # head dims it takes (None: 1 .. max_head_dim)
    square_only: bool = False  # M = N only
    custom_scale: bool = True  # scale=
    row_sum: str = "rounded_p"  # "rounded_p": V of ones exact; "fp32_p": within 1 ulp
    block_n: int | None = None  # its key block (the bound's blocking), when declared
    # (keys per block, key blocks a row goes through) of its launch for (head_dim, n, dtype) and
    # the call's keyword options, when it knows its own (the production kernel's table); see
    # key_blocking
    blocking: Callable[[int, int, torch.dtype, Mapping[str, Any]], tuple[int, int]] | None = None
    gqa: bool = True  # Hq a multiple of Hkv, head h reads kv head h // (Hq // Hkv)
    dv: bool = True  # v's head dim may differ from q/k's
    window: bool = True  # window=(left, right)
    softcap: bool = True  # softcap=c
    varlen: bool = True  # a packed entry point: `varlen_fn` (below)
    lse: bool = True  # return_lse=True gives (o, lse)
    attn_mask: bool = True  # attn_mask= bool or float bias, broadcastable to (B, Hq, M, N)
    splits: bool = True  # num_splits=
    causal: bool = True  # causal=
    kv_lens: bool = True  # kv_lens=
    causal_align: tuple[str, ...] = CAUSAL_ALIGNS  # alignments accepted as causal_align=
    lse_empty: float = float("-inf")  # lse of a row with no visible key (FlashAttention 2: +inf)
    varlen_fn: Callable[..., Any] | None = None  # fn(q, k, v, cu_q, cu_k, *, max_seqlen_q, max_seqlen_k, ...)
    fp32_dot: str = "ieee"  # how its matmuls read fp32 operands: "ieee" (exact products) or "tf32"
    # ---- the backward pass (NUMERICS.md section 10), checked where the kernel has one ----
    autograd: bool | None = None  # its output carries autograd: None, found out on the first call
    # fn(q, k, v, o, lse, do, **options) -> (dq, dk, dv): a plain backward, given the forward's o and lse
    backward_fn: Callable[..., Any] | None = None
    deterministic_backward: bool = False  # bit-identical dq, dk, dv run to run (checked when declared)
    # (block_m, block_n) of its backward for (head_dim, v's head dim, m, n, dtype, options): the
    # bound's blocking; None: the worst case (one accumulation chain over every query and key)
    backward_blocking: Callable[[int, int, int, int, torch.dtype, Mapping[str, Any]], tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "varlen_fn", _hooked(self.varlen_fn, f"{self.name} (varlen)"))
        object.__setattr__(self, "backward_fn", _hooked(self.backward_fn, f"{self.name} (backward)"))
        aligns = (self.causal_align,) if isinstance(self.causal_align, str) else tuple(self.causal_align)
        if not aligns or any(a not in CAUSAL_ALIGNS for a in aligns):
            raise ValueError(f"causal_align must name some of {CAUSAL_ALIGNS}, got {self.causal_align!r}")
        object.__setattr__(self, "causal_align", aligns)
        lse_empty = float(self.lse_empty)
        if lse_empty not in (float("inf"), float("-inf")):
            raise ValueError(f"lse_empty must be -inf or +inf, got {self.lse_empty!r}")
        object.__setattr__(self, "lse_empty", lse_empty)
        if self.backward_fn is not None and not self.lse:
            raise ValueError("backward_fn takes the forward's lse: a kernel with lse=False cannot give it")
        if self.fp32_dot not in ("ieee", "tf32"):
            raise ValueError(f"fp32_dot must be 'ieee' or 'tf32', got {self.fp32_dot!r}")

    def has(self, feature: str) -> bool:
        """Whether this kernel declares `feature` (one of ATTENTION_FEATURES)."""
        if feature not in ATTENTION_FEATURES:
            raise KeyError(f"unknown attention feature {feature!r}; known: {ATTENTION_FEATURES}")
        if feature == "varlen":
            return self.varlen and self.varlen_fn is not None
        return bool(getattr(self, feature))

    def features(self) -> frozenset[str]:
        return frozenset(f for f in ATTENTION_FEATURES if self.has(f))

    def supports_head_dim(self, d: int) -> bool:
        return d <= self.max_head_dim and (self.head_dims is None or bool(self.head_dims(d)))

    def key_blocking(self, head_dim: int, n: int, dtype: torch.dtype,
                     options: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """(keys per block, key blocks) the attention bound needs for n keys and the call's keyword
        options (causal, window, attn_mask, ...): the kernel's own (`blocking`), else its declared
        `block_n`, else the worst case: one dot over every key and a rescale per key."""
        if self.blocking is not None:
            return self.blocking(head_dim, n, dtype, options or {})
        if self.block_n:
            return self.block_n, max(1, -(-n // self.block_n))
        return max(n, 1), max(n, 1)

    def backward_blocks(self, head_dim: int, head_dim_v: int, m: int, n: int, dtype: torch.dtype,
                        options: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """(block_m, block_n) the backward bound needs: the kernel's own, else the worst case."""
        if self.backward_blocking is not None:
            return self.backward_blocking(head_dim, head_dim_v, m, n, dtype, options or {})
        return max(m, 1), max(n, 1)
