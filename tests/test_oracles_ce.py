"""Cross-entropy, log-softmax and softmax-backward oracles (oracles/log_softmax.py,
oracles/cross_entropy.py): agreement with float64 torch, hand-computed and special cases,
correct rounding against mpmath at 200 bits, exact identities, and the fused-kernel bounds.

No kernel is involved; everything is seeded and small (one core, well under a minute)."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashcheck.oracles import BF16, FP16, FP32, Format, round_float64, round_fraction, round_mpf, ulp_distance
from flashcheck.oracles.ball import Ball
from flashcheck.oracles.cross_entropy import (
    _Config,
    cross_entropy_grad_bound,
    cross_entropy_grad_oracle,
    cross_entropy_loss_bound,
    cross_entropy_oracle,
)
from flashcheck.oracles.log_softmax import (
    log_softmax_backward_oracle,
    log_softmax_oracle,
    softmax_backward_oracle,
)

FMTS = [FP16, BF16, FP32]
IDS = [f.name for f in FMTS]
INF, NAN = math.inf, math.nan


def same(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def rounds_within(oracle, ref, fmt: Format, rel: float = 2.0**-44, abs_: float = 0.0) -> bool:
    """The oracle is the rounding of some value within rel |ref| + abs_ of float64 torch's ref."""
    o, r = np.asarray(oracle, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(r)
    inf = np.isinf(r)
    if not np.array_equal(np.isnan(o), np.isnan(r)) or not np.array_equal(o[inf], r[inf]):
        return False
    tol = rel * np.abs(r[fin]) + abs_
    lo, hi = round_float64(r[fin] - tol, fmt), round_float64(r[fin] + tol, fmt)
    return bool(((lo <= o[fin]) & (o[fin] <= hi)).all())


def torch_ce(x, t, *, grad_output=None, z_loss=0.0, softcap=None, **kw):
    """float64 torch reference: softcap and z-loss composed around F.cross_entropy."""
    xd = torch.as_tensor(x).double().detach().requires_grad_()
    xs = softcap * torch.tanh(xd / softcap) if softcap else xd
    red = kw.pop("reduction", "mean")
    if "weight" in kw and kw["weight"] is not None:
        kw["weight"] = torch.as_tensor(kw["weight"]).double()
    per = F.cross_entropy(xs, t, reduction="none", **kw)
    ign = t == kw.get("ignore_index", -100)
    if z_loss:
        per = per + torch.where(ign, 0.0, z_loss * torch.logsumexp(xs, -1) ** 2)
    if red == "none":
        loss = per
    elif red == "sum":
        loss = per.sum()
    else:
        w = kw.get("weight")
        den = (~ign).sum() if w is None else w[t.clamp(min=0)][~ign].sum()
        loss = per.sum() / den
    g = torch.ones_like(loss) if grad_output is None else torch.as_tensor(grad_output).double()
    loss.backward(g)
    return loss.detach().numpy(), xd.grad.numpy()


# ---- agreement with float64 torch on random inputs ----------------------------------------------


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_log_softmax_and_backwards_match_float64_torch(fmt: Format) -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, 33, generator=g) * 3).to(fmt.torch_dtype)
    ref = torch.log_softmax(x.double(), -1).numpy()
    assert rounds_within(log_softmax_oracle(x, fmt), ref, fmt)
    y = torch.softmax(x.double(), -1).to(fmt.torch_dtype)
    dy = torch.randn(6, 33, generator=g).to(fmt.torch_dtype)
    ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64).numpy()
    assert rounds_within(softmax_backward_oracle(y, dy, fmt), ref, fmt, abs_=2.0**-50)
    lp = torch.log_softmax(x.double(), -1).to(fmt.torch_dtype)
    ref = torch._log_softmax_backward_data(dy.double(), lp.double(), -1, torch.float64).numpy()
    assert rounds_within(log_softmax_backward_oracle(lp, dy, fmt), ref, fmt, abs_=2.0**-48)


CE_OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"reduction": "sum", "weight": "w"},
    {"reduction": "none", "label_smoothing": 0.25, "weight": "w"},
    {"z_loss": 1e-3, "softcap": 7.0},
    {"reduction": "none", "z_loss": 0.5, "label_smoothing": 0.05},
]


