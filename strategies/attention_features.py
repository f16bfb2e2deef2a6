"""What the attention classes' draws must reach (NUMERICS.md section 4, items 13 and 14): one
`Feature` per input property, keyed by the class that must draw it. Read by the self-tests'
ci-draws reachability test (tests/test_strategies.py) and the suite's per-class reachability test
(flashcheck/suite/test_attention.py), so the table ships with the strategies it describes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from flashcheck.oracles.formats import Format, to_float64

from .case import Case
from .records import Feature, pow2 as _pow2


def _qkv(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(to_float64(case.tensors[n]) for n in "qkv")  # type: ignore[return-value]


def _lens(case: Case) -> list[int]:
    kv = case.tensors.get("kv_lens")
    return [int(v) for v in kv.tolist()] if kv is not None else []


def _scores(case: Case) -> np.ndarray:
    q, k, _ = _qkv(case)
    with np.errstate(all="ignore"):
        return np.einsum("bhmd,bhnd->bhmn", q, k)


def _scaled_spread_over_88(case: Case, fmt: Format) -> bool:
    q = case.tensors["q"]
    d = q.shape[-1]
    sc = case.kwargs.get("scale") or 1.0 / math.sqrt(d)
    s = _scores(case) * sc
    if not s.size:
        return False
    with np.errstate(all="ignore"):
        spread = np.nanmax(s, axis=-1) - np.nanmin(s, axis=-1)
    return bool(np.nanmax(spread) > 88)


def _raw_over_fp16(case: Case, fmt: Format) -> bool:
    s = np.abs(_scores(case))
    return bool(s.size and np.nanmax(s) > 65504)


def _head_dim(pred: Callable[[int], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: pred(case.tensors["q"].shape[-1])


def _mn(pred: Callable[[int, int], bool], causal: bool | None = None) -> Callable[[Case, Format], bool]:
    def f(case: Case, fmt: Format) -> bool:
        if causal is not None and bool(case.kwargs.get("causal")) != causal:
            return False
        return pred(case.tensors["q"].shape[2], case.tensors["k"].shape[2])
    return f


def _kv_len(pred: Callable[[int, int], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: any(pred(x, case.tensors["k"].shape[2]) for x in _lens(case))


def _nan_in_padded_kv(case: Case, fmt: Format) -> bool:
    _, k, v = _qkv(case)
    return any(n < k.shape[2] and (np.isnan(v[b, :, n:]).any() or np.isnan(k[b, :, n:]).any())
               for b, n in enumerate(_lens(case)))


def _is_bshd(case: Case, fmt: Format) -> bool:
    t = case.tensors["q"]
    B, H, S, D = t.shape
    return H > 1 and S > 1 and t.stride(1) < t.stride(2)


def _is_bhsd(case: Case, fmt: Format) -> bool:
    t = case.tensors["q"]
    return t.stride(2) >= t.stride(3) and (t.shape[1] == 1 or t.stride(1) >= t.stride(2))


def _varlen_lens(case: Case, which: str) -> list[int]:
    cu = case.tensors.get(f"cu_seqlens_{which}")
    return np.diff(cu.cpu().numpy()).tolist() if cu is not None else []


def _group(case: Case) -> tuple[int, int]:
    """(Hq, Hkv) of a dense or varlen case."""
    q, k = case.tensors["q"], case.tensors["k"]
    return (q.shape[1], k.shape[1]) if q.dim() == 4 else (q.shape[1], k.shape[1])


def _group_boundary_in_tile(case: Case, fmt: Format) -> bool:
    """Hq / Hkv > 1 with a query length that is no multiple of a 16-row tile, the group's rows
    (G * M) spanning more than one head inside a 32-row tile: a packed tile holds a boundary."""
    hq, hkv = _group(case)
    m = case.tensors["q"].shape[2]
    return hq > hkv and m % 16 != 0 and m < 32 and (hq // hkv) * m > m


def _diagonal_across_edge(case: Case, fmt: Format) -> bool:
    """Causal GQA whose diagonal crosses a 16-key edge inside the query rows: the first row stops
    below the edge, the last reaches it (a packed tile's fully seen key blocks come from its first
    position)."""
    hq, hkv = _group(case)
    if not case.kwargs.get("causal") or hq == hkv:
        return False
    m, n = case.tensors["q"].shape[2], case.tensors["k"].shape[2]
    off = n - m if case.kwargs.get("causal_align") == "bottom_right" else 0
    return any(off <= e - 2 and off + m - 1 >= e - 1 for e in range(16, n + 1, 16))


def _bias_row_at_finite_min(mask: torch.Tensor, at_most: float = -9.0e3) -> bool:
    """A float bias with a whole row at one finite value <= at_most (a row masked the BERT or
    Hugging Face way; -10000 in bf16 is -9984)."""
    if mask.dtype == torch.bool:
        return False
    m = mask.double()
    row = (m == m[..., :1]).all(-1) & torch.isfinite(m[..., 0]) & (m[..., 0] <= at_most)
    return bool(row.any())


def _window(case: Case) -> tuple[int, int] | None:
    w = case.kwargs.get("window")
    return tuple(w) if w is not None else None


def _window_edge(pred: Callable[[int, int, int], bool]) -> Callable[[Case, Format], bool]:
    def f(case: Case, fmt: Format) -> bool:
        w = _window(case)
        return w is not None and pred(w[0], w[1], case.tensors["k"].shape[2])
    return f


def _left_edge_past_block_edge(case: Case, fmt: Format) -> bool:
    """The last query row's window starts one key past a 16-key block edge."""
    w = _window(case)
    if w is None or w[0] < 0:
        return False
    m, n = case.tensors["q"].shape[2], case.tensors["k"].shape[2]
    last = m - 1 + (n - m if case.kwargs.get("causal_align") == "bottom_right" else 0)
    return last - w[0] >= 17 and (last - w[0]) % 16 == 1


