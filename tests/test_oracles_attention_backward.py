"""The attention backward oracle (oracles/attention_backward.py) and its kernel bound
(oracles/attention_backward_bound.py): docs/NUMERICS.md section 10.

Small shapes only (M, N <= 32, D <= 16, B * H <= 4): the whole file runs in seconds on one core.
Run with -s to see the kernel model's error/bound ratios."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from flashcheck.oracles.attention import effective_scale, visibility
from flashcheck.oracles.attention_backward import _ExactGroup, attention_backward_quantities
from flashcheck.oracles.attention_backward_bound import attention_backward_bound
from flashcheck.oracles.ball import ball_sum
from flashcheck.oracles.formats import BF16, FP32, format_of, round_float64, to_float64
from flashcheck.oracles.rounding import round_certified, round_mpf

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["fp16", "bf16", "fp32"]


def _inputs(seed, dtype, B=2, Hq=2, Hkv=1, M=7, N=9, D=8, Dv=5, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, M, D, generator=g) * spread).to(dtype)
    k = torch.randn(B, Hkv, N, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, N, Dv, generator=g).to(dtype)
    do = torch.randn(B, Hq, M, Dv, generator=g).to(dtype)
    return q, k, v, do


def _reference(q, k, v, do, *, causal=False, scale=None, kv_lens=None, window=None, softcap=None, attn_mask=None,
               causal_align="top_left"):
    """torch float64 autograd of the reference attention (safe softmax: empty rows give 0)."""
    B, Hq, M, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    G = Hq // Hkv
    sc = effective_scale(scale, D)
    qq, kk, vv = (torch.from_numpy(to_float64(x)).requires_grad_() for x in (q, k, v))
    y = sc * qq @ kk.repeat_interleave(G, 1).transpose(-1, -2)
    t = y
    if softcap:
        c = float(np.float32(softcap))
        t = c * torch.tanh(y / c)
    lens = [N] * B if kv_lens is None else list(kv_lens)
    vis = torch.stack([torch.from_numpy(visibility(M, N, min(lens[b], N), causal, window, causal_align))
                       for b in range(B)])[:, None].expand(B, Hq, M, N)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            vis = vis & attn_mask.expand(B, Hq, M, N)
        else:
            t = t + torch.from_numpy(to_float64(attn_mask)).expand(B, Hq, M, N)
            vis = vis & (attn_mask.expand(B, Hq, M, N) != -math.inf)
    t = t.masked_fill(~vis, -math.inf)
    mx = t.amax(-1, keepdim=True).detach()
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    e = torch.exp(t - mx)
    l = e.sum(-1, keepdim=True)
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    (p @ vv.repeat_interleave(G, 1)).backward(torch.from_numpy(to_float64(do)))
    return qq.grad.numpy(), kk.grad.numpy(), vv.grad.numpy()


OPTIONS = [
    dict(),
    dict(causal=True),
    dict(causal=True, causal_align="bottom_right"),
    dict(window=(2, 1)),
    dict(softcap=4.0),
    dict(kv_lens=[4, 9]),
    dict(scale=0.7),
    dict(attn_mask="bool"),
    dict(attn_mask="float"),
]


def _resolve(opts, B, Hq, M, N, seed):
    opts = dict(opts)
    g = torch.Generator().manual_seed(seed + 99)
    if opts.get("attn_mask") == "bool":
        m = torch.rand(B, Hq, M, N, generator=g) < 0.7
        m[0, 0, 1] = False  # a fully masked row
        opts["attn_mask"] = m
    elif opts.get("attn_mask") == "float":
        m = torch.randn(B, 1, M, N, generator=g) * 3
        m[..., 2] = -math.inf
        opts["attn_mask"] = m
    return opts


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}" for k in o) or "plain")
def test_matches_torch_float64_autograd(dtype, opts) -> None:
    q, k, v, do = _inputs(1, dtype, Hq=4, Hkv=2, D=8, Dv=5)  # GQA, Dv != D
    opts = _resolve(opts, 2, 4, 7, 9, 1)
    r = attention_backward_quantities(q, k, v, do, **opts)
    fmt = format_of(dtype)
    for approx, err, out, ref in zip((r.dq_approx, r.dk_approx, r.dv_approx), (r.dq_err, r.dk_err, r.dv_err),
                                     r.grads, _reference(q, k, v, do, **opts)):
        assert np.isfinite(ref).all()
        tol = 1e-13 * (np.abs(ref).max() + 1)
        assert np.abs(approx - ref).max() <= tol  # the two float64 evaluations agree
        assert np.all(np.abs(approx - ref) <= np.where(np.isfinite(err), err, 0) + tol)
        # Correctly rounded: torch's float64 value rounds the same, except within its noise of a boundary.
        near = round_float64(ref - tol, fmt) != round_float64(ref + tol, fmt)
        same = (round_float64(ref, fmt) == out) | near
        assert same.all(), np.argwhere(~same)
        assert (near & (out != 0)).mean() < 0.01  # near a boundary: the exact zeros, and rarely another


def _mp_grads(q, k, v, do, b, h, *, scale=None, softcap=None, causal=False, prec=200):
    """dq[b, h], dk[b, h // G], dv[b, h // G] restricted to query head h, straight in mpmath (MHA: G = 1)."""
    qf, kf, vf, of = (to_float64(x) for x in (q, k, v, do))
    M, D = qf.shape[2:]
    N = kf.shape[2]
    sc = mpmath.mpf(effective_scale(scale, D))
    vis = visibility(M, N, N, causal)
    with mpmath.workprec(prec):
        Q = [[mpmath.mpf(x) for x in row] for row in qf[b, h]]
        K = [[mpmath.mpf(x) for x in row] for row in kf[b, h]]
        V = [[mpmath.mpf(x) for x in row] for row in vf[b, h]]
        O = [[mpmath.mpf(x) for x in row] for row in of[b, h]]
        dq = [[mpmath.mpf(0)] * D for _ in range(M)]
        dk = [[mpmath.mpf(0)] * D for _ in range(N)]
        dv = [[mpmath.mpf(0)] * len(V[0]) for _ in range(N)]
        for i in range(M):
            js = [j for j in range(N) if vis[i, j]]
            y = {j: sc * mpmath.fsum(a * c for a, c in zip(Q[i], K[j])) for j in js}
            c = mpmath.mpf(float(np.float32(softcap))) if softcap else None
            t = {j: (c * mpmath.tanh(y[j] / c) if c else y[j]) for j in js}
            top = max(t.values())
            e = {j: mpmath.exp(t[j] - top) for j in js}
            s = mpmath.fsum(e.values())
            P = {j: e[j] / s for j in js}
            dP = {j: mpmath.fsum(a * c for a, c in zip(O[i], V[j])) for j in js}
            Dd = mpmath.fsum(P[j] * dP[j] for j in js)
            for j in js:
                dS = P[j] * (dP[j] - Dd) * ((1 - mpmath.tanh(y[j] / c) ** 2) if c else 1)
                for d in range(D):
                    dq[i][d] += sc * dS * K[j][d]
                    dk[j][d] += sc * dS * Q[i][d]
                for d in range(len(V[0])):
                    dv[j][d] += P[j] * O[i][d]
    return dq, dk, dv


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_bit_exact_against_mpmath_200_bits(dtype, softcap) -> None:
    q, k, v, do = _inputs(2, dtype, B=1, Hq=1, Hkv=1, M=5, N=6, D=4, Dv=3, spread=2.0)
    r = attention_backward_quantities(q, k, v, do, causal=True, softcap=softcap)
    dq, dk, dv = _mp_grads(q, k, v, do, 0, 0, softcap=softcap, causal=True)
    fmt = format_of(dtype)
    for mine, want in ((r.dq[0, 0], dq), (r.dk[0, 0], dk), (r.dv[0, 0], dv)):
        got = np.array([[round_mpf(x, fmt) for x in row] for row in want])
        assert np.array_equal(mine, got) and np.array_equal(np.signbit(mine), np.signbit(got) & (got != 0))


@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_exact_path_agrees_with_the_fast_path(softcap) -> None:
    """The certified ball path (`_ExactGroup`, what undecided elements get) gives the fast path's bits."""
    q, k, v, do = _inputs(3, torch.float32, B=1, Hq=2, Hkv=1, M=4, N=5, D=4, Dv=3)
    r = attention_backward_quantities(q, k, v, do, softcap=softcap or None)
    Q = to_float64(q)[0].reshape(8, 4)
    ex = _ExactGroup(Q, to_float64(k)[0, 0], to_float64(v)[0, 0], to_float64(do)[0].reshape(8, 3),
                     np.ones((8, 5), bool), r.scale, r.softcap, None, FP32)
    for kind, arr in (("dq", r.dq[0].reshape(8, 4)), ("dk", r.dk[0, 0]), ("dv", r.dv[0, 0])):
        for a, d in ((0, 0), (3, 2), (arr.shape[0] - 1, 1)):
            val = round_certified(lambda p: ex.ball_element(kind, a, d, p).pair(), FP32)
            assert val == arr[a, d], (kind, a, d)


def test_gqa_is_the_sum_over_the_group() -> None:
    q, k, v, do = _inputs(4, torch.float32, B=1, Hq=2, Hkv=1, M=6, N=7, D=8, Dv=4)
    g = attention_backward_quantities(q, k, v, do)
    m = attention_backward_quantities(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), do)
    assert np.array_equal(g.dq, m.dq)
    for gg, mm in ((g.dk_approx, m.dk_approx), (g.dv_approx, m.dv_approx)):
        assert np.abs(gg[:, 0] - mm.sum(axis=1)).max() <= 1e-14 * np.abs(mm).sum()
    # Exactly, where every value is a small dyadic (k = 0: uniform rows, N = 4, sc = 1/4): fp32 holds
    # each gradient and each sum exactly, so the rounded GQA gradients are the sums of the MHA ones.
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(-3, 4, (1, 2, 5, 16), generator=gen).float()
    k = torch.zeros(1, 1, 4, 16)
    v = torch.randint(-3, 4, (1, 1, 4, 4), generator=gen).float()
    do = torch.randint(-3, 4, (1, 2, 5, 4), generator=gen).float()
    g = attention_backward_quantities(q, k, v, do)
    m = attention_backward_quantities(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), do)
    assert np.array_equal(g.dk[:, 0], m.dk.sum(axis=1)) and np.array_equal(g.dv[:, 0], m.dv.sum(axis=1))
    assert np.abs(g.dk).max() > 0 and g.fallbacks > 0  # nontrivial, and decided by the exact path


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_one_key_gives_zero_dq_dk(dtype) -> None:
    q, k, v, do = _inputs(6, dtype, N=1)
    dq, dk, dv = attention_backward_quantities(q, k, v, do).grads
    assert (dq == 0).all() and not np.signbit(dq).any() and (dk == 0).all() and not np.signbit(dk).any()
    want = round_float64(to_float64(do).reshape(2, 1, 2 * 7, 5).sum(axis=2, keepdims=True), format_of(dtype))
    assert np.array_equal(dv, want)  # P = 1: dv_j = sum of dO over the group's rows


