"""The Triton kernels of the fused cross-entropy (kernels/cross_entropy.py is the launcher and the
autograd; docs/NUMERICS.md 9.4 and 9.7 model and bound this arithmetic).

`_ce_kernel`: one program a row. A row whose target is ignore_index writes loss 0 and, with GRAD, a
zero gradient, without reading its logits. Otherwise:

* first walk, chunks of BLOCK: a running max m over the chunks and a sum per lane, l_j <- l_j
  exp2((m_old - m) log2 e) + exp2(fl(fl(x_j - m) log2 e)), the lanes joined at the end by a fixed
  pairwise tree (`softmax._tree_sum`): every term meets the roundings of NUMERICS 9.4's model (one add
  and one rescale a later chunk, log2 BLOCK tree levels), with no tree in the loop; bits independent of
  num_warps. With label smoothing also T = sum_j w_j (m - x_j) and W = sum_j w_j per lane, T shifted by
  W (m - m_old) when the max grows: every term >= 0, so no cancellation;
* L = fl(ln 2) log2(l); in fp64 (per row, a few operations): nll = (m - x_t) + L, m - x_t exact, so no
  rounding of a large |m| enters a confident row's loss, and loss = (1 - eps) w_t nll + (eps / V)(W L + T)
  + (z lse) lse, which cannot overflow where the exact loss (or its mean) is finite;
* with GRAD, a second walk writes g sech^2(x / c) [(1 - eps) w_t (p_j - [j = t]) + K p_j - (eps / V) w_j],
  K = (eps / V) W + 2 z lse, p_j = exp2(fl(fl(x_j - m) log2 e) - log2 l): x_j - m is exact near the
  max, where x_j - lse would carry lse's rounding (a row of 1e30 logits: p = 1 instead of 1/V).
  The gradient is rounded once, on the store (never through the logits' dtype before, REAL_BUGS CE 1),
  into the logits themselves under inplace_backward (each element read before it is written, by the
  thread that writes it).

Softcap c: x' = c tanh(x / c) by attention's exp2-based tanh (kernels/attention.py, <= 12u), padding
kept at -inf, +-inf logits ordinary (+-c) with chain factor sech^2 = 4e / (1 + e)^2, e = exp(-2|x| / c)
(relative accuracy where 1 - tanh^2 would cancel; 0 at +-inf).

`_ce_scale_kernel`: the autograd backward's g *= grad_output, a program per (row, block of columns),
skipping rows whose grad_output is exactly 1 without touching memory.
"""
from __future__ import annotations

import sys

from ._common import load_f32, load_f32_zero, store_f32, tl, triton
from ._runtime import settle_cache_keys
from .attention import _tanh
from .softmax import _tree_sum

_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _capped(ptrs, mask, cap, inv_cap, X_BITS: tl.constexpr, SOFTCAP: tl.constexpr):
    """Logits as fp32, padding -inf; under a softcap c tanh(x / c) (padding stays -inf)."""
    x = load_f32(ptrs, mask, X_BITS)
    if SOFTCAP:
        x = tl.where(mask, cap * _tanh(x * inv_cap), float("-inf"))
    return x


@triton.jit
def _sech2(x, k2):
    """sech^2(x / c) = 4e / (1 + e)^2, e = exp(-2|x| / c), k2 = fl(2 log2 e / c)."""
    e = tl.exp2(-(tl.abs(x) * k2))
    d = 1.0 + e
    return (4.0 * e) / (d * d)


@triton.jit(do_not_specialize=["V", "sxm", "stm", "sgm", "gss", "ignore_index"],
            do_not_specialize_on_alignment=["sxn", "sgn"])