def _rows_past_keys_one_past_a_block_edge(case: Case, fmt: Format) -> bool:
    """Top-left, and the last row's window starts past the last key, which stands one key past a
    16-key block edge (N = 1 mod 16)."""
    w = _window(case)
    if w is None or w[0] < 0 or case.kwargs.get("causal_align") == "bottom_right":
        return False
    m, n = case.tensors["q"].shape[2], case.tensors["k"].shape[2]
    return n % 16 == 1 and m - 1 - w[0] >= n


def _window_empties_row_bottom_right(case: Case, fmt: Format) -> bool:
    """Bottom-right alignment with M > n: the first rows' diagonal lies before key 0, so a right
    edge (causal or window) leaves them no key."""
    if case.kwargs.get("causal_align") != "bottom_right":
        return False
    w = _window(case) or (-1, -1)
    right = 0 if case.kwargs.get("causal") else w[1]
    m, n = case.tensors["q"].shape[2], case.tensors["k"].shape[2]
    lens = _lens(case) or [n]
    return right >= 0 and any(m - x > right for x in lens)


def _softcap_vs_logits(below: bool) -> Callable[[Case, Format], bool]:
    def f(case: Case, fmt: Format) -> bool:
        cap = float(case.kwargs.get("softcap") or 0.0)
        if cap <= 0:
            return False
        d = case.tensors["q"].shape[-1]
        with np.errstate(all="ignore"):
            top = float(np.nanmax(np.abs(_scores(case)))) / math.sqrt(d) if _scores(case).size else 0.0
        return top > 10 * cap if below else cap > 100 * max(top, 1e-30)
    return f


def _mask(pred: Callable[[torch.Tensor], bool]) -> Callable[[Case, Format], bool]:
    return lambda case, fmt: "attn_mask" in case.tensors and pred(case.tensors["attn_mask"])


def _mask_row_all_false(m: torch.Tensor) -> bool:
    return m.dtype == torch.bool and m.dim() >= 2 and bool((~m).all(-1).any())


def _splits(pred: Callable[[Case, int, int], bool]) -> Callable[[Case, Format], bool]:
    def f(case: Case, fmt: Format) -> bool:
        s = int(case.kwargs.get("num_splits") or 1)
        n = case.tensors["k"].shape[2]
        return s > 1 and pred(case, s, n)
    return f