def test_masked_rows_and_hidden_keys_are_exact_zeros() -> None:
    q, k, v, do = _inputs(7, torch.bfloat16, B=2, Hq=2, Hkv=2, M=6, N=8)
    k[1, :, 5:] = float("nan")  # padding garbage past kv_lens
    v[1, :, 5:] = float("inf")
    k[0] = float("nan")  # kv_lens 0: nothing is read
    mask = torch.ones(2, 2, 6, 8, dtype=torch.bool)
    mask[1, 0, 3] = False  # a fully masked row
    mask[1, 1, :, 2] = False  # a key hidden from every row of head 1
    do[1, 0, 3] = float("nan")  # a masked row's dO is never read
    q[1, 0, 3] = float("nan")
    r = attention_backward_quantities(q, k, v, do, kv_lens=[0, 5], attn_mask=mask, causal=True,
                                      causal_align="bottom_right")
    dq, dk, dv = r.grads
    assert not np.isnan(dq).any() and not np.isnan(dk).any() and not np.isnan(dv).any()
    assert (dq[0] == 0).all() and (dk[0] == 0).all() and (dv[0] == 0).all()
    assert (dq[1, 0, 3] == 0).all() and (dk[1, :, 5:] == 0).all() and (dv[1, :, 5:] == 0).all()
    assert (dk[1, 1, 2] == 0).all() and (dv[1, 1, 2] == 0).all()
    assert not np.signbit(dq[0]).any() and not np.signbit(dk[1, :, 5:]).any()
    assert r.dq_special[0].all() and r.dk_special[1, :, 5:].all()
    # a -inf float mask hides as well
    fm = torch.zeros(1, 1, 6, 8)
    fm[..., 4] = -math.inf
    fm[..., 1, :] = -math.inf
    dq, dk, dv = attention_backward_quantities(q[1:], k[1:], v[1:], do[1:] * 0 + 1, attn_mask=fm, kv_lens=[5]).grads
    assert (dq[:, :, 1] == 0).all() and (dk[:, :, 4] == 0).all() and (dv[:, :, 4] == 0).all()