@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: "-".join(f"{k}" for k in o) or "plain")
@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_cross_entropy_matches_float64_torch(fmt: Format, opts: dict) -> None:
    g = torch.Generator().manual_seed(2)
    N, V = 5, 24
    x = (torch.randn(N, V, generator=g) * 4).to(fmt.torch_dtype)
    t = torch.randint(0, V, (N,), generator=g)
    t[2] = -100
    kw = dict(opts)
    if kw.get("weight") == "w":
        kw["weight"] = torch.rand(V, generator=g).to(fmt.torch_dtype)
    go = torch.randn(N, generator=g).double() if kw.get("reduction") == "none" else torch.tensor(0.75).double()
    loss, grad = torch_ce(x, t, grad_output=go, **dict(kw))
    assert rounds_within(cross_entropy_oracle(x, t, fmt, **kw), loss, fmt, rel=2.0**-40)
    got = cross_entropy_grad_oracle(x, t, fmt, go.numpy(), **kw)
    assert rounds_within(got, grad, fmt, rel=2.0**-40, abs_=2.0**-46)
    assert (got[2] == 0).all()


# ---- hand-computed and special cases ------------------------------------------------------------


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_ties_and_single_class(fmt: Format) -> None:
    x = torch.zeros(1, 4)
    assert same(cross_entropy_grad_oracle(x, torch.tensor([0]), fmt), [[-0.75, 0.25, 0.25, 0.25]])
    assert same(cross_entropy_oracle(x, torch.tensor([1]), fmt), round_mpf(mpmath.log(4), fmt))
    assert same(log_softmax_oracle(x, fmt), np.full((1, 4), round_mpf(-mpmath.log(4), fmt)))
    # uniform smoothing over a tie row: p = q exactly, gradient exactly 0
    assert same(cross_entropy_grad_oracle(x, torch.tensor([2]), fmt, label_smoothing=1.0), np.zeros((1, 4)))
    one = torch.tensor([[3.5]])
    assert same(cross_entropy_oracle(one, torch.tensor([0]), fmt, label_smoothing=0.5), 0.0)
    assert same(cross_entropy_grad_oracle(one, torch.tensor([0]), fmt, label_smoothing=0.5), [[0.0]])
    assert same(cross_entropy_oracle(one, torch.tensor([0]), fmt, z_loss=0.25), round_float64(0.25 * 3.5**2, fmt))
    assert same(log_softmax_oracle(torch.tensor([[2.0, -INF]]), fmt), [[0.0, -INF]])


SPECIAL_ROWS = [  # (row, target, kwargs): every special value the contract names
    ([-INF, 1.0, 2.0], 0, {}),                      # target at -inf: loss inf, gradient finite
    ([-INF, 1.0, 2.0], 1, {}),                      # masked column: p = 0 exactly
    ([-INF, 1.0, 2.0], 1, {"label_smoothing": 0.1}),  # smoothing meets -inf: loss inf
    ([-INF, 1.0, 2.0], 1, {"label_smoothing": 0.1, "weight": [0.0, 1.0, 2.0]}),  # 0 * inf: NaN
    ([-INF, 1.0, 2.0], 0, {"weight": [0.0, 1.0, 1.0], "reduction": "none"}),     # 0 * inf: NaN
    ([-INF, 1.0, 2.0], 0, {"label_smoothing": 1.0}),  # (1 - 1) * inf: NaN
    ([-INF, -INF, -INF], 0, {}),
    ([INF, 1.0, 2.0], 1, {}),
    ([NAN, 1.0, 2.0], 1, {"label_smoothing": 0.2}),
    ([INF, -INF, 0.0], 2, {}),
]


@pytest.mark.parametrize("row,target,kw", SPECIAL_ROWS)
def test_special_values_match_torch(row, target, kw) -> None:
    x, t = torch.tensor([row], dtype=torch.float32), torch.tensor([target])
    kw = dict(kw)
    if "weight" in kw:
        kw["weight"] = torch.tensor(kw["weight"])
    loss, grad = torch_ce(x, t, **dict(kw))
    assert rounds_within(cross_entropy_oracle(x, t, FP32, **kw), loss, FP32)
    assert rounds_within(cross_entropy_grad_oracle(x, t, FP32, **kw), grad, FP32, abs_=2.0**-50)
    assert rounds_within(log_softmax_oracle(x, FP32), torch.log_softmax(x.double(), -1).numpy(), FP32)