def _split_all_masked(case: Case, s: int, n: int) -> bool:
    """Some split of 32-key blocks (the CPU blocking) lies wholly past some batch's kv_len."""
    blocks = max(1, -(-n // 32))
    per = -(-blocks // s) * 32
    return any(x <= (s - 1) * per and (s - 1) * per < max(n, 1) or x <= per for x in _lens(case) if x < n)


def _large_values_many_keys(case: Case, fmt: Format) -> bool:
    _, _, v = _qkv(case)
    top = min(fmt.max_finite, 65504.0)
    return v.shape[2] >= 64 and float(np.abs(v).max()) >= 0.5 * top


def _long_near_equal(case: Case, fmt: Format) -> bool:
    s = _scores(case) / math.sqrt(case.tensors["q"].shape[-1])
    return case.tensors["k"].shape[2] >= 1024 and s.size and float((s.max(-1) - s.min(-1)).max()) < 2.0


FEATURES = [
    Feature("wide_logit_spread", "scaled_logit_spread_over_88", _scaled_spread_over_88),
    Feature("fp16_overflowing_scores", "raw_scores_over_65504", _raw_over_fp16),
    Feature("odd_head_dims", "head_dim_over_64_not_pow2", _head_dim(lambda d: d > 64 and not _pow2(d))),
    Feature("odd_head_dims", "head_dim_not_pow2_upto_64", _head_dim(lambda d: 2 < d <= 64 and not _pow2(d))),
    Feature("ragged_lengths", "m_ne_n", _mn(lambda m, n: m != n)),
    Feature("kv_lens_edges", "kv_len_0", _kv_len(lambda x, n: x == 0)),
    Feature("kv_lens_edges", "kv_len_1", _kv_len(lambda x, n: x == 1)),
    Feature("kv_lens_edges", "kv_len_n", _kv_len(lambda x, n: x == n)),
    Feature("kv_lens_edges", "kv_len_not_block_multiple", _kv_len(lambda x, n: 1 < x < n and x % 16 != 0)),
    Feature("causal_rectangular", "causal_m_gt_n", _mn(lambda m, n: m > n, causal=True)),
    Feature("causal_rectangular", "causal_m_lt_n", _mn(lambda m, n: m < n, causal=True)),
    Feature("fully_masked_rows", "query_rows_see_no_key", _kv_len(lambda x, n: x == 0)),
    Feature("nan_in_hidden_kv", "nan_in_padded_kv", _nan_in_padded_kv),
    Feature(None, "bshd_layout", _is_bshd),
    Feature(None, "bhsd_layout", _is_bhsd),
    # item 14: features (each only for kernels that declare it: `requires`)
    Feature("gqa_groups", "group_boundary_inside_tile", _group_boundary_in_tile),
    Feature("gqa_groups", "causal_diagonal_across_key_edge", _diagonal_across_edge),
    Feature("gqa_groups", "mqa", lambda c, f: _group(c)[1] == 1 and _group(c)[0] > 1),
    Feature("gqa_groups", "group_of_3", lambda c, f: _group(c)[0] == 3 * _group(c)[1]),
    Feature("gqa_groups", "dv_differs", lambda c, f: c.tensors["v"].shape[-1] != c.tensors["q"].shape[-1]),
    Feature("window_edges", "left_0", _window_edge(lambda l, r, n: l == 0)),
    Feature("window_edges", "right_0", _window_edge(lambda l, r, n: r == 0)),
    Feature("window_edges", "wider_than_n", _window_edge(lambda l, r, n: max(l, r) >= n)),
    Feature("window_edges", "last_row_left_edge_one_past_a_block_edge", _left_edge_past_block_edge),
    Feature("window_edges", "window_empties_row_bottom_right", _window_empties_row_bottom_right),
    Feature("window_edges", "rows_past_keys_one_past_a_block_edge", _rows_past_keys_one_past_a_block_edge),
    Feature("softcap_extremes", "softcap_far_below_logits", _softcap_vs_logits(True)),
    Feature("softcap_extremes", "softcap_far_above_logits", _softcap_vs_logits(False)),
    Feature("attn_masks", "bool_mask", _mask(lambda m: m.dtype == torch.bool)),
    Feature("attn_masks", "bool_mask_row_all_false", _mask(_mask_row_all_false)),
    Feature("attn_masks", "bias_with_neg_inf", _mask(lambda m: m.dtype != torch.bool and bool(torch.isinf(m).any()))),
    Feature("attn_masks", "bias_row_masked_by_a_finite_min", _mask(_bias_row_at_finite_min)),
    Feature("split_kv", "more_splits_than_key_blocks", _splits(lambda c, s, n: s > -(-n // 16))),
    Feature("split_kv", "split_all_masked", _splits(_split_all_masked)),
    # below the -1e4 a merge might start its running max at (every split of the row then drops)
    Feature("split_kv", "split_row_masked_by_a_finite_min",
            _splits(lambda c, s, n: "attn_mask" in c.tensors and _bias_row_at_finite_min(c.tensors["attn_mask"], -2.0e4))),
    Feature("varlen_batches", "empty_sequence", lambda c, f: 0 in _varlen_lens(c, "q") + _varlen_lens(c, "k")),
    Feature("varlen_batches", "length_1_sequence", lambda c, f: 1 in _varlen_lens(c, "q") + _varlen_lens(c, "k")),
    Feature("varlen_batches", "total_off_block_multiple",
            lambda c, f: c.tensors["q"].shape[0] % 16 != 0 and len(_varlen_lens(c, "q")) > 1),
    # item 13: 16-bit accumulators
    Feature("large_values_many_keys", "values_near_fp16_max_many_keys", _large_values_many_keys),
    Feature("long_near_equal_scores", "n_1024_near_equal_scores", _long_near_equal),
]


__all__ = ["FEATURES", "Feature"]
