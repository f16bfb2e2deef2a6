"""The training kernels of issue 52 against the correctly rounded oracles, within their derived bounds:
softmax backward, log-softmax forward and backward (kernels/softmax_backward.py, kernels/log_softmax.py;
bounds docs/NUMERICS.md 9.6) and the fused cross-entropy (kernels/cross_entropy.py; 9.4 for plain
cross-entropy, 9.7 with every option), on the adversarial classes of strategies/cross_entropy.py and
strategies/softmax.py and on hand cases: REAL_BUGS cross-entropy 1 and 2, special values, autograd,
inplace_backward, untouched inputs, one-line errors.

Under the interpreter every kernel call costs a fraction of a second, so shapes are small, chunks are
small (several per row), and each class draws a few derandomized examples: the file runs in well under
a minute on one core."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from flashcheck.kernels import DEVICE
from flashcheck.kernels.cross_entropy import ce_n_chunks, cross_entropy, cross_entropy_with_grad
from flashcheck.kernels.log_softmax import (
    log_softmax, log_softmax_backward, log_softmax_backward_chunked, log_softmax_backward_row,
    log_softmax_backward_split, log_softmax_depth, log_softmax_online, log_softmax_row,
)
from flashcheck.kernels.softmax import softmax, softmax_online
from flashcheck.kernels.softmax_backward import (
    backward_depth, softmax_backward, softmax_backward_chunked, softmax_backward_row, softmax_backward_split,
)
from flashcheck.oracles import (
    cross_entropy_full_grad_bound, cross_entropy_full_loss_bound, cross_entropy_grad_bound,
    cross_entropy_grad_oracle, cross_entropy_loss_bound, cross_entropy_oracle, format_of,
    log_softmax_backward_bound, log_softmax_backward_oracle, log_softmax_bound, log_softmax_oracle,
    softmax_backward_bound, softmax_backward_oracle,
)
from flashcheck.oracles.log_softmax import exact_values
from flashcheck.oracles.rounding import UndecidedRounding
from flashcheck.strategies import cross_entropy as ce
from flashcheck.strategies import softmax as sm

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FEW = settings(max_examples=6, database=None, derandomize=True, deadline=None,
               suppress_health_check=list(HealthCheck))
MAX_N = 40
BLOCK_V = 16  # cross-entropy chunks: up to 3 a row
# small blockings so that 40 columns take several chunks, spans and merge steps
VARIANTS = {"row": {}, "chunked": {"block_n": 16}, "split": {"block_n": 8, "chunks_per_block": 2, "merge_block": 2}}
BACKWARD = {False: {"row": softmax_backward_row, "chunked": softmax_backward_chunked, "split": softmax_backward_split},
            True: {"row": log_softmax_backward_row, "chunked": log_softmax_backward_chunked,
                   "split": log_softmax_backward_split}}


def assert_within(got: torch.Tensor, oracle, bound, what: str) -> None:
    """|got - oracle| <= bound elementwise; equal values (infinities, NaN with NaN, zeros) always pass."""
    r = np.asarray(oracle, dtype=np.float64)
    g = exact_values(got).reshape(r.shape)
    b = np.asarray(bound, dtype=np.float64).reshape(r.shape)
    with np.errstate(invalid="ignore"):
        ok = (g == r) | (np.isnan(g) & np.isnan(r)) | (np.abs(g - r) <= b)
    if not ok.all():
        i = tuple(int(k) for k in np.argwhere(~ok)[0])
        raise AssertionError(f"{what}: {int((~ok).sum())} element(s) outside the bound; first at {i}: kernel "
                             f"{g[i]!r}, oracle {r[i]!r}, bound {b[i]!r}")


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the buffer behind a view (its guard elements too)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def snapshot(*tensors) -> list:
    return [None if t is None else _storage_bytes(t).clone() for t in tensors]


def unchanged(before: list, *tensors) -> bool:
    """The inputs' whole buffers hold the bytes they held before the call."""
    return all(b is None or torch.equal(b, _storage_bytes(t)) for b, t in zip(before, tensors))


# ---- softmax backward, log-softmax backward -------------------------------------------------------