def test_softcap_turns_infinities_into_the_cap() -> None:
    x, t = torch.tensor([[INF, -INF, 0.5, 3.0]]), torch.tensor([2])
    loss, grad = torch_ce(x, t, softcap=2.0, reduction="sum")
    got = cross_entropy_oracle(x, t, FP32, softcap=2.0, reduction="sum")
    assert np.isfinite(loss) and rounds_within(got, loss, FP32)
    got = cross_entropy_grad_oracle(x, t, FP32, softcap=2.0, reduction="sum")
    assert got[0, 0] == 0 and got[0, 1] == 0 and rounds_within(got, grad, FP32, abs_=2.0**-50)


def test_ignored_rows_and_empty_mean() -> None:
    x = torch.tensor([[NAN, 1.0], [INF, 0.0], [-INF, -INF], [0.0, 1.0]])
    t = torch.tensor([0, 7, 7, 1])
    loss = cross_entropy_oracle(x, t, FP32, ignore_index=7, reduction="none")
    assert same(loss[:3], [NAN, 0.0, 0.0])  # row 0 counts (a NaN row), rows 1 and 2 are ignored
    t = torch.tensor([-100, -100, -100, 1])
    grad = cross_entropy_grad_oracle(x, t, FP32)
    assert same(grad[:3], np.zeros((3, 2)))  # ignored rows are never read (torch: NaN here, see docs)
    assert same(cross_entropy_oracle(x, t, FP32, reduction="none")[:3], [0.0, 0.0, 0.0])
    t = torch.full((4,), -100)
    assert math.isnan(cross_entropy_oracle(x, t, FP32))  # mean over no target: NaN, as torch
    assert cross_entropy_oracle(x, t, FP32, reduction="sum") == 0.0
    assert same(cross_entropy_grad_oracle(x, t, FP32), np.zeros((4, 2)))
    # weight 0 on every counted target: mean NaN, gradient NaN on those rows (torch)
    w = torch.tensor([1.0, 0.0])
    t = torch.tensor([-100, -100, -100, 1])
    assert math.isnan(cross_entropy_oracle(x, t, FP32, weight=w))
    assert np.isnan(cross_entropy_grad_oracle(x, t, FP32, weight=w)[3]).all()


def test_out_of_range_target_raises() -> None:
    with pytest.raises(ValueError, match=r"target 4 of row 1 is outside \[0, 4\)"):
        cross_entropy_oracle(torch.zeros(2, 4), torch.tensor([0, 4]), FP32)
    with pytest.raises(ValueError, match="target -1"):
        cross_entropy_grad_oracle(torch.zeros(2, 4), torch.tensor([-1, 0]), FP32)


# ---- confident logits: cancellation torch fp32 gets wrong ---------------------------------------


def _mp_ce(row, t, prec=200):
    with mpmath.workprec(prec):
        xs = [mpmath.mpf(float(v)) for v in row]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))
        p = [mpmath.exp(v - lse) for v in xs]
        return lse - xs[t], [p[j] - (1 if j == t else 0) for j in range(len(xs))]


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_confident_logits(fmt: Format) -> None:
    row = [14.0 if fmt == FP16 else 24.0] + [0.0] * 7 + [-3.0]  # loss 6e-6 / 3e-10: above fp16's subnormals
    x = torch.tensor([row]).to(fmt.torch_dtype)
    t = torch.tensor([0])
    loss_mp, grad_mp = _mp_ce(row, 0)
    loss = cross_entropy_oracle(x, t, fmt)
    grad = cross_entropy_grad_oracle(x, t, fmt)
    assert loss == round_mpf(loss_mp, fmt) and loss > 0
    assert grad[0, 0] == round_mpf(grad_mp[0], fmt) and grad[0, 0] < 0
    assert same(grad[0], [round_mpf(v, fmt) for v in grad_mp])
    # torch in fp32 loses it: lse - x_t cancels (at 24 the loss and the true-class gradient are 0)
    xf = x.float().requires_grad_()
    lf = F.cross_entropy(xf, t)
    lf.backward()
    assert abs(lf.item() - float(loss_mp)) > 1e-3 * float(loss_mp)
    assert abs(xf.grad[0, 0].item() - float(grad_mp[0])) > 1e-3 * abs(float(grad_mp[0]))
    lsm = log_softmax_oracle(x, fmt)[0, 0]
    assert lsm == round_mpf(-loss_mp, fmt) and lsm < 0