def test_no_key_at_all() -> None:
    """N = 0 (a varlen sequence without keys): dq a structural +0 whatever q and dO hold; dk, dv empty."""
    q, k, v, do = _inputs(9, torch.float16, M=3, N=0)
    do[0, 0, 1] = float("nan")
    r = attention_backward_quantities(q, k, v, do)
    assert (r.dq == 0).all() and not np.signbit(r.dq).any() and r.dq_special.all()
    assert r.dk.shape == (2, 1, 0, 8) and r.dv.shape == (2, 1, 0, 5)


def test_nan_semantics() -> None:
    q, k, v, do = _inputs(8, torch.float16, B=1, Hq=1, Hkv=1, M=5, N=5)
    q1 = q.clone()
    q1[0, 0, 2, 1] = float("nan")
    dq, dk, dv = attention_backward_quantities(q1, k, v, do, causal=True).grads
    assert np.isnan(dq[0, 0, 2]).all() and not np.isnan(dq[0, 0, [0, 1, 3, 4]]).any()
    assert np.isnan(dk[0, 0, :3]).all() and not np.isnan(dk[0, 0, 3:]).any()
    assert np.isnan(dv[0, 0, :3]).all() and not np.isnan(dv[0, 0, 3:]).any()
    v1 = v.clone()
    v1[0, 0, 3, 0] = float("inf")  # seen by rows 3, 4: their dP, D, dS are NaN; dv reads no v
    dq, dk, dv = attention_backward_quantities(q, k, v1, do, causal=True).grads
    assert np.isnan(dq[0, 0, 3:]).all() and not np.isnan(dq[0, 0, :3]).any()
    assert np.isnan(dk[0, 0]).all() and not np.isnan(dv).any()
    do1 = do.clone()
    do1[0, 0, 1, 2] = float("nan")  # row 1 sees keys 0, 1: dv column 2 of those NaN
    dq, dk, dv = attention_backward_quantities(q, k, v, do1, causal=True).grads
    assert np.isnan(dv[0, 0, :2, 2]).all() and not np.isnan(dv[0, 0, 2:]).any() and not np.isnan(dv[..., :2]).any()
    assert np.isnan(dq[0, 0, 1]).all() and np.isnan(dk[0, 0, :2]).all() and not np.isnan(dk[0, 0, 2:]).any()