def _check_backward(case, dtype, variant: str, log: bool) -> None:
    a, dy = case.tensors["logp" if log else "y"], case.tensors["dy"]
    before = snapshot(a, dy)
    dx = BACKWARD[log][variant](a, dy, **VARIANTS[variant])
    assert unchanged(before, a, dy) and dx.dtype == dtype and dx.is_contiguous()
    depth = backward_depth(a.shape[1], variant, **VARIANTS[variant])
    if log:
        r = log_softmax_backward_oracle(a, dy, dtype)
        bound = log_softmax_backward_bound(a, dy, dtype, depth, oracle=r)
    else:
        r = softmax_backward_oracle(a, dy, dtype)
        bound = softmax_backward_bound(a, dy, dtype, depth, oracle=r)
    assert_within(dx, r, bound, f"{'log_' if log else ''}softmax_backward {variant} {case.label}")


@pytest.mark.parametrize("log,cls", [(False, c) for c in sorted(ce.SOFTMAX_BACKWARD_CLASSES)]
                         + [(True, c) for c in sorted(ce.LOG_SOFTMAX_BACKWARD_CLASSES)],
                         ids=lambda v: v if isinstance(v, str) else ("log_softmax" if v else "softmax"))
@FEW
@given(data=st.data())
def test_backward_classes(log: bool, cls: str, data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    table = ce.LOG_SOFTMAX_BACKWARD_CLASSES if log else ce.SOFTMAX_BACKWARD_CLASSES
    _check_backward(data.draw(table[cls](dtype=dtype, max_n=MAX_N, max_m=3)), dtype, variant, log=log)


# ---- log-softmax forward --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", sorted(ce.LOG_SOFTMAX_CLASSES))
@settings(FEW, max_examples=4)
@given(data=st.data())
def test_log_softmax_classes(cls: str, data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    online = data.draw(st.booleans(), label="online")
    case = data.draw(ce.LOG_SOFTMAX_CLASSES[cls](dtype=dtype, max_n=24 if cls == "elementwise" else 48, max_m=2))
    x = case.tensors["x"]
    before = snapshot(x)
    y = log_softmax_online(x, block_n=16) if online else log_softmax_row(x)
    assert unchanged(before, x) and y.dtype == dtype
    try:
        r = log_softmax_oracle(x, dtype)
    except UndecidedRounding:  # rows spread past ~45000: the oracle's ball of -log1p(T) straddles 0 (reported)
        return
    depth = log_softmax_depth(x.shape[1], "online", block_n=16) if online else log_softmax_depth(x.shape[1], "row")
    assert_within(y, r, log_softmax_bound(x, dtype, depth, oracle=r), f"log_softmax {case.label}")


# ---- cross-entropy --------------------------------------------------------------------------------

def _ce_call(case):
    kw = dict(case.kwargs)
    red = kw.pop("reduction")
    return (case.tensors["logits"], case.tensors["target"], case.tensors.get("weight"),
            case.tensors.get("grad_output"), red, kw)


def _oracle_grad_output(go, red: str, n: int):
    if go is None:
        return np.ones(n) if red == "none" else 1.0
    return exact_values(go)


def _check_ce(case, dtype) -> None:
    x, t, w, go, red, opts = _ce_call(case)
    before = snapshot(x, t, w, go)
    loss, grad = cross_entropy_with_grad(x, t, go, weight=w, reduction=red, block_v=BLOCK_V, **opts)
    assert unchanged(before, x, t, w, go) and loss.dtype == grad.dtype == dtype
    n_chunks, block = ce_n_chunks(x.shape[1], BLOCK_V)
    g = _oracle_grad_output(go, red, x.shape[0])
    rg = cross_entropy_grad_oracle(x, t, dtype, g, reduction=red, weight=w, **opts)
    assert_within(grad, rg, cross_entropy_full_grad_bound(x, t, dtype, n_chunks, block=block, grad_output=g, weight=w,
                                                          reduction=red, oracle=rg, **opts), f"grad {case.label}")
    try:
        ro = cross_entropy_oracle(x, t, dtype, reduction=red, weight=w, **opts)
    except OverflowError:  # the loss oracle on a row with one finite logit (reported): its gradient is checked
        ro = None
    if ro is not None:
        assert_within(loss, ro, cross_entropy_full_loss_bound(x, t, dtype, n_chunks, block=block, weight=w,
                                                              reduction=red, oracle=ro, **opts), f"loss {case.label}")
    if w is None and opts["label_smoothing"] == 0 and not opts.get("z_loss") and opts.get("softcap") is None:
        _check_plain_ce(x, t, opts["ignore_index"], dtype, n_chunks, block, grad, rg, red, g)


def _check_plain_ce(x, t, ignore_index: int, dtype, n_chunks: int, block: int, grad, rg, red: str, g) -> None:
    """Plain cross-entropy within NUMERICS 9.4's bounds too (the model's own, not ours)."""
    per_row = cross_entropy(x, t, reduction="none", ignore_index=ignore_index, block_v=BLOCK_V)
    try:
        lo = cross_entropy_oracle(x, t, dtype, reduction="none", ignore_index=ignore_index)
    except OverflowError:
        lo = None
    if lo is not None:
        assert_within(per_row, lo, cross_entropy_loss_bound(x, t, dtype, n_chunks, block=block, oracle=lo,
                                                            ignore_index=ignore_index), "loss (9.4)")
    if red != "none":  # one scale for every row: g, or g / (number of counted rows)
        div = int((t != ignore_index).sum()) if red == "mean" else 1
        if div:  # a mean over no row: NaN rows, exact (the 9.7 check above)
            scale = float(np.asarray(g).reshape(-1)[0]) / div
            assert_within(grad, rg,
                          cross_entropy_grad_bound(x, t, dtype, n_chunks, block=block, grad_scale=scale, oracle=rg,
                                                   ignore_index=ignore_index), "grad (9.4)")


@pytest.mark.parametrize("cls", sorted(ce.CE_CLASSES))
@settings(FEW, max_examples=5)
@given(data=st.data())
def test_cross_entropy_classes(cls: str, data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    max_n = 3 * BLOCK_V if cls == "long_vocab" else MAX_N
    _check_ce(data.draw(ce.CE_CLASSES[cls](dtype=dtype, max_n=max_n, max_m=3)), dtype)


@pytest.mark.parametrize("cls", ["grad_output_nonuniform", "confident", "smoothing_with_inf", "softcap"])
@settings(FEW, max_examples=3)
@given(data=st.data())
def test_cross_entropy_autograd_within_bound(cls: str, data: st.DataObject) -> None:
    """The autograd gradient (unit-scale gradient stored in the logits' dtype, then scaled by
    grad_output in place) within 9.7's `rescaled` bound; REAL_BUGS CE 2: each row its own factor."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    case = data.draw(ce.CE_CLASSES[cls](dtype=dtype, max_n=MAX_N, max_m=3))
    x, t, w, go, red, opts = _ce_call(case)
    xg = x.detach().clone().requires_grad_()
    loss = cross_entropy(xg, t, weight=w, reduction=red, block_v=BLOCK_V, **opts)
    loss.backward(torch.ones_like(loss) if go is None else go.to(loss.dtype).reshape(loss.shape))
    n_chunks, block = ce_n_chunks(x.shape[1], BLOCK_V)
    g = _oracle_grad_output(go, red, x.shape[0])
    rg = cross_entropy_grad_oracle(x, t, dtype, g, reduction=red, weight=w, **opts)
    assert_within(xg.grad, rg, cross_entropy_full_grad_bound(x, t, dtype, n_chunks, block=block, grad_output=g,
                                                             weight=w, reduction=red, rescaled=True, oracle=rg,
                                                             **opts), f"autograd {case.label}")


# ---- hand cases -----------------------------------------------------------------------------------

def _full_bounds(x, t, dtype, grad_output=1.0, **kw):
    n_chunks, block = ce_n_chunks(x.shape[1], kw.pop("block_v", BLOCK_V))
    red = kw.pop("reduction", "mean")
    ro = cross_entropy_oracle(x, t, dtype, reduction=red, **kw)
    rg = cross_entropy_grad_oracle(x, t, dtype, grad_output, reduction=red, **kw)
    return (ro, cross_entropy_full_loss_bound(x, t, dtype, n_chunks, block=block, reduction=red, oracle=ro, **kw),
            rg, cross_entropy_full_grad_bound(x, t, dtype, n_chunks, block=block, grad_output=grad_output,
                                              reduction=red, oracle=rg, **kw))


def test_confident_bf16_row_true_class_gradient() -> None:
    """REAL_BUGS CE 1: at softmax 0.999 the true class's gradient p_t - 1 ~ -1e-3 must keep its
    precision; a kernel that rounds p_t to bf16 before subtracting 1 is 100% off and outside the bound."""
    g = torch.Generator().manual_seed(5)
    row = exact_values(torch.randn(1, 37, generator=g).to(torch.bfloat16))
    row[0, 11] = ce.confident_target_logit(row[0], 11, 0.999, format_of(torch.bfloat16))
    x = torch.tensor(row, dtype=torch.bfloat16)
    t = torch.tensor([11])
    loss, grad = cross_entropy_with_grad(x, t, block_v=BLOCK_V)
    n_chunks, block = ce_n_chunks(37, BLOCK_V)
    rg = cross_entropy_grad_oracle(x, t, torch.bfloat16)
    bound = cross_entropy_grad_bound(x, t, torch.bfloat16, n_chunks, block=block, oracle=rg)
    assert_within(grad, rg, bound, "confident row, 9.4's bound")
    p_t = float(torch.softmax(x.double(), -1)[0, 11])
    assert 0.99 <= p_t <= 0.9999 and rg[0, 11] < 0
    buggy = float(torch.tensor(p_t).to(torch.bfloat16).double()) - 1.0  # p_t written through bf16 first
    assert abs(buggy - rg[0, 11]) > bound[0, 11]
    ro, lb, _, _ = _full_bounds(x, t, torch.bfloat16)
    assert_within(loss, ro, lb, "confident row loss")


def test_none_reduction_scales_each_row_by_its_own_grad_output() -> None:
    """REAL_BUGS CE 2: reduction="none" with grad_output [2, -0.5, 0, 6e4]: explicit and autograd."""
    g = torch.Generator().manual_seed(6)
    for dtype in DTYPES:
        x = (torch.randn(4, 29, generator=g) * 3).to(dtype)
        t = torch.tensor([3, 0, 28, 7])
        go = torch.tensor([2.0, -0.5, 0.0, 6.0e4], dtype=dtype)
        gnp = exact_values(go)
        _, grad = cross_entropy_with_grad(x, t, go, reduction="none", block_v=BLOCK_V)
        _, _, rg, gb = _full_bounds(x, t, dtype, gnp, reduction="none")
        assert_within(grad, rg, gb, f"explicit {dtype}")
        assert (grad[2] == 0).all()
        xg = x.clone().requires_grad_()
        cross_entropy(xg, t, reduction="none", block_v=BLOCK_V).backward(go)
        n_chunks, block = ce_n_chunks(29, BLOCK_V)
        assert_within(xg.grad, rg, cross_entropy_full_grad_bound(x, t, dtype, n_chunks, block=block, grad_output=gnp,
                                                                 reduction="none", rescaled=True, oracle=rg),
                      f"autograd {dtype}")
        wrong = rg[1] / gnp[1] * gnp[0]  # row 1 scaled by grad_output[0]
        assert not (np.abs(exact_values(xg.grad)[1] - wrong) <= gb[1]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
def test_all_ignored_batch(dtype) -> None:
    """torch: the mean over no counted row is NaN (0/0, pytorch #116349), the sum 0; the gradient of
    ignored rows is exactly 0 whatever they hold (NaN and inf here), also through autograd."""
    x = torch.tensor([[1.0, math.nan, 3.0], [math.inf, 0.0, -math.inf]], dtype=dtype)
    t = torch.tensor([-100, -100])
    for red, want in (("mean", math.nan), ("sum", 0.0)):
        loss, grad = cross_entropy_with_grad(x, t, reduction=red)
        assert np.array_equal(exact_values(loss), np.array(want), equal_nan=True) and (grad == 0).all()
    loss, grad = cross_entropy_with_grad(x, t, torch.ones(2), reduction="none")
    assert (loss == 0).all() and (grad == 0).all()
    xg = x.clone().requires_grad_()
    loss = cross_entropy(xg, t)
    loss.backward()
    assert math.isnan(float(loss.detach())) and (xg.grad == 0).all()


def test_neg_inf_target_and_special_rows_match_the_oracle() -> None:
    """NUMERICS 9.2: a -inf target logit gives loss +inf and a finite gradient (-1 at the target);
    rows with NaN, +inf or only -inf give NaN loss and gradient rows; with label smoothing any -inf
    logit makes the loss +inf; under a softcap infinities are ordinary logits of zero gradient."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([[-inf, 2.0, 3.0, 0.5], [1.0, nan, 0.0, 2.0], [1.0, inf, 0.0, 2.0], [-inf] * 4,
                      [0.25, -1.0, -inf, 4.0]])
    t = torch.tensor([0, 0, 1, 2, 3])
    for kw in ({}, {"label_smoothing": 0.1}, {"softcap": 2.0}, {"z_loss": 0.01, "label_smoothing": 0.5}):
        loss, grad = cross_entropy_with_grad(x, t, torch.ones(5), reduction="none", block_v=BLOCK_V, **kw)
        ro, lb, rg, gb = _full_bounds(x, t, torch.float32, np.ones(5), reduction="none", **kw)
        assert_within(loss, ro, lb, f"loss {kw}")
        assert_within(grad, rg, gb, f"grad {kw}")
    loss, grad = cross_entropy_with_grad(x, t, torch.ones(5), reduction="none")
    assert loss[0] == inf and grad[0, 0] == -1.0 and torch.isnan(loss[1:4]).all() and torch.isnan(grad[1:4]).all()


def test_huge_equal_logits_give_the_uniform_gradient() -> None:
    """A row of equal logits near 1e30: p = 1/V exactly. Through lse = m + L (which rounds to m) the
    gradient would be 1 - onehot, inside 9.4's bound (3u |m| ~ 1e23); the kernel forms x - m instead."""
    for dtype in DTYPES[1:]:
        x = torch.full((2, 8), 1.0e30).to(dtype)
        t = torch.tensor([3, 5])
        loss, grad = cross_entropy_with_grad(x, t, reduction="sum")
        assert np.array_equal(exact_values(grad), cross_entropy_grad_oracle(x, t, dtype, reduction="sum"))
        assert np.array_equal(exact_values(loss), cross_entropy_oracle(x, t, dtype, reduction="sum"))


def test_autograd_agrees_with_the_explicit_functions() -> None:
    """The autograd path launches what the explicit functions launch: the same bits."""
    g = torch.Generator().manual_seed(7)
    for dtype in DTYPES:
        x = (torch.randn(3, 37, generator=g) * 2).to(dtype)
        dy = torch.randn(3, 37, generator=g).to(dtype)
        for fwd, bwd in ((softmax, softmax_backward), (lambda v: softmax_online(v, block_n=16), softmax_backward),
                         (log_softmax, log_softmax_backward), (lambda v: log_softmax_online(v, block_n=16),
                                                               log_softmax_backward)):
            xg = x.clone().requires_grad_()
            y = fwd(xg)
            y.backward(dy)
            with torch.no_grad():
                plain = fwd(x)
            assert torch.equal(y.detach(), plain) and y.grad_fn is not None
            assert torch.equal(xg.grad, bwd(plain, dy))
        t = torch.tensor([0, 36, 5])
        for red in ("mean", "sum", "none"):
            xg = x.clone().requires_grad_()
            loss = cross_entropy(xg, t, reduction=red, label_smoothing=0.1, block_v=BLOCK_V)
            loss.backward(torch.ones_like(loss))
            want_loss, want_grad = cross_entropy_with_grad(x, t, reduction=red, label_smoothing=0.1, block_v=BLOCK_V)
            assert torch.equal(loss.detach(), want_loss) and torch.equal(xg.grad, want_grad)
            with pytest.raises(RuntimeError, match="once"):
                loss.backward(torch.ones_like(loss))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: format_of(d).name)
def test_inplace_backward_equals_out_of_place(dtype) -> None:
    """inplace_backward writes the same gradient into the logits' own buffer (a transposed view here)."""
    g = torch.Generator().manual_seed(8)
    base = (torch.randn(29, 3, generator=g) * 4).to(dtype)
    t = torch.tensor([1, 28, -100])
    go = torch.tensor([1.5, -2.0, 3.0], dtype=dtype)
    kw = dict(reduction="none", label_smoothing=0.2, softcap=5.0, z_loss=1e-3, block_v=BLOCK_V)
    loss, grad = cross_entropy_with_grad(base.t(), t, go, **kw)
    x = base.clone().t()
    loss2, grad2 = cross_entropy_with_grad(x, t, go, inplace_backward=True, **kw)
    assert grad2 is x and torch.equal(loss, loss2) and torch.equal(grad, x)
    a, b = base.clone().t().requires_grad_(), base.clone().t().requires_grad_()
    cross_entropy(a, t, **kw).backward(go)
    cross_entropy(b, t, inplace_backward=True, **kw).backward(go)
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_log_softmax_backward_sum_past_fp32_range(variant: str) -> None:
    """dy near fp32's max: sum dy overflows an fp32 accumulator; the kernels scale it by 2^-k."""
    dy = torch.tensor([[1.7e38, 1.6e38, -1.0e38, 1.5e38, 3.0], [1.0e-30, -2.0e-30, 3.0e-30, 1.0e-30, 0.0]])
    logp = torch.log_softmax(torch.tensor([[0.5, 1.0, -2.0, 0.0, 3.0], [1.0, 0.0, 0.0, -1.0, 2.0]]), -1)
    dx = BACKWARD[True][variant](logp, dy, **VARIANTS[variant])
    r = log_softmax_backward_oracle(logp, dy, torch.float32)
    depth = backward_depth(5, variant, **VARIANTS[variant])
    assert np.isfinite(r).all()
    assert_within(dx, r, log_softmax_backward_bound(logp, dy, torch.float32, depth, oracle=r), variant)


def test_empty_inputs() -> None:
    for m, n in ((0, 5), (3, 0)):
        a = torch.zeros(m, n)
        assert softmax_backward(a, a).shape == (m, n) and log_softmax_backward(a, a).shape == (m, n)
        assert log_softmax(a).shape == (m, n)
    x, t = torch.zeros(0, 7), torch.zeros(0, dtype=torch.long)
    assert math.isnan(float(cross_entropy(x, t))) and float(cross_entropy(x, t, reduction="sum")) == 0.0
    loss, grad = cross_entropy_with_grad(x, t, reduction="none")
    assert loss.shape == (0,) and grad.shape == (0, 7)


def _x(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


_T = torch.tensor([0, 1], device=DEVICE)
BAD = {
    "backward shape": (lambda: softmax_backward(_x(2, 3), _x(2, 4)), ValueError, "shape"),
    "backward dtype": (lambda: softmax_backward(_x(2, 3), _x(2, 3, dtype=torch.float16)), TypeError, "dtype"),
    "backward int": (lambda: softmax_backward(_x(2, 3, dtype=torch.int32), _x(2, 3, dtype=torch.int32)), TypeError,
                     "dtype"),
    "backward 1-D": (lambda: log_softmax_backward(_x(3), _x(3)), ValueError, "2-D"),
    "backward meta": (lambda: softmax_backward(torch.zeros(2, 3, device="meta"), _x(2, 3)), ValueError, "meta"),
    "backward row too long": (lambda: softmax_backward_row(_x(1, 40000), _x(1, 40000)), ValueError, "row kernel"),
    "backward block_n": (lambda: softmax_backward_chunked(_x(1, 4), _x(1, 4), block_n=3), ValueError, "block_n"),
    "log_softmax int": (lambda: log_softmax(_x(2, 3, dtype=torch.int64)), TypeError, "dtype"),
    "log_softmax 3-D": (lambda: log_softmax(_x(1, 2, 3)), ValueError, "2-D"),
    "log_softmax out= under autograd": (lambda: log_softmax_row(_x(2, 3).requires_grad_(), out=_x(2, 3)), ValueError,
                                        "autograd"),
    "ce 3-D logits": (lambda: cross_entropy(_x(2, 3, 4), _T), ValueError, "2-D"),
    "ce float target": (lambda: cross_entropy(_x(2, 3), _T.float()), TypeError, "int64"),
    "ce target shape": (lambda: cross_entropy(_x(2, 3), _T[:1]), ValueError, "shape"),
    "ce target out of range": (lambda: cross_entropy(_x(2, 3), torch.tensor([0, 3])), ValueError, "row 1"),
    "ce negative target": (lambda: cross_entropy(_x(2, 3), torch.tensor([-5, 0])), ValueError, "row 0"),
    "ce no classes": (lambda: cross_entropy(_x(2, 0), _T), ValueError, "V = 0"),
    "ce weight shape": (lambda: cross_entropy(_x(2, 3), _T, weight=_x(2)), ValueError, "weight"),
    "ce weight nan": (lambda: cross_entropy(_x(2, 3), _T, weight=torch.tensor([1.0, math.nan, 1.0])), ValueError,
                      "weight"),
    "ce reduction": (lambda: cross_entropy(_x(2, 3), _T, reduction="avg"), ValueError, "reduction"),
    "ce smoothing": (lambda: cross_entropy(_x(2, 3), _T, label_smoothing=1.5), ValueError, "label_smoothing"),
    "ce z_loss": (lambda: cross_entropy(_x(2, 3), _T, z_loss=-1.0), ValueError, "z_loss"),
    "ce softcap": (lambda: cross_entropy(_x(2, 3), _T, softcap=0.0), ValueError, "softcap"),
    "ce block_v": (lambda: cross_entropy(_x(2, 3), _T, block_v=24), ValueError, "block_v"),
    "ce ignore_index": (lambda: cross_entropy(_x(2, 3), _T, ignore_index=1.0), TypeError, "ignore_index"),
    "ce inplace on overlapping logits": (lambda: cross_entropy(_x(1, 3).expand(2, 3), _T, inplace_backward=True),
                                         ValueError, "inplace_backward"),
    "ce grad_output count": (lambda: cross_entropy_with_grad(_x(2, 3), _T, torch.ones(3), reduction="none"),
                             ValueError, "grad_output"),
    "ce grad_output inf": (lambda: cross_entropy_with_grad(_x(2, 3), _T, math.inf), ValueError, "finite"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_are_one_line_errors(case: str) -> None:
    call, exc, words = BAD[case]
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_dispatchers_reach_every_form(log: bool) -> None:
    """Past 512 columns the interpreter's dispatchers take the chunked form (4 rows: as many as 2 x
    its 2 SMs) or the split form (fewer rows); the bound takes the dispatcher's worst depth."""
    g = torch.Generator().manual_seed(9)
    for m, n in ((4, 600), (1, 700), (2, 100)):
        x = torch.randn(m, n, generator=g)
        y = (torch.log_softmax if log else torch.softmax)(x, -1)
        dy = torch.randn(m, n, generator=g)
        dx = (log_softmax_backward if log else softmax_backward)(y, dy)
        r = (log_softmax_backward_oracle if log else softmax_backward_oracle)(y, dy, torch.float32)
        bound = (log_softmax_backward_bound if log else softmax_backward_bound)(y, dy, torch.float32,
                                                                              backward_depth(n), oracle=r)
        assert_within(dx, r, bound, f"dispatcher {m}x{n}")
        if log:
            r = log_softmax_oracle(x, torch.float32)
            assert_within(log_softmax(x), r, log_softmax_bound(x, torch.float32, log_softmax_depth(n), oracle=r),
                          f"log_softmax {m}x{n}")


@settings(FEW, max_examples=2)
@given(data=st.data())
def test_long_vocabulary(data: st.DataObject) -> None:
    """Thousands of classes at the launcher's own chunk (128 under the interpreter): tens of chunks a
    walk, the peak and target in the last, partial chunk sometimes."""
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    case = data.draw(ce.CE_CLASSES["long_vocab"](dtype=dtype, max_n=8192, max_m=1))
    x, t, _, _, red, opts = _ce_call(case)
    loss, grad = cross_entropy_with_grad(x, t, reduction=red, **opts)
    ro, lb, rg, gb = _full_bounds(x, t, dtype, reduction=red, block_v=None, **opts)
    assert_within(loss, ro, lb, "long vocabulary loss")
    assert_within(grad, rg, gb, "long vocabulary grad")