# ---- correct rounding against mpmath at 200 bits ------------------------------------------------


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_correct_rounding_against_mpmath(fmt: Format) -> None:
    rng = np.random.default_rng(5)
    rows = round_float64(rng.standard_normal((3, 9)) * np.array([[1.0], [8.0], [30.0]]), fmt)
    targets = [2, 0, 8]
    x = torch.from_numpy(rows)
    loss = cross_entropy_oracle(x, torch.tensor(targets), fmt, reduction="none")
    grad = cross_entropy_grad_oracle(x, torch.tensor(targets), fmt, np.ones(3), reduction="none")
    lsm = log_softmax_oracle(x, fmt)
    for i, t in enumerate(targets):
        l_mp, g_mp = _mp_ce(rows[i], t)
        assert loss[i] == round_mpf(l_mp, fmt)
        assert same(grad[i], [round_mpf(v, fmt) for v in g_mp])
        with mpmath.workprec(200):
            lse = mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(v)) for v in rows[i]))
            assert same(lsm[i], [round_mpf(mpmath.mpf(v) - lse, fmt) for v in rows[i]])
    # log-softmax backward at 200 bits, softmax backward as exact fractions
    lp, dy = rows[1] - 30.0, rows[2]
    got = log_softmax_backward_oracle(lp[None], dy[None], fmt)[0]
    with mpmath.workprec(200):
        s = mpmath.fsum(mpmath.mpf(v) for v in dy)
        assert same(got, [round_mpf(mpmath.mpf(d) - mpmath.exp(mpmath.mpf(q)) * s, fmt) for q, d in zip(lp, dy)])
    y = np.abs(rows[0]) / 8
    s = sum(Fraction(a) * Fraction(b) for a, b in zip(y, dy))
    exact = [Fraction(a) * (Fraction(b) - s) for a, b in zip(y, dy)]
    from flashcheck.oracles import round_fraction
    assert same(softmax_backward_oracle(y[None], dy[None], fmt)[0], [round_fraction(q, fmt) for q in exact])


# ---- exact identities -----------------------------------------------------------------------


def test_gradient_rows_sum_to_zero_before_rounding() -> None:
    """sum_j (p_j - onehot_j) = 0 exactly: the exact gradients' balls at 200 bits sum to a ball
    holding 0 of radius below 2^-150 (smoothing without weights keeps it: sum q = 1)."""
    rng = np.random.default_rng(7)
    x = round_float64(rng.standard_normal((3, 17)) * 5, FP32)
    x[1, 3] = -INF
    for kw in ({}, {"label_smoothing": 0.3}):
        cfg = _Config(x, np.array([4, 0, 16]), ignore_index=-100, reduction="sum", weight=None,
                      z_loss=0.0, softcap=None, label_smoothing=kw.get("label_smoothing", 0.0))
        for i in range(3):
            tot = Ball(mpmath.mpf(0)._mpf_)
            for j in range(17):
                q = cfg.grad_fraction(i, j, Fraction(1))
                b = Ball.fraction(q, 200) if q is not None else cfg.grad_ball(i, j, Fraction(1), 200)
                tot = tot.add(b, 400)
            m, r = (mpmath.mp.make_mpf(v) for v in (tot.m, tot.r))
            assert abs(m) <= r < mpmath.mpf(2) ** -150


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_shift_and_layout_invariance(fmt: Format) -> None:
    g = torch.Generator().manual_seed(3)
    k = torch.randint(-64, 64, (4, 19), generator=g).double() / 8  # k and k + 16: exact in bf16 too
    x = k.to(fmt.torch_dtype)
    xs = (k + 16).to(fmt.torch_dtype)
    t = torch.tensor([0, 5, 18, -100])
    for kw in ({}, {"label_smoothing": 0.2, "reduction": "none"}):
        assert same(cross_entropy_oracle(x, t, fmt, **kw), cross_entropy_oracle(xs, t, fmt, **kw))
        assert same(cross_entropy_grad_oracle(x, t, fmt, **({"grad_output": np.ones(4)} if kw else {}), **kw),
                    cross_entropy_grad_oracle(xs, t, fmt, **({"grad_output": np.ones(4)} if kw else {}), **kw))
    assert same(log_softmax_oracle(x, fmt), log_softmax_oracle(xs, fmt))
    # strided views: a transposed buffer, a column step, a storage offset
    buf = torch.zeros(19, 9, dtype=fmt.torch_dtype)
    buf[:, 1:9:2] = x.t()
    view = buf.t()[1:9:2]
    assert not view.is_contiguous()
    assert same(log_softmax_oracle(view, fmt), log_softmax_oracle(x, fmt))
    assert same(cross_entropy_oracle(view, t, fmt), cross_entropy_oracle(x, t, fmt))


