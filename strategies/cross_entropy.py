"""Adversarial inputs for cross-entropy, softmax backward and log-softmax backward kernels
(issue 52 groundwork; the oracles and special values: docs/NUMERICS.md section 9, the classes 9.5).

Three tables, one per kernel kind, in the house style of `strategies/softmax.py`:

* `CE_CLASS_RECORDS` / `CE_CLASSES`: cases for `fn(logits, target, *, ignore_index, label_smoothing,
  reduction, ...)`. `Case.tensors`: "logits" (N, V) in a NaN-guarded buffer (any layout), "target"
  (N,) int64 in a buffer guarded by `ignore_index` (a kernel reading past it, or ignoring its
  stride, sees ignored rows: a memory-safe wrong answer the oracle catches), and where the class is
  about them "weight" (V,) and "grad_output" (() for "mean"/"sum", (N,) for "none"). `Case.kwargs`:
  always "ignore_index", "label_smoothing", "reduction"; "z_loss" / "softcap" in their classes.
* `SOFTMAX_BACKWARD_CLASS_RECORDS` / `SOFTMAX_BACKWARD_CLASSES`: `Case.tensors` "y" (valid
  probability rows: the correctly rounded softmax of drawn logits, `oracles.softmax.softmax_oracle`)
  and "dy", each in its own layout.
* `LOG_SOFTMAX_BACKWARD_CLASS_RECORDS` / `LOG_SOFTMAX_BACKWARD_CLASSES`: the same classes with
  "logp" (the correctly rounded log-softmax, `oracles.log_softmax.log_softmax_oracle`) for "y".
* Log-softmax forward takes a softmax's input: `LOG_SOFTMAX_CLASS_RECORDS` / `LOG_SOFTMAX_CLASSES`
  are `strategies.softmax`'s tables themselves (tensor "x"), not copies.

Values are exact in the drawn format (`floats.representable`), rows are a cheap background plus a
few exact overrides (`floats.backgrounds`, `floats.with_overrides`) so counterexamples shrink to a
constant row and the elements that matter; every mode list shrinks to its first, simplest entry.
`needs` names the kernel features a class draws (weights, smoothing, z-loss, softcap): a kernel
without one is never given that class, as attention's `CLASS_FEATURES`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from flashcheck.kernels import DEVICE
from flashcheck.oracles.formats import BF16, FP16, Format, format_of, ulp_of
from flashcheck.oracles.log_softmax import log_softmax_oracle
from flashcheck.oracles.softmax import softmax_oracle
from .case import Case
from .floats import Layout, backgrounds, exact_floats, layouts, materialize, representable, with_overrides
from .records import StrategyClass, by_name
from .softmax import BLOCKS, CLASS_RECORDS as _SOFTMAX_RECORDS, CLASSES as _SOFTMAX_CLASSES, row_lengths

NEG_INF = -np.inf
POS_INF = np.inf
REDUCTIONS = ("mean", "sum", "none")  # shrinks to torch's default
IGNORE_INDEX = -100  # torch's default
INT32_LIMIT = 2**31  # element offsets past this overflow a kernel's int32 arithmetic (REAL_BUGS CE 4)
#: The window of the target's softmax the `confident` class lands in (REAL_BUGS CE 1: 100% error at
#: 0.999), and the narrower one it aims at so that a loss rounded to fp32 still lands inside.
CONFIDENT = (0.99, 0.9999)
_AIM = (0.9901, 0.99985)
#: Real vocabulary sizes (GPT-2, Llama 2, Llama 3, Qwen 2, Gemma) for long rows.
VOCABS = (32000, 50257, 128256, 151936, 256000)


# ---- building blocks -----------------------------------------------------------------------------

def _seed() -> SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


@composite
def _shape(draw, *, max_n: int, max_m: int, min_n: int = 1, min_m: int = 1) -> tuple[int, int]:
    """(N rows, V classes): V from `row_lengths` (powers of two +-1, BLOCK/2 mod BLOCK, primes)."""
    return draw(st.integers(min_m, max(min_m, max_m))), draw(row_lengths(max_n=max(max_n, min_n), min_n=min_n))


def _targets(m: int, v: int) -> SearchStrategy[list[int]]:
    return st.lists(st.integers(0, v - 1), min_size=m, max_size=m)


def _finite(fmt: Format, bound: float) -> SearchStrategy[float]:
    b = 2.0 ** math.ceil(math.log2(bound))
    return exact_floats(fmt, min_value=-b, max_value=b, allow_nan=False, allow_infinity=False)


def _mode(kinds) -> SearchStrategy[str]:
    return st.sampled_from(list(kinds))


def _vector(values: np.ndarray, fmt: Format, *, offset: int = 0, step: int = 1) -> torch.Tensor:
    """A 1-D view of exact `values` in a NaN-guarded buffer (storage offset, element step)."""
    layout = Layout(col_step=step, offset=offset, tail=2)
    return materialize(np.asarray(values, dtype=np.float64)[None, :], fmt, layout, DEVICE)[0]


def labels(values, *, guard: int, offset: int = 0, step: int = 1, tail: int = 2) -> torch.Tensor:
    """An int64 (N,) view of `values` at storage `offset` with element `step`, inside a buffer whose
    other elements hold `guard` (the ignore_index: a kernel reading them treats a row as ignored)."""
    vals = torch.as_tensor(list(values), dtype=torch.int64)
    n = vals.numel()
    size = offset + max(n - 1, 0) * step + 1 + tail
    buf = torch.full((size,), int(guard), dtype=torch.int64)
    buf.as_strided((n,), (step,), offset).copy_(vals)
    return buf.to(DEVICE).as_strided((n,), (step,), offset)


@composite
def _label_layout(draw, strided: bool) -> tuple[int, int]:
    """(storage offset, step) of the labels: 0, 1 first; an odd offset puts int64 labels off a
    16-byte boundary (REAL_BUGS CE 9)."""
    if not strided:
        return 0, 1
    return draw(st.integers(0, 3)), draw(st.sampled_from([1, 2]))


def _finish_ce(draw, x: np.ndarray, targets, fmt: Format, label: str, strided: bool, *,
               ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0, reduction: str | None = None,
               weight: np.ndarray | None = None, grad_output: np.ndarray | float | None = None,
               extra: dict | None = None, logits_layout: Layout | None = None,
               label_layout: tuple[int, int] | None = None) -> Case:
    """Materialize a cross-entropy case: logits in a NaN-guarded layout, labels guarded by
    ignore_index, optional weight and grad_output in `fmt`."""
    if reduction is None:
        reduction = draw(_mode(REDUCTIONS))
    layout = logits_layout if logits_layout is not None else draw(layouts(strided=strided))
    offset, step = label_layout if label_layout is not None else draw(_label_layout(strided))
    tensors = {
        "logits": materialize(representable(x, fmt), fmt, layout, DEVICE),
        "target": labels(targets, guard=ignore_index, offset=offset, step=step),
    }
    if weight is not None:
        tensors["weight"] = _vector(representable(weight, fmt), fmt)
    if grad_output is not None:
        g = np.asarray(grad_output, dtype=np.float64)
        if g.ndim == 0:
            tensors["grad_output"] = torch.tensor(float(representable(g, fmt)), dtype=fmt.torch_dtype, device=DEVICE)
        else:
            tensors["grad_output"] = _vector(representable(g, fmt), fmt,
                                             offset=draw(st.integers(0, 3)) if strided else 0)
    kwargs = {"ignore_index": int(ignore_index), "label_smoothing": float(label_smoothing), "reduction": reduction}
    kwargs.update(extra or {})
    return Case(tensors=tensors, kwargs=kwargs, label=label)


# ---- cross-entropy classes -----------------------------------------------------------------------

@composite
def ce_benign(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Standard-normal logits times a drawn scale, random targets, any reduction."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    scale = draw(st.sampled_from([1.0, 0.1, 4.0, 16.0]))
    x = draw(with_overrides(draw(backgrounds((m, v), scale=scale)), _finite(fmt, 4.0 * scale)))
    return _finish_ce(draw, x, draw(_targets(m, v)), fmt, "benign", strided)


def _step(a: float, fmt: Format, up: bool) -> float:
    """The neighbour of `a` in `fmt` above (up) or below (at a binade edge possibly two values on)."""
    u = float(ulp_of(np.array([a]), fmt)[0])
    return float(representable(np.array([a + (u if up else -u)]), fmt)[0])


def confident_target_logit(row: np.ndarray, t: int, p: float, fmt: Format) -> float:
    """An exact logit of `fmt` for column t making the target's softmax land in `CONFIDENT`, aimed
    at p: a = log(p / (1 - p)) + logsumexp(others), rounded, then moved one value at a time while
    the softmax (in float64, exact to ~1e-15) is outside `_AIM`. Other entries must be finite."""
    others = np.delete(row, t)
    if others.size == 0:
        return float(row[t])
    mo = float(others.max())
    lso = mo + math.log(float(np.exp(others - mo).sum()))

    def p_of(a: float) -> float:
        return 1.0 / (1.0 + math.exp(lso - a))

    a = float(representable(np.array([lso + math.log(p / (1.0 - p))]), fmt)[0])
    for _ in range(64):
        pt = p_of(a)
        if pt < _AIM[0]:
            a = _step(a, fmt, True)
        elif pt > _AIM[1]:
            a = _step(a, fmt, False)
        else:
            return a
    raise AssertionError(f"confident_target_logit: no value of {fmt.name} puts p_t in {_AIM} (last {a})")


@composite
def ce_confident(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Every row's target softmax in [0.99, 0.9999] (the logit gap from log(p / (1 - p)), checked
    in float64): the loss is ~1e-2..1e-4 and the true-class gradient p_t - 1 cancels (REAL_BUGS
    CE 1: a gradient written through bf16 before subtracting is 100% off). Logits sit about 0, or
    shifted by +24, -30, or +1000 (not bf16, whose spacing there skips the window) so that
    lse - x_t is a difference of large numbers."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    base = draw(st.sampled_from([0.0, 24.0, -30.0] + ([] if fmt == BF16 else [1000.0])))
    noise = draw(st.sampled_from([1.0, 0.0, 0.1, 3.0]))
    x = representable(draw(backgrounds((m, v), scale=noise, loc=base)), fmt)
    targets = draw(_targets(m, v))
    probs = draw(st.lists(st.one_of(st.sampled_from([0.999, 0.99, 0.9999]), st.floats(*CONFIDENT)),
                          min_size=m, max_size=m))
    for i, (t, p) in enumerate(zip(targets, probs)):
        x[i, t] = confident_target_logit(x[i], t, min(max(p, _AIM[0]), _AIM[1]), fmt)
    go = draw(st.one_of(st.none(), st.just(1.0)))  # an explicit unit grad_output sometimes
    red = draw(_mode(REDUCTIONS))
    grad = None if go is None else (np.full(m, go) if red == "none" else go)
    return _finish_ce(draw, x, targets, fmt, f"confident/{'shift' if base else 'zero'}", strided,
                      reduction=red, grad_output=grad)


TIE_KINDS = ("target_tied", "target_not_tied", "constant")


@composite
def ce_tied_maxima(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """k >= 2 equal maxima c (p = 1/k exactly when the rest underflow, else near): the target among
    them, or strictly below them; or a constant row (p_t = 1/V, loss log V)."""
    fmt = format_of(dtype)
    kind = draw(_mode(TIE_KINDS))
    m, v = draw(_shape(max_n=max_n, max_m=max_m, min_n=3 if kind == "target_not_tied" else 2))
    c = draw(_finite(fmt, 1.0e4))
    rng = np.random.default_rng(draw(_seed()))
    gap = max(1.0, abs(c) / 4.0) * draw(st.sampled_from([1.0, 40.0]))  # 40: the rest underflow
    x = np.maximum(c - gap * (1.0 + np.abs(draw(backgrounds((m, v))))), -fmt.max_finite / 2)  # < c, finite
    targets = draw(_targets(m, v))
    for i in range(m):
        if kind == "constant":
            x[i] = c
            continue
        k = draw(st.integers(2, v if kind == "target_tied" else max(2, v - 1)))
        k = min(k, v - (kind == "target_not_tied"))
        cols = rng.permutation(v)
        if kind == "target_tied":
            cols = np.concatenate([[targets[i]], cols[cols != targets[i]]])
        else:
            cols = cols[cols != targets[i]]
        x[i, cols[:max(k, 1)]] = c
    return _finish_ce(draw, x, targets, fmt, f"tied_maxima/{kind}", strided)


OVERFLOW_KINDS = ("offset", "spread", "all_negative", "target_far", "near_max")


@composite
def ce_past_overflow(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """|logits| past exp's overflow (88.7 in fp32; 11.1 for fp16's own exp): every logit offset
    above 88 (no max subtraction overflows), a spread of hundreds, every logit below -88 (a naive
    exp underflows to 0, log 0 = -inf), the target far below a max above 88 (loss ~1e4,
    p_t underflows), values near the format's max (lse - x_j overflows under smoothing)."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    kind = draw(_mode(OVERFLOW_KINDS))
    bg = np.abs(draw(backgrounds((m, v))))
    targets = draw(_targets(m, v))
    big = [89.0, 100.0, 1000.0, 1.0e4] + ([] if fmt == FP16 else [1.0e6, 1.0e30])
    if kind == "offset":
        x = draw(st.sampled_from(big)) + bg * draw(st.sampled_from([1.0, 8.0, 60.0]))
    elif kind == "spread":
        x = draw(st.sampled_from([89.0, 100.0])) - bg * draw(st.sampled_from([100.0, 1000.0, 3.0e4]))
        x = np.maximum(x, -fmt.max_finite)
        x[:, 0] = 89.0
    elif kind == "all_negative":
        x = -draw(st.sampled_from([89.0, 104.0, 1000.0])) - bg * draw(st.sampled_from([1.0, 30.0]))
    elif kind == "target_far":
        x = draw(st.sampled_from([89.0, 120.0])) + bg
        far = -1.0e4 if fmt == FP16 else draw(st.sampled_from([-1.0e4, -1.0e30]))
        for i, t in enumerate(targets):
            x[i, t] = far
    else:
        sign = np.where(np.abs(draw(backgrounds((m, v)))) > draw(st.sampled_from([9.0, 0.5])), -1.0, 1.0)
        x = sign * fmt.max_finite * (1.0 - np.minimum(bg, 1.0) * 2.0 ** -draw(st.integers(1, 6)))
    return _finish_ce(draw, x, targets, fmt, f"past_overflow/{kind}", strided)