def _ce_kernel(x_ptr, t_ptr, w_ptr, gs_ptr, prm_ptr, loss_ptr, g_ptr, V, sxm, sxn, stm, sgm, sgn, gss, ignore_index,
               BLOCK: tl.constexpr, LOG2B: tl.constexpr, X_BITS: tl.constexpr, G_BITS: tl.constexpr,
               MUL: tl.constexpr, HAS_W: tl.constexpr, SMOOTH: tl.constexpr, ZLOSS: tl.constexpr,
               SOFTCAP: tl.constexpr, GRAD: tl.constexpr):
    V, sxm, sgm = V * MUL, sxm * MUL, sgm * MUL
    # fp64 (1 - eps, eps / V, z, c, 1 / c, 2 log2 e / c): the loss combines in fp64, elements use fp32
    keep, sv, zc = tl.load(prm_ptr), tl.load(prm_ptr + 1), tl.load(prm_ptr + 2)
    cap = tl.load(prm_ptr + 3).to(tl.float32)
    inv_cap = tl.load(prm_ptr + 4).to(tl.float32)
    k2 = tl.load(prm_ptr + 5).to(tl.float32)
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    x_row, g_row = x_ptr + row * sxm, g_ptr + row * sgm
    n_chunks = tl.cdiv(V, BLOCK)
    t = tl.load(t_ptr + row * stm).to(tl.int64)
    if t == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        if GRAD:
            for k in range(n_chunks):
                cols = tl.cast(k, tl.int64) * BLOCK + lanes
                store_f32(g_row + cols * sgn, tl.zeros([BLOCK], tl.float32), cols < V, G_BITS)
    else:
        m = tl.full([], float("-inf"), tl.float32)
        ms_old = tl.zeros([], tl.float32)
        l = tl.zeros([BLOCK], tl.float32)
        T = tl.zeros([BLOCK], tl.float32)
        W = tl.zeros([BLOCK], tl.float32)
        for k in range(n_chunks):
            cols = tl.cast(k, tl.int64) * BLOCK + lanes
            mask = cols < V
            x = _capped(x_row + cols * sxn, mask, cap, inv_cap, X_BITS, SOFTCAP)
            mn = tl.maximum(m, tl.max(x, axis=0))
            ms = tl.where(mn == float("-inf"), 0.0, mn)  # an all -inf prefix: no -inf - -inf
            l = l * tl.exp2((m - ms) * _LOG2E) + tl.exp2((x - ms) * _LOG2E)
            if SMOOTH:
                d = tl.where(mask, ms - x, 0.0)  # +inf at a -inf logit: the smoothed loss is +inf (0 * inf: NaN)
                if HAS_W:
                    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
                    d = w * d
                else:
                    w = mask.to(tl.float32)
                T = T + W * (ms - ms_old) + d
                W = W + w
                ms_old = ms
            m = mn
        l = _tree_sum(l, BLOCK, LOG2B)
        if SMOOTH:
            T = _tree_sum(T, BLOCK, LOG2B)
            W = _tree_sum(W, BLOCK, LOG2B)
        lg = tl.log2(l)
        L = lg * _LN2
        xt = _capped(x_row + t * sxn, t >= 0, cap, inv_cap, X_BITS, SOFTCAP)
        wt = 1.0
        if HAS_W:
            wt = tl.load(w_ptr + t)
        # fp64 from here: m - x_t exact (no rounding of a large |m| in a confident row's loss), and no
        # fp32 overflow of a row's loss whose mean is finite (logits near +-max: m - x_t ~ 2 max)
        m64, L64 = m.to(tl.float64), L.to(tl.float64)
        c0 = keep * wt
        loss = c0 * ((m64 - xt.to(tl.float64)) + L64)  # c0 = 1 without weights or smoothing: exact
        if SMOOTH:
            loss = loss + sv * (W.to(tl.float64) * L64 + T.to(tl.float64))
        if ZLOSS:
            lse64 = m64 + L64
            loss = loss + (zc * lse64) * lse64
        tl.store(loss_ptr + row, loss)
        if GRAD:
            g = tl.load(gs_ptr + row * gss)
            ms = tl.where(m == float("-inf"), 0.0, m)
            c0 = c0.to(tl.float32)
            K = tl.zeros([], tl.float32)
            if SMOOTH:
                K = sv.to(tl.float32) * W
            if ZLOSS:
                K = K + (2.0 * zc.to(tl.float32)) * (m + L)
            for k in range(n_chunks):
                cols = tl.cast(k, tl.int64) * BLOCK + lanes
                mask = cols < V
                xr = load_f32(x_row + cols * sxn, mask, X_BITS)
                x = xr
                if SOFTCAP:
                    x = cap * _tanh(xr * inv_cap)
                p = tl.exp2((x - ms) * _LOG2E - lg)
                r = c0 * (p - tl.where(cols == t, 1.0, 0.0))
                if SMOOTH:
                    w = 1.0
                    if HAS_W:
                        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
                    r = r + (K * p - sv.to(tl.float32) * w)
                elif ZLOSS:
                    r = r + K * p
                r = r * g
                if SOFTCAP:
                    r = r * _sech2(xr, k2)
                store_f32(g_row + cols * sgn, r, mask, G_BITS)


@triton.jit(do_not_specialize=["V", "sgm", "gss"], do_not_specialize_on_alignment=["sgn"])
def _ce_scale_kernel(g_ptr, go_ptr, V, sgm, sgn, gss, BLOCK: tl.constexpr, G_BITS: tl.constexpr, MUL: tl.constexpr):
    V, sgm = V * MUL, sgm * MUL
    row = tl.program_id(0).to(tl.int64)
    go = tl.load(go_ptr + row * gss)
    if go != 1.0:  # the usual scalar loss's backward: nothing to read or write
        cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        ptrs = g_ptr + row * sgm + cols * sgn
        store_f32(ptrs, load_f32_zero(ptrs, mask, G_BITS) * go, mask, G_BITS)


settle_cache_keys(sys.modules[__name__])  # helpers first, as kernels/softmax_backward.py