def test_dv_is_linear_in_do() -> None:
    q, k, v, do = _inputs(9, torch.float32)
    do2 = _inputs(10, torch.float32)[3]
    a = attention_backward_quantities(q, k, v, do)
    b = attention_backward_quantities(q, k, v, do * 2)  # a power of two commutes with rounding
    assert np.array_equal(b.dv, 2 * a.dv) and np.array_equal(b.dq, 2 * a.dq)
    c = attention_backward_quantities(q, k, v, do2)
    s = attention_backward_quantities(q, k, v, (to_float64(do) + to_float64(do2)), fmt=FP32)
    assert np.abs(s.dv_approx - a.dv_approx - c.dv_approx).max() <= 1e-14 * np.abs(s.dv_approx).max()


def test_each_row_of_ds_sums_to_zero() -> None:
    # Rational rows (uniform weights): exactly, in Fractions.
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 1, 4, 8, generator=gen)
    v, do = torch.randn(1, 1, 6, 3, generator=gen), torch.randn(1, 1, 4, 3, generator=gen)
    ex = _ExactGroup(to_float64(q)[0, 0], np.zeros((6, 8)), to_float64(v)[0, 0], to_float64(do)[0, 0],
                     np.ones((4, 6), bool), 0.25, 0.0, None, FP32)
    for i in range(4):
        dS = ex.row(i)["dS"]
        assert all(x is not None for x in dS.values()) and sum(dS.values(), Fraction(0)) == 0
    # Transcendental rows: the ball of the sum holds 0 and is tiny.
    q, k, v, do = _inputs(12, torch.bfloat16, B=1, Hq=1, Hkv=1, M=4, N=6)
    ex = _ExactGroup(to_float64(q)[0, 0], to_float64(k)[0, 0], to_float64(v)[0, 0], to_float64(do)[0, 0],
                     np.ones((4, 6), bool), effective_scale(None, 8), 0.0, None, BF16)
    for i in range(4):
        s = ball_sum([ds for _, ds in ex.balls(i, 300).values()], 300)
        lo, hi = mpmath.mpf(s.lower()), mpmath.mpf(s.upper())
        assert lo <= 0 <= hi and hi - lo < mpmath.mpf(2) ** -150