MASK_KINDS = ("target", "tail", "scattered", "aligned_block", "all_but_one", "fully_masked")


def _mask_row(draw, kind: str, v: int, t: int, rng: np.random.Generator) -> np.ndarray:
    mask = np.zeros(v, dtype=bool)
    if kind == "target":
        mask[t] = True
        mask |= rng.random(v) < draw(st.sampled_from([0.0, 0.5]))
    elif kind == "tail":  # a vocabulary padded to a multiple of 64/128 with -inf
        mask[v - draw(st.integers(1, max(1, v - 1))):] = True
    elif kind == "scattered":
        mask |= rng.random(v) < draw(st.sampled_from([0.25, 0.75, 0.95]))
    elif kind == "aligned_block":
        b = draw(st.sampled_from([b for b in BLOCKS if b < v] or [max(1, v // 2)]))
        nb = math.ceil(v / b)
        start = b * draw(st.integers(0, max(0, nb - 1)))
        mask[start:start + b] = True
    elif kind == "all_but_one":
        mask[:] = True
        mask[draw(st.sampled_from([t, int(rng.integers(0, v))]))] = False
    else:
        mask[:] = True
    if kind not in ("fully_masked", "all_but_one") and mask.all() and v > 1:
        # fully masked rows are their own kind; a masked target keeps another entry visible
        mask[(t + 1 + int(rng.integers(0, v - 1))) % v if kind == "target" else int(rng.integers(0, v))] = False
    return mask


@composite
def ce_masked_vocab(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """-inf logits (a masked or padded vocabulary): at the target (loss +inf, gradient finite),
    a -inf tail, scattered, a whole aligned block, all but one entry (loss exactly 0 at that
    target), or the whole row (loss NaN). Other rows stay finite."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    kind = draw(_mode(MASK_KINDS))
    rows = draw(st.sets(st.integers(0, m - 1), min_size=1))
    rng = np.random.default_rng(draw(_seed()))
    x = draw(backgrounds((m, v), scale=draw(st.sampled_from([1.0, 4.0]))))
    targets = draw(_targets(m, v))
    for i in sorted(rows):
        x[i, _mask_row(draw, kind, v, targets[i], rng)] = NEG_INF
    return _finish_ce(draw, x, targets, fmt, f"masked_vocab/{kind}", strided)


def _ignore_indices(v: int) -> list[int]:
    """torch's -100, -1, a class id (pad token 0: legal, that class is then never scored), and
    ids past V: V itself and the padded tile's last column (REAL_BUGS CE 8: a sentinel indexing a
    padded column of the last tile)."""
    pad = 1 << max(0, (v - 1).bit_length())
    opts = [IGNORE_INDEX, -1] + ([0] if v >= 2 else []) + [v]
    return opts + ([pad - 1] if pad - 1 > v else [])


@composite
def ce_ignored_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 5, strided: bool = True) -> Case:
    """Rows with target == ignore_index (loss and gradient exactly 0 whatever the row holds: some
    hold NaN, +inf or -inf garbage), some or all of the batch; with "mean" and every row ignored
    the loss is NaN (torch: 0/0). ignore_index is -100, -1, class 0, V or past V."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    ignore_index = draw(st.sampled_from(_ignore_indices(v)))
    every = draw(st.booleans())
    ignored = set(range(m)) if every else draw(st.sets(st.integers(0, m - 1), min_size=1, max_size=max(1, m - 1)))
    if not every and len(ignored) == m and m > 1:
        ignored.discard(m - 1)
    allowed = [c for c in range(v) if c != ignore_index] or [0]
    targets = [ignore_index if i in ignored else allowed[draw(st.integers(0, len(allowed) - 1))] for i in range(m)]
    x = draw(backgrounds((m, v)))
    garbage = draw(st.sampled_from([None, np.nan, POS_INF, NEG_INF]))
    if garbage is not None:
        for i in ignored:
            x[i, draw(st.integers(0, v - 1))] = garbage
    label = f"ignored_rows/{'all' if len(ignored) == m else 'some'}" + ("" if garbage is None else "/garbage")
    return _finish_ce(draw, x, targets, fmt, label, strided, ignore_index=ignore_index)


@composite
def ce_weighted(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Class weights (V,): exact values in [0, 8] with zeros, including on targets (a weighted mean
    divides by sum w_t, which can be 0: NaN), and powers of two far from 1."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    base = draw(st.sampled_from([1.0, 0.0, 0.5]))
    w = draw(with_overrides(np.abs(draw(backgrounds((1, v), scale=2.0, loc=base))),
                            st.sampled_from([0.0, 1.0, 2.0**-10, 0.25, 8.0, 2.0**10]), max_size=6))[0]
    targets = draw(_targets(m, v))
    if draw(st.booleans()):  # weight 0 on some target
        w[targets[draw(st.integers(0, m - 1))]] = 0.0
    x = draw(backgrounds((m, v), scale=draw(st.sampled_from([1.0, 4.0]))))
    return _finish_ce(draw, x, targets, fmt, "weighted", strided, weight=w)


SMOOTHINGS = (0.1, 0.5, 1.0, 0.05, 2.0**-10, 0.9)


@composite
def ce_smoothing_with_inf(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """label_smoothing > 0 with -inf logits: the smoothing term sum_j (lse - x_j) is +inf, so the
    loss is +inf (NaN with eps = 1 and a -inf target), the gradient finite, -(eps/V) at a -inf
    column. Some rows without -inf keep a finite loss; -inf sometimes at the target."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    eps = draw(st.sampled_from(SMOOTHINGS))
    x = draw(backgrounds((m, v), scale=draw(st.sampled_from([1.0, 4.0]))))
    targets = draw(_targets(m, v))
    rows = draw(st.sets(st.integers(0, m - 1), min_size=1))
    rng = np.random.default_rng(draw(_seed()))
    at_target = draw(st.booleans())
    for i in rows:
        mask = rng.random(v) < draw(st.sampled_from([0.1, 0.5]))
        mask[targets[i]] = at_target
        if mask.all():
            mask[(targets[i] + 1) % v] = False
        if not mask.any():
            mask[(targets[i] + 1) % v] = True
        x[i, mask] = NEG_INF
    return _finish_ce(draw, x, targets, fmt, f"smoothing_with_inf{'/target' if at_target else ''}", strided,
                      label_smoothing=eps)


_GRAD_SPECIALS = (0.0, 1.0, -1.0, 2.0**-20, 1024.0, 6.0e4)


@composite
def ce_grad_output_nonuniform(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 5,
                              strided: bool = True) -> Case:
    """reduction "none" with a per-row grad_output (N,) whose first entry differs from the rest
    (REAL_BUGS CE 2: every row scaled by grad_output[0]): exact zeros, negatives, tiny and large
    values (6e4 near fp16's max). The logits are confident sometimes, so large g times p - 1
    keeps a meaningful size."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m, min_m=2))
    x = draw(backgrounds((m, v)))
    targets = draw(_targets(m, v))
    if draw(st.booleans()) and v >= 2:
        x = representable(x, fmt)
        for i, t in enumerate(targets):
            x[i, t] = confident_target_logit(x[i], t, 0.999, fmt)
    rest = draw(st.sampled_from([1.0, 0.0, 2.0, 0.5]))
    g = np.full(m, rest)
    g = draw(with_overrides(g[None, :], st.sampled_from(_GRAD_SPECIALS)
                            | _finite(fmt, 1024.0), max_size=m))[0]
    if g[0] == rest:
        g[0] = draw(st.sampled_from([v_ for v_ in _GRAD_SPECIALS if v_ != rest]))
    return _finish_ce(draw, x, targets, fmt, "grad_output_nonuniform", strided, reduction="none", grad_output=g)


STRIDE_KINDS = ("column_slice", "transposed", "col_step", "row_pad")


@composite
def ce_strided_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Non-contiguous logits every time (REAL_BUGS CE 11): a column slice of a wider (padded
    vocabulary) buffer, transposed storage (a .t() of (V, N)), a stepped slice, a row stride
    padding; storage offsets of 0-9 elements for the logits and 0-3 for the int64 labels (odd: not
    16-byte aligned, REAL_BUGS CE 9), labels stepped sometimes. `strided` is ignored: the layout is
    the point."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m, min_n=2, min_m=2))
    kind = draw(_mode(STRIDE_KINDS))
    offset, tail = draw(st.integers(0, 9)), draw(st.integers(0, 8))
    if kind == "column_slice":  # logits[:, :V] of a (N, V + pad) buffer
        layout = Layout(row_pad=draw(st.sampled_from([1, 7, 64, 128 - v % 128])), offset=offset, tail=tail)
    elif kind == "transposed":
        layout = Layout(transposed=True, row_pad=draw(st.sampled_from([0, 1, 7])), offset=offset, tail=tail)
    elif kind == "col_step":
        layout = Layout(col_step=draw(st.sampled_from([2, 3])), offset=offset, tail=tail)
    else:
        layout = Layout(row_pad=draw(st.sampled_from([1, 3, 17])), offset=offset, tail=tail)
    x = draw(backgrounds((m, v), scale=draw(st.sampled_from([1.0, 4.0]))))
    lab = draw(st.integers(0, 3)), draw(st.sampled_from([1, 2]))
    return _finish_ce(draw, x, draw(_targets(m, v)), fmt, f"strided_rows/{kind}", True,
                      logits_layout=layout, label_layout=lab)


@composite
def vocab_shapes(draw, *, max_n: int, max_m: int = 2, big: bool = False) -> tuple[int, int]:
    """(N, V) of a long-vocabulary case: V near max_n (or a real vocabulary size that fits),
    N small; with `big`, V a real vocabulary size and N the rows that carry N * V past 2^31
    elements (int32 offsets overflow, REAL_BUGS CE 4): a GPU-only shape, drawn without tensors."""
    if big:
        v = draw(st.sampled_from([v for v in VOCABS if v <= max_n] or [max_n]))
        rows = INT32_LIMIT // v + 1
        return rows + draw(st.integers(0, 3)), v
    fits = [v for v in VOCABS if max_n // 2 <= v <= max_n]
    options = [st.integers(max(1, max_n // 2), max_n)] + ([st.sampled_from(fits)] if fits else [])
    return draw(st.integers(1, max_m)), draw(st.one_of(options))


def _big_logits(m: int, v: int, fmt: Format, seed: int) -> torch.Tensor:
    """(m, v) standard normal logits built on the device (m * v > 2^31: no float64 copy)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.empty((m, v), dtype=fmt.torch_dtype, device=DEVICE)
    for r in range(0, m, 1024):  # in slabs: no fp32 temporary of the whole
        x[r:r + 1024] = torch.randn((min(1024, m - r), v), generator=gen, device=DEVICE).to(fmt.torch_dtype)
    return x


@composite
def ce_long_vocab(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 2, strided: bool = False,
                  big: bool = False) -> Case:
    """Long vocabularies (V up to max_n: many chunks of an online logsumexp), with the peak and the
    target in the last, partial block sometimes. `big` (GPU only, off by default): N * V past 2^31
    elements, logits built on the device, the last row's target at its last column (its element
    offset is past 2^31) with a confident peak there."""
    fmt = format_of(dtype)
    m, v = draw(vocab_shapes(max_n=max_n, max_m=max_m, big=big))
    seed = draw(_seed())
    if big:
        x = _big_logits(m, v, fmt, seed)
        x[-1, v - 1] = 30.0
        targets = [int(t) for t in np.random.default_rng(seed).integers(0, v, m)]
        targets[-1] = v - 1
        kw = {"ignore_index": IGNORE_INDEX, "label_smoothing": 0.0, "reduction": draw(_mode(REDUCTIONS))}
        return Case(tensors={"logits": x, "target": labels(targets, guard=IGNORE_INDEX)}, kwargs=kw,
                    label="long_vocab/big")
    x = draw(backgrounds((m, v)))
    targets = draw(_targets(m, v))
    tail = draw(st.booleans())
    if tail:
        for i in range(m):
            x[i, v - 1] = 12.0
            targets[i] = v - 1
    return _finish_ce(draw, x, targets, fmt, f"long_vocab{'/tail_peak' if tail else ''}", strided)


@composite
def ce_softcap(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """A logit softcap c tanh(x / c) (Gemma 2) with |x / c| past 88 (tanh from exp(+-x/c) gives NaN,
    REAL_BUGS CE 12), +-inf logits (ordinary logits +-c under a cap, zero gradient), values near
    the format's max."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    c = draw(st.sampled_from([30.0, 15.0, 50.0, 1.0]))
    x = draw(backgrounds((m, v), scale=draw(st.sampled_from([10.0, 1.0, 100.0]))))
    specials = st.sampled_from([POS_INF, NEG_INF, 1.0e4, -1.0e4, fmt.max_finite, -fmt.max_finite, 89.0 * c])
    x = draw(with_overrides(x, specials, max_size=6))
    return _finish_ce(draw, x, draw(_targets(m, v)), fmt, "softcap", strided, extra={"softcap": c})


@composite
def ce_z_loss(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """A z-loss z lse^2 (PaLM; flash-attn's lse_square_scale) with a large lse (logits about +100
    or +1000: z lse^2 dominates and its gradient 2 z lse p_j cancels against p_t - 1)."""
    fmt = format_of(dtype)
    m, v = draw(_shape(max_n=max_n, max_m=max_m))
    z = draw(st.sampled_from([1.0e-4, 2.0**-10, 1.0e-3, 1.0]))
    loc = draw(st.sampled_from([0.0, 100.0, 1000.0]))
    x = draw(backgrounds((m, v), loc=loc))
    return _finish_ce(draw, x, draw(_targets(m, v)), fmt, f"z_loss/{loc:g}", strided, extra={"z_loss": z})


# The classes as records, in the order a union draws them (keep it). `needs` are kernel features.
_C = StrategyClass
CE_CLASS_RECORDS: tuple[StrategyClass, ...] = (
    _C("benign", ce_benign),
    _C("confident", ce_confident),
    _C("tied_maxima", ce_tied_maxima),
    _C("past_overflow", ce_past_overflow),
    _C("masked_vocab", ce_masked_vocab),
    _C("ignored_rows", ce_ignored_rows),
    _C("weighted", ce_weighted, frozenset({"weight"})),
    _C("smoothing_with_inf", ce_smoothing_with_inf, frozenset({"label_smoothing"})),
    _C("grad_output_nonuniform", ce_grad_output_nonuniform),
    _C("strided_rows", ce_strided_rows),
    _C("long_vocab", ce_long_vocab, in_union=False),
    _C("softcap", ce_softcap, frozenset({"softcap"})),
    _C("z_loss", ce_z_loss, frozenset({"z_loss"})),
)
CE_CLASSES = by_name(CE_CLASS_RECORDS)
#: The cross_entropy family's tables (flashcheck/families.py reads these names in every strategies module).
CLASS_RECORDS, CLASSES = CE_CLASS_RECORDS, CE_CLASSES
CE_CLASS_FEATURES: dict[str, frozenset] = {r.name: r.needs for r in CE_CLASS_RECORDS if r.needs}


def ce_classes_for(features: frozenset | set) -> tuple[str, ...]:
    """The cross-entropy classes a kernel with these features can be given."""
    return tuple(c for c in CE_CLASSES if CE_CLASS_FEATURES.get(c, frozenset()) <= set(features))


def cross_entropy_cases(*, dtype: torch.dtype | Format, max_n: int, strided: bool = True,
                        features: frozenset | set = frozenset()) -> SearchStrategy[Case]:
    """Any adversarial cross-entropy input a kernel with `features` takes (the union in_union)."""
    ok = set(ce_classes_for(features))
    return st.one_of([r.strategy(dtype=dtype, max_n=max_n, strided=strided) for r in CE_CLASS_RECORDS
                      if r.in_union and r.name in ok])


# ---- softmax backward / log-softmax backward -----------------------------------------------------
#
# y is the correctly rounded softmax of drawn logits (valid probability rows: nonnegative, summing
# to 1 within the rounding); logp the correctly rounded log-softmax of the same logits. dy is drawn
# per class. The same composites serve both tables (`out="y"` or "logp").

def _forward(logits: np.ndarray, fmt: Format, out: str) -> np.ndarray:
    x = representable(logits, fmt)
    return softmax_oracle(x, fmt) if out == "y" else log_softmax_oracle(x, fmt)


def _finish_bwd(draw, logits: np.ndarray, dy: np.ndarray, fmt: Format, label: str, strided: bool, out: str,
                layout_y: Layout | None = None, layout_dy: Layout | None = None) -> Case:
    if out not in ("y", "logp"):
        raise ValueError(f"out must be 'y' or 'logp', got {out!r}")
    ly = layout_y if layout_y is not None else draw(layouts(strided=strided))
    ld = layout_dy if layout_dy is not None else draw(layouts(strided=strided))
    fwd = _forward(logits, fmt, out)
    return Case(tensors={out: materialize(fwd, fmt, ly, DEVICE),
                         "dy": materialize(representable(dy, fmt), fmt, ld, DEVICE)}, label=label)


@composite
def bwd_benign(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True,
               out: str = "y") -> Case:
    """N(0, 1) logits times a scale (some entries -inf: exact zeros in y) and N(0, 1) dy."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    x = draw(backgrounds((m, n), scale=draw(st.sampled_from([1.0, 0.1, 4.0]))))
    if n > 1 and draw(st.booleans()):
        x[:, draw(st.integers(0, n - 2))] = NEG_INF  # never the last: no row fully masked
    dy = draw(with_overrides(draw(backgrounds((m, n))), _finite(fmt, 4.0)))
    return _finish_bwd(draw, x, dy, fmt, "benign", strided, out)


@composite
def bwd_confident(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True,
                  out: str = "y") -> Case:
    """One probability near 1 per row (a peak 8-30 above the rest): dy_i - sum y dy cancels at the
    peak (sum y dy ~ dy_peak), and the other outputs are tiny."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    x = draw(backgrounds((m, n), scale=draw(st.sampled_from([1.0, 0.1]))))
    gap = draw(st.sampled_from([12.0, 8.0, 20.0, 30.0]))
    for i in range(m):
        x[i, draw(st.integers(0, n - 1))] = gap
    dy = draw(backgrounds((m, n)))
    return _finish_bwd(draw, x, dy, fmt, "confident", strided, out)


DY_ZERO_KINDS = ("row", "some", "at_peak", "all_but_peak")


@composite
def bwd_dy_zeros(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True,
                 out: str = "y") -> Case:
    """dy with exact zeros: whole rows (dx exactly 0), scattered, at the row's peak, everywhere
    but the peak (dx_peak = y dy (1 - y) exactly: small)."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    kind = draw(_mode(DY_ZERO_KINDS))
    x = draw(backgrounds((m, n)))
    peak = np.argmax(x, axis=1)
    dy = draw(backgrounds((m, n)))
    rng = np.random.default_rng(draw(_seed()))
    for i in range(m):
        if kind == "row":
            dy[i] = 0.0
        elif kind == "some":
            dy[i, rng.random(n) < 0.5] = 0.0
        elif kind == "at_peak":
            dy[i, peak[i]] = 0.0
        else:
            keep = dy[i, peak[i]]
            dy[i] = 0.0
            dy[i, peak[i]] = keep
    return _finish_bwd(draw, x, dy, fmt, f"dy_zeros/{kind}", strided, out)


@composite
def bwd_large_dy(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True,
                 out: str = "y") -> Case:
    """|dy| large: 1e4, up to the format's max (sum y dy near overflow in the input format; an
    fp16 accumulator or dS stored in fp16 overflows, REAL_BUGS attention 12/tutorial)."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    x = draw(backgrounds((m, n), scale=draw(st.sampled_from([1.0, 4.0]))))
    top = fmt.max_finite / 2.0
    scale = draw(st.sampled_from([1.0e4, top, 6.0e4 if fmt != FP16 else 3.0e4, 1.0e30 if fmt != FP16 else 1.0e4]))
    dy = np.clip(draw(backgrounds((m, n), scale=scale)), -top, top)
    return _finish_bwd(draw, x, dy, fmt, "large_dy", strided, out)


@composite
def bwd_near_constant_dy(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4,
                         strided: bool = True, out: str = "y") -> Case:
    """dy = c + a few ulps of c: dy_i - sum_j y_j dy_j cancels to a few ulps of c (the exact result
    is tiny, a kernel's rounding of the sum shows at full size)."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    x = draw(backgrounds((m, n), scale=draw(st.sampled_from([1.0, 4.0]))))
    c = draw(st.sampled_from([1.0, 3.0, -7.0, 1000.0, 0.1]))
    u = float(ulp_of(np.array([c]), fmt)[0])
    k = np.asarray(draw(backgrounds((m, n))) * draw(st.sampled_from([0.0, 1.0, 4.0]))).round()
    dy = c + k * u
    return _finish_bwd(draw, x, dy, fmt, "near_constant_dy", strided, out)


@composite
def bwd_strided(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True,
                out: str = "y") -> Case:
    """y (or logp) and dy in different non-contiguous layouts (REAL_BUGS CE 11: a transposed input
    off by 0.30, a row stride ignored): a kernel reading dy with y's strides is wrong."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2, min_m=2))
    x = draw(backgrounds((m, n)))
    dy = draw(backgrounds((m, n)))
    pick = st.sampled_from([Layout(row_pad=7, offset=1), Layout(transposed=True, offset=3),
                            Layout(col_step=2, offset=5, tail=3), Layout(transposed=True, row_pad=1)])
    ly = draw(pick)
    ld = draw(pick.filter(lambda lay: lay != ly))
    return _finish_bwd(draw, x, dy, fmt, "strided", True, out, layout_y=ly, layout_dy=ld)


_BWD = (
    ("benign", bwd_benign),
    ("confident", bwd_confident),
    ("dy_zeros", bwd_dy_zeros),
    ("large_dy", bwd_large_dy),
    ("near_constant_dy", bwd_near_constant_dy),
    ("strided", bwd_strided),
)


def _logp_variant(fn: Callable[..., SearchStrategy[Case]]) -> Callable[..., SearchStrategy[Case]]:
    """`fn` drawing "logp" instead of "y" (same draws, same shrinking)."""
    def variant(*, dtype, **kw):
        return fn(dtype=dtype, out="logp", **kw)
    variant.__name__ = variant.__qualname__ = fn.__name__.replace("bwd_", "logp_bwd_")
    variant.__doc__ = fn.__doc__
    return variant


SOFTMAX_BACKWARD_CLASS_RECORDS: tuple[StrategyClass, ...] = tuple(_C(n, f) for n, f in _BWD)
SOFTMAX_BACKWARD_CLASSES = by_name(SOFTMAX_BACKWARD_CLASS_RECORDS)
LOG_SOFTMAX_BACKWARD_CLASS_RECORDS: tuple[StrategyClass, ...] = tuple(_C(n, _logp_variant(f)) for n, f in _BWD)
LOG_SOFTMAX_BACKWARD_CLASSES = by_name(LOG_SOFTMAX_BACKWARD_CLASS_RECORDS)

# Log-softmax forward takes exactly a softmax's inputs: the softmax tables themselves (tensor "x").
LOG_SOFTMAX_CLASS_RECORDS = _SOFTMAX_RECORDS
LOG_SOFTMAX_CLASSES = _SOFTMAX_CLASSES

__all__ = [
    "CLASS_RECORDS", "CLASSES", "CE_CLASS_RECORDS", "CE_CLASSES", "CE_CLASS_FEATURES", "ce_classes_for", "cross_entropy_cases",
    "SOFTMAX_BACKWARD_CLASS_RECORDS", "SOFTMAX_BACKWARD_CLASSES",
    "LOG_SOFTMAX_BACKWARD_CLASS_RECORDS", "LOG_SOFTMAX_BACKWARD_CLASSES",
    "LOG_SOFTMAX_CLASS_RECORDS", "LOG_SOFTMAX_CLASSES",
    "confident_target_logit", "labels", "vocab_shapes", "CONFIDENT", "INT32_LIMIT",
    *[f.__name__ for _, f in _BWD], *[r.strategy.__name__ for r in CE_CLASS_RECORDS],
]