# ---- fused-kernel bounds -----------------------------------------------------------------------


def _chunked_fp32_kernel(x: np.ndarray, t: np.ndarray, n_chunks: int):
    """The modelled kernel in float32 NumPy: online (m, l) over chunks, pairwise sums in a chunk,
    loss = lse - x_t, grad = exp(x - lse) - onehot."""
    x = x.astype(np.float32)
    N, V = x.shape
    block = -(-V // n_chunks)
    m = np.full(N, -np.inf, np.float32)
    l = np.zeros(N, np.float32)
    for c in range(n_chunks):
        ch = x[:, c * block:(c + 1) * block]
        if ch.shape[1] == 0:
            continue
        mn = np.maximum(m, ch.max(axis=1))
        e = np.exp(ch - mn[:, None])
        while e.shape[1] > 1:
            h = e.shape[1] // 2
            e = np.concatenate([e[:, :h] + e[:, h:2 * h], e[:, 2 * h:]], axis=1)
        l = l * np.exp(m - mn) + e[:, 0]
        m = mn
    lse = m + np.log(l)
    loss = lse - x[np.arange(N), t]
    grad = np.exp(x - lse[:, None])
    grad[np.arange(N), t] -= np.float32(1)
    return loss.astype(np.float64), grad.astype(np.float64)


@pytest.mark.parametrize("n_chunks", [1, 4])
def test_chunked_fp32_kernel_within_bounds(n_chunks: int) -> None:
    rng = np.random.default_rng(9)
    x = round_float64(rng.standard_normal((4, 64)) * np.array([[1.0], [6.0], [20.0], [1.0]]), FP32)
    x[3, 5] = 30.0  # confident row: the kernel's loss and true-class gradient cancel
    t = np.array([1, 7, 63, 5])
    loss_k, grad_k = _chunked_fp32_kernel(x, t, n_chunks)
    lo = cross_entropy_oracle(x, t, FP32, reduction="none")
    lb = cross_entropy_loss_bound(x, t, FP32, n_chunks, oracle=lo)
    assert (np.abs(loss_k - lo) <= lb).all() and (lb < 1e-4).all()
    go = cross_entropy_grad_oracle(x, t, FP32, reduction="sum")
    gb = cross_entropy_grad_bound(x, t, FP32, n_chunks, oracle=go)
    assert (np.abs(grad_k - go) <= gb).all()
    # the 16-bit outputs of the same fp32 values: one more rounding, one ulp more at most
    for fmt in (FP16, BF16):
        o16 = cross_entropy_oracle(x, t, fmt, reduction="none")
        b16 = cross_entropy_loss_bound(x, t, fmt, n_chunks, oracle=o16)
        assert (np.abs(round_float64(loss_k, fmt) - o16) <= b16).all()
    assert ulp_distance(round_float64(loss_k[:3], FP32), lo[:3], FP32).max() < 64


def test_vocabulary_of_4096() -> None:
    """A row of a few thousand classes stays cheap (about 0.3 ms an element) and agrees."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 4096, generator=g) * 3).to(torch.bfloat16)
    t = torch.tensor([123])
    loss, grad = torch_ce(x, t, label_smoothing=0.1)
    assert rounds_within(cross_entropy_oracle(x, t, BF16, label_smoothing=0.1), loss, BF16, rel=2.0**-40)
    assert rounds_within(cross_entropy_grad_oracle(x, t, BF16, label_smoothing=0.1), grad, BF16,
                         rel=2.0**-40, abs_=2.0**-50)


def test_a_negligible_rest_beside_a_midpoint_is_decided() -> None:
    """Every entry but the max more than 8192 below it: L = log1p(T) is positive and below any working
    precision, so beside an exact x_j - x_m on a rounding midpoint Ziv's loop never decided (the
    log_softmax suite's huge_magnitude class found this bf16 row); the value rounds as the difference
    nudged toward -inf (toward +inf for the loss, lse - x_t)."""
    x = torch.tensor([[-5.1175e37, -9.5040e37, -1.4455e37]], dtype=torch.bfloat16)
    vals = [Fraction(float(v)) for v in x[0].float()]
    out = log_softmax_oracle(x, BF16)[0]
    for j, v in enumerate(vals):
        d = v - vals[2]
        assert out[j] == round_fraction(d - Fraction(1, 2**300), BF16), (j, out[j])
    midpoints = [j for j, v in enumerate(vals) if round_fraction(v - vals[2] + Fraction(1, 2**300), BF16)
                 != round_fraction(v - vals[2] - Fraction(1, 2**300), BF16)]
    assert midpoints, "the row no longer holds a midpoint: the test lost its point"
    for t in range(3):
        loss = cross_entropy_oracle(x, torch.tensor([t]), BF16, reduction="none")[0]
        assert loss == round_fraction(vals[2] - vals[t] + Fraction(1, 2**300), BF16)
    assert np.isfinite(cross_entropy_oracle(x.repeat(2, 1), torch.tensor([0, 1]), BF16, reduction="sum"))


def test_a_masked_column_beside_a_single_kept_entry() -> None:
    """A row [0, -inf]: one kept entry (lse = 0 exactly); its -inf column is no rational (it raised)."""
    x = torch.tensor([[0.0, float("-inf")]])
    assert cross_entropy_oracle(x, torch.tensor([0]), FP32, reduction="none")[0] == 0.0
    assert cross_entropy_oracle(x, torch.tensor([1]), FP32, reduction="none")[0] == math.inf
def test_a_target_alone_among_neg_inf_logits_has_loss_zero() -> None:
    # Fraction(-inf) was taken of every entry, the target's alone matters without smoothing
    x, t = torch.tensor([[0.0, -math.inf], [-math.inf, 3.0]]), torch.tensor([0, 1])
    assert cross_entropy_oracle(x, t, "fp32", reduction="none").tolist() == [0.0, 0.0]
    assert cross_entropy_oracle(x, t, "bf16", reduction="mean") == 0.0


def test_log_softmax_below_an_exact_midpoint_is_decided() -> None:
    # x_j - x_m exactly an fp32 midpoint, the other terms past exp(-1e16): Ziv's loop cannot see
    # L > 0 at any precision; the value is strictly below the midpoint, so it rounds down
    h = float.fromhex
    row = [0, h("0x1.433bap+54"), -h("0x1.7942bp+55"), 0, -h("0x1.e94adcp+54"), 0, -h("0x1.c8633ep+55"), -0.0,
           h("0x1.86330cp+54"), -1.5]
    x = torch.tensor([row], dtype=torch.float32)
    got = log_softmax_oracle(x, "fp32")[0]
    from fractions import Fraction

    from flashcheck.oracles.formats import FP32
    from flashcheck.oracles.rounding import round_fraction

    top = max(row)
    # every other term is below exp(-1e16): log p_j is d_j less a positive amount far below 2^-200
    want = [round_fraction(Fraction(v) - Fraction(top) - Fraction(1, 2**200), FP32) for v in row]
    mids = [k for k, v in enumerate(row) if float(np.float32(v - top)) != v - top]
    assert mids, "the row no longer has an entry whose d_j is not an fp32"
    assert [float(g) for k, g in enumerate(got) if row[k] != top] == [w for k, w in enumerate(want) if row[k] != top]