# ---- a NumPy model of a FlashAttention-2 style Triton backward, against the bound ---------------------

def _to16(x, fmt):
    return round_float64(x.astype(np.float64), fmt).astype(np.float32) if fmt.bits == 16 else x.astype(np.float32)


def fa2_model(q, k, v, do, vis, fmt, *, sc, softcap=0.0, block_m=8, block_n=8):
    """Forward (one block: O rounded to fmt, lse2 in fp32) and the FA2 backward in float32: P from
    exp2(s c - lse2), dv += P16^T dO, dP = dO V^T, D = rowsum(O16 dO), dS = P (dP - D) [times 1 - th^2],
    dS16, dk += dS16^T Q, dq += dS16 K, dk, dq times sc; outputs rounded to fmt."""
    B, Hq, M, D = q.shape
    Hkv, N, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // Hkv
    f32 = np.float32
    Q, K, V, dO = (x.astype(f32) for x in (q, k, v, do))
    log2e = f32(math.log2(math.e))
    cap = f32(softcap)
    c = f32(sc * math.log2(math.e)) if not softcap else None

    def exps(Qb, Kb):
        s = Qb @ Kb.T
        if softcap:
            th = np.tanh((s * f32(sc)) / cap)
            return (cap * th) * log2e, th
        return s * c, None

    O16 = np.zeros((B, Hq, M, Dv), f32)
    lse2 = np.zeros((B, Hq, M), f32)
    for b in range(B):
        for h in range(Hq):
            x, _ = exps(Q[b, h], K[b, h // G])
            x = np.where(vis[b, h], x, f32(-np.inf))
            m = x.max(axis=1)
            live = np.isfinite(m)
            m = np.where(live, m, f32(0))
            p = np.where(vis[b, h], np.exp2(x - m[:, None]), f32(0))
            l = p.sum(axis=1, dtype=f32)
            O16[b, h] = _to16((_to16(p, fmt) @ V[b, h // G]) / np.where(live, l, f32(1))[:, None], fmt)
            lse2[b, h] = np.where(live, m + np.log2(np.where(live, l, f32(1))), f32(np.inf))
    Dpre = (O16 * dO).sum(axis=-1, dtype=f32)
    dq = np.zeros((B, Hq, M, D), f32)
    dk = np.zeros((B, Hkv, N, D), f32)
    dv = np.zeros((B, Hkv, N, Dv), f32)

    def block(b, h, i0, j0):
        hk = h // G
        Qb, Kb, Vb = Q[b, h, i0:i0 + block_m], K[b, hk, j0:j0 + block_n], V[b, hk, j0:j0 + block_n]
        x, th = exps(Qb, Kb)
        seen = vis[b, h, i0:i0 + block_m, j0:j0 + block_n]
        p = np.where(seen, np.exp2(x - lse2[b, h, i0:i0 + block_m, None]), f32(0))
        dp = dO[b, h, i0:i0 + block_m] @ Vb.T
        ds = p * (dp - Dpre[b, h, i0:i0 + block_m, None])
        if softcap:
            ds = ds * (f32(1) - th * th)
        return p, _to16(ds, fmt)

    for b in range(B):
        for hk in range(Hkv):
            for j0 in range(0, N, block_n):
                for h in range(hk * G, (hk + 1) * G):
                    for i0 in range(0, M, block_m):
                        p, ds = block(b, h, i0, j0)
                        dv[b, hk, j0:j0 + block_n] += _to16(p, fmt).T @ dO[b, h, i0:i0 + block_m]
                        dk[b, hk, j0:j0 + block_n] += ds.T @ Q[b, h, i0:i0 + block_m]
        for h in range(Hq):
            for i0 in range(0, M, block_m):
                for j0 in range(0, N, block_n):
                    _, ds = block(b, h, i0, j0)
                    dq[b, h, i0:i0 + block_m] += ds @ K[b, h // G, j0:j0 + block_n]
    dq, dk = dq * f32(sc), dk * f32(sc)
    return tuple(round_float64(x.astype(np.float64), fmt) for x in (dq, dk, dv)), O16, lse2


def _adversarial(kind, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    B, Hq, Hkv, M, N, D, Dv = 1, 4, 2, 24, 20, 16, 8
    q, k, v, do = (torch.randn(*s, generator=g) for s in ((B, Hq, M, D), (B, Hkv, N, D), (B, Hkv, N, Dv),
                                                          (B, Hq, M, Dv)))
    if kind == "confident":  # one key dominates each row: P ~ 1, dS = P (dP - D) cancels
        q = q * 0.3 + 3 * k[:, :, 3:4, :].repeat_interleave(2, 1)
    elif kind == "tied":  # equal maxima: duplicated keys
        k[..., 1::2, :] = k[..., 0::2, :]
        q = q * 3
    elif kind == "one_key":
        k, v = k[..., :1, :], v[..., :1, :]
    elif kind == "large_do":
        do = do * 300
    return tuple(x.to(dtype) for x in (q, k, v, do))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("kind", ["random", "confident", "tied", "one_key", "large_do", "softcap", "causal"])
def test_fa2_model_within_bound(dtype, kind) -> None:
    q, k, v, do = _adversarial(kind, dtype, 20 + DTYPES.index(dtype))
    opts = {"softcap": 3.0} if kind == "softcap" else {"causal": True} if kind == "causal" else {}
    r = attention_backward_quantities(q, k, v, do, **opts)
    fmt = format_of(dtype)
    (dq, dk, dv), O16, lse2 = fa2_model(*(to_float64(x) for x in (q, k, v, do)), r.visible, fmt, sc=r.scale,
                                         softcap=r.softcap)
    bounds = attention_backward_bound(r, block_m=8, block_n=8)
    # the same bound with the model's forward errors measured (tight o_err, lse_err)
    o_err = np.abs(O16.astype(np.float64) - r.o) * (1 + 1e-9) + 1e-12 * np.abs(r.o)
    lse_err = np.where(np.isfinite(r.lse), np.abs(lse2.astype(np.float64) * math.log(2) - r.lse) * 1.001 + 1e-7, 0)
    tight = attention_backward_bound(r, block_m=8, block_n=8, o_err=o_err, lse_err=lse_err)
    ratios, tratios = [], []
    for got, want, bnd, tb in zip((dq, dk, dv), r.grads, bounds, tight):
        err = np.abs(got - want)
        assert np.all(err <= bnd), (kind, np.max(err / np.where(bnd > 0, bnd, 1e-300)))
        assert np.all(err <= tb), (kind, np.max(err / np.where(tb > 0, tb, 1e-300)))
        nz = err > 0
        ratios += list((err / bnd)[nz])
        tratios += list((err / tb)[nz])
    med = float(np.median(ratios)) if ratios else 0.0
    tmed = float(np.median(tratios)) if tratios else 0.0
    print(f"\n{IDS[DTYPES.index(dtype)]} {kind}: error/bound median {med:.3g} max {max(ratios, default=0):.3g}; "
          f"measured forward errors: median {tmed:.3g} max {max(tratios, default=0):.3g}; "
          f"nonzero errors {len(ratios)}")
