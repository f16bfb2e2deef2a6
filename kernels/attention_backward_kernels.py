"""Triton kernels of the attention backward (launched by kernels/attention_backward.py).

FlashAttention-2's split, three launches and no atomics, so every gradient is deterministic:
- `_attn_bwd_delta_kernel`: D_i = rowsum(dO_i * O_i) in fp32, from the forward's stored O.
- `_attn_bwd_dkdv_kernel`: one program per (key block, batch, kv head) keeps its K, V tile and
  the fp32 dk, dv accumulators and walks the query blocks of every query head of its GQA group
  in a fixed order (head, then block), so dk, dv are summed over the group in one place.
- `_attn_bwd_dq_kernel`: one program per (query block, batch, query head) walks the key blocks.

Arithmetic (the model of oracles/attention_backward_bound.py, docs/NUMERICS.md 10.4): scores
s = dot(q, k) in fp32 (operands in the input dtype; fp32 inputs with ieee dots, as the forward);
P = exp2(s fl(sc log2 e) - lse log2 e) from the forward's saved fp32 lse (softcap: the forward's
exponent tanh(s fl(sc/c)) fl(c log2 e)); with a float attn_mask in natural units as the forward
keeps them, P = exp2(fl(fl(s sc) + b - lse) log2 e), so a bias near -3.4e38 does not overflow.
dS = P (dP - D) [times 1 - tanh^2, softcap's chain factor, taken from the unmasked score] in
fp32, rounded to the input dtype before the dq / dk dots (fp32 inputs keep it); P rounded the
same way before dv's dot. dq, dk multiplied by fl32(sc) at the end.

Hidden entries (past kv_lens or n, outside the causal/window band, masked, -inf bias) get P = 0
and dS = 0 by `tl.where`, never by a multiplication, so NaN or garbage stored there (or a hidden
V giving dP = NaN) never reaches a gradient. Absent keys' K and V load as 0 (the dK/dV kernel
leaves keys past n_valid unmasked in its loops and sets their dk, dv to 0 at the end: a key's
weights reach only its own rows of dk, dv). Rows that see no key
have lse = -inf (the forward's choice): their exponent reference becomes +inf (P = 0, not
exp2(+inf)) and, in launches that can have such rows (ROW_GUARD), their q, dO and D load as 0,
so whatever those rows hold adds nothing to dk, dv. As in the forward, a NaN that exists but is
hidden from some pairs can reach them through 0 * NaN inside a dot of a shared block: a NaN in a
key hidden from a row reaches that row's dq (dS @ K), a NaN in q or dO of a live row reaches dk or
dv of keys in its block that it does not see (every flash-style kernel does the same). A hidden
NaN value never does (dP enters only through the masked dS). A row masked whole by a float bias so
large that fl32(lse) no longer holds log n (|b| >~ 2^24 log n: -1e9, finfo(float32).min) gets
P = exp(fl(y + b) - fl(lse)) = 1 for each of its n keys, n times the forward's uniform weights: the
lse alone cannot tell (torch's CPU SDPA backward, also from a logsumexp, gives the same), and the
bound admits it (its 3u|b| term); a finite bias of the size of the scores (-1e4) is exact enough.

Blocks every row of the tile sees whole skip the masks (the main loops); edge loops (causal or
window edges, masks, the row or key tail) are compiled only when the launch can reach them.
"""
from __future__ import annotations

from ._common import load_f32_zero, store_f32, tl, triton
from .attention import _load_tile, _round_bf16_in_f32, _tanh

_INF = tl.constexpr(float("inf"))
_LOG2E_C = tl.constexpr(1.4426950408889634)


@triton.jit
def _dot(a, b, acc, IS_FP32: tl.constexpr):
    if IS_FP32:  # no tf32: the bound counts exact products (kernels/attention.py does the same)
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _to_input(x, ref, BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr):
    """x rounded to the input dtype (ref's) for a dot; fp32 inputs keep fp32. Under the
    interpreter bf16 is rounded exactly in fp32; the bit trick is sign-magnitude, so it rounds
    negative dS as it rounds P."""
    if IS_FP32:
        return x
    elif BF16_BITS:
        return _round_bf16_in_f32(x)
    else:
        return x.to(ref.dtype)


@triton.jit
def _lse_ref(lse, NATURAL: tl.constexpr):
    """The exponent reference: lse in base 2 (natural units with a float mask); +inf for a row
    that sees no key (lse = -inf), so its P is exp2(s - inf) = 0 rather than exp2(+inf)."""
    if NATURAL:
        ref = lse
    else:
        ref = lse * _LOG2E_C
    return tl.where(lse == float("-inf"), _INF, ref)


@triton.jit
def _weights(s, ref, bias, qk_scale, cap_in, cap_out, SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr):
    """P recomputed from the scores s and the broadcast exponent reference, and softcap's chain
    factor 1 - tanh^2 (1.0 without a cap), taken before any mask so a mask value never enters it."""
    f = 1.0
    if SOFTCAP:
        th = _tanh(s * cap_in)
        t = th * cap_out
        f = 1.0 - th * th
    else:
        t = s * qk_scale
    if MASK_KIND == 2:
        p = tl.math.exp2((t + bias - ref) * _LOG2E_C)
    else:
        p = tl.math.exp2(t - ref)
    return p, f


@triton.jit
def _sequence(b, kvlen_ptr, cuq_ptr, cuk_ptr, M, N, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, VARLEN: tl.constexpr):
    """This program's sequence: (b, first query row q0, first key row k0, m_len, n_len, n_valid,
    lo_off, hi_off); row i sees key j iff j < n_valid and i + lo_off <= j <= i + hi_off (the
    forward's geometry: an absent window edge is an offset past every key)."""
    q0 = tl.zeros((), tl.int64)
    k0 = tl.zeros((), tl.int64)
    m_len = M
    n_len = N
    if VARLEN:
        q0 = tl.load(cuq_ptr + b).to(tl.int64)
        k0 = tl.load(cuk_ptr + b).to(tl.int64)
        m_len = (tl.load(cuq_ptr + b + 1) - tl.load(cuq_ptr + b)).to(tl.int32)
        n_len = (tl.load(cuk_ptr + b + 1) - tl.load(cuk_ptr + b)).to(tl.int32)
        b = b * 0  # packed tensors have no batch dimension
    kv_len = tl.load(kvlen_ptr + b * HAS_KVLEN).to(tl.int32)
    n_valid = tl.where(HAS_KVLEN != 0, tl.minimum(tl.maximum(kv_len, 0), n_len), n_len)
    off = (n_valid - m_len) * BOTTOM_RIGHT
    return b, q0, k0, m_len, n_len, n_valid, off - LEFT, off + RIGHT


@triton.jit
def _mask_values(ptrs, mask, MASK_KIND: tl.constexpr, MASK_BF16_BITS: tl.constexpr):
    """The attn_mask tile: keep flags (bool) or the bias (float, hidden lanes 0); 0.0 without one."""
    if MASK_KIND == 1:
        return tl.load(ptrs, mask=mask, other=0)
    elif MASK_KIND == 2:
        return load_f32_zero(ptrs, mask, MASK_BF16_BITS)
    else:
        return 0.0


@triton.jit
def _visible(rows, cols, lo_off, hi_off, n_valid, mvals, KEY_TAIL: tl.constexpr, MASK_KIND: tl.constexpr):
    """Which (row, key) pairs take part, rows and cols broadcast to the tile's orientation."""
    vis = (cols >= rows + lo_off) & (cols <= rows + hi_off)
    if KEY_TAIL:
        vis = vis & (cols < n_valid)
    if MASK_KIND == 1:
        vis = vis & (mvals != 0)
    elif MASK_KIND == 2:
        vis = vis & (mvals != float("-inf"))
    return vis


@triton.jit(do_not_specialize=["sob", "soh", "som", "sgb", "sgh", "sgm", "slb", "slh", "slm", "sdb", "sdh", "HQ", "M",
                               "DV"],
            do_not_specialize_on_alignment=["sod", "sgd"])
def _attn_bwd_delta_kernel(o_ptr, do_ptr, lse_ptr, delta_ptr, ref_ptr, cuq_ptr, sob, soh, som, sod, sgb, sgh, sgm, sgd,
                           slb, slh, slm, sdb, sdh, HQ, M, DV, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                           STRIDE_MUL: tl.constexpr, VARLEN: tl.constexpr, NATURAL: tl.constexpr,
                           BF16_BITS: tl.constexpr, WIDE: tl.constexpr):
    """Per query row: D = rowsum(dO * O) and the exponent reference (`_lse_ref`), both into
    contiguous fp32 rows, so the main kernels' per-row loads are unit-stride (a strided lse cost
    the dK/dV kernel a 64-bit address per row and pipeline stage)."""
    sob, soh, som = sob * STRIDE_MUL, soh * STRIDE_MUL, som * STRIDE_MUL
    sgb, sgh, sgm = sgb * STRIDE_MUL, sgh * STRIDE_MUL, sgm * STRIDE_MUL
    pid_bh = tl.program_id(1)
    b = (pid_bh // HQ).to(tl.int64)
    h = (pid_bh % HQ).to(tl.int64)
    q0 = tl.zeros((), tl.int64)
    m_len = M
    if VARLEN:
        q0 = tl.load(cuq_ptr + b).to(tl.int64)
        m_len = (tl.load(cuq_ptr + b + 1) - tl.load(cuq_ptr + b)).to(tl.int32)
        b = b * 0
    start_m = tl.program_id(0) * BLOCK_M
    if start_m >= m_len:
        return
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_DV)
    mask = ((start_m + rm) < m_len)[:, None] & (rd < DV)[None, :]
    if WIDE:
        rm = rm.to(tl.int64)
        rd = rd.to(tl.int64)
    row0 = q0 + start_m
    o = load_f32_zero(o_ptr + (b * sob + h * soh + row0 * som) + (rm[:, None] * som + rd[None, :] * sod), mask,
                      BF16_BITS)
    do = load_f32_zero(do_ptr + (b * sgb + h * sgh + row0 * sgm) + (rm[:, None] * sgm + rd[None, :] * sgd), mask,
                       BF16_BITS)
    row_ok = (start_m + rm) < m_len
    lse = tl.load(lse_ptr + (b * slb + h * slh + row0 * slm) + rm * slm, mask=row_ok, other=float("-inf"))
    tl.store(delta_ptr + b * sdb + h * sdh + row0 + rm, tl.sum(o * do, 1), mask=row_ok)
    tl.store(ref_ptr + b * sdb + h * sdh + row0 + rm, _lse_ref(lse, NATURAL), mask=row_ok)


@triton.jit
def _dkdv_block(dk, dv, k, v, q_ptrs, do_ptrs, ref_ptrs, delta_ptrs, mask_ptrs, start_m, sqm, sgm, smm,
                offs_m, cols, m_len, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                EDGE: tl.constexpr, TAIL: tl.constexpr, ROW_GUARD: tl.constexpr, SOFTCAP: tl.constexpr,
                MASK_KIND: tl.constexpr, MASK_BF16_BITS: tl.constexpr, EVEN_D: tl.constexpr,
                EVEN_DV: tl.constexpr, BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr):
    """One query block against the program's key block, in key-major tiles (BLOCK_N, BLOCK_M).
    TAIL: the block may hold rows past m_len (loads masked); EDGE: some (row, key) pair may be
    hidden (scores masked) and, with ROW_GUARD, some row may see no key (its q, dO, D load as 0).
    ref: the exponent reference per row (`_lse_ref`, written by the delta kernel)."""
    rows = start_m + offs_m
    sm = tl.cast(start_m, tl.int64)
    row_ok = rows < m_len
    if TAIL:
        ref = tl.load(ref_ptrs + sm, mask=row_ok, other=float("inf"))
    else:
        ref = tl.load(ref_ptrs + sm)
    live = row_ok
    if EDGE and ROW_GUARD:
        live = row_ok & (ref != _INF)
    ROWS_MASKED: tl.constexpr = TAIL or (EDGE and ROW_GUARD)
    if EVEN_D:
        qmask = live[None, :]
    else:
        qmask = live[None, :] & d_mask[:, None]
    if EVEN_DV:
        gmask = live[:, None]
    else:
        gmask = live[:, None] & dv_mask[None, :]
    qt = _load_tile(q_ptrs + sm * sqm, qmask, ROWS_MASKED or not EVEN_D, BF16_BITS)  # Q^T (BLOCK_D, BLOCK_M)
    do = _load_tile(do_ptrs + sm * sgm, gmask, ROWS_MASKED or not EVEN_DV, BF16_BITS)  # (BLOCK_M, BLOCK_DV)
    if ROWS_MASKED:
        di = tl.load(delta_ptrs + sm, mask=live, other=0.0)
    else:
        di = tl.load(delta_ptrs + sm)
    mvals = 0.0
    if MASK_KIND != 0:
        mvals = _mask_values(mask_ptrs + sm * smm, row_ok[None, :] & (cols < n_valid)[:, None], MASK_KIND,
                             MASK_BF16_BITS)
    st = _dot(k, qt, None, IS_FP32)
    pt, f = _weights(st, ref[None, :], mvals, qk_scale, cap_in, cap_out, SOFTCAP,
                     MASK_KIND)
    if EDGE:
        vis = _visible(rows[None, :], cols[:, None], lo_off, hi_off, n_valid, mvals, False, MASK_KIND)
        if TAIL:  # rows past m_len read q = 0, but 0 * a NaN key is NaN
            vis = vis & row_ok[None, :]
        pt = tl.where(vis, pt, 0.0)
    dv = _dot(_to_input(pt, do, BF16_BITS, IS_FP32), do, dv, IS_FP32)
    dpt = _dot(v, tl.trans(do), None, IS_FP32)
    dst = pt * (dpt - di[None, :])
    if SOFTCAP:
        dst = dst * f
    if EDGE:
        dst = tl.where(vis, dst, 0.0)
    dk = _dot(_to_input(dst, qt, BF16_BITS, IS_FP32), tl.trans(qt), dk, IS_FP32)
    return dk, dv


_STRIDES = ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sgb", "sgh", "sgm", "sab", "sah", "san",
            "scb", "sch", "scn", "smb", "smh", "smm", "sdb", "sdh"]
_SIZES = ["HEADS", "GROUP", "M", "N", "D", "DV", "LEFT", "RIGHT", "BOTTOM_RIGHT", "HAS_KVLEN", "REVERSE"]
_HEAD_DIM = ["sqd", "skd", "svd", "sgd", "sad", "scd", "smn"]


# One binary per feature set, as the forward: sizes, window edges, switches and batch/head/row
# strides are runtime values (those strides pass through STRIDE_MUL, kernels/attention.py says why).
# dk, dv (sa*, sc*) share the key layout of the outputs the launcher allocates.
@triton.jit(do_not_specialize=_STRIDES + _SIZES, do_not_specialize_on_alignment=_HEAD_DIM)
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, ref_ptr, delta_ptr, kvlen_ptr, cuq_ptr, cuk_ptr, mask_ptr,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgm, sgd, sab, sah, san, sad,
    scb, sch, scn, scd, smb, smh, smm, smn, sdb, sdh,
    HEADS, GROUP, M, N, D, DV, qk_scale, cap_in, cap_out, sc, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, REVERSE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    STRIDE_MUL: tl.constexpr, VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr,
    MASK_BF16_BITS: tl.constexpr, BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, WIDE: tl.constexpr, LEFT_EDGE: tl.constexpr, RIGHT_EDGE: tl.constexpr,
    ROW_TAIL: tl.constexpr, ROW_GUARD: tl.constexpr, EDGE_STAGES: tl.constexpr,
):
    sqb, sqh, sqm = sqb * STRIDE_MUL, sqh * STRIDE_MUL, sqm * STRIDE_MUL
    skb, skh, skn = skb * STRIDE_MUL, skh * STRIDE_MUL, skn * STRIDE_MUL
    svb, svh, svn = svb * STRIDE_MUL, svh * STRIDE_MUL, svn * STRIDE_MUL
    sgb, sgh, sgm = sgb * STRIDE_MUL, sgh * STRIDE_MUL, sgm * STRIDE_MUL
    sab, sah, san = sab * STRIDE_MUL, sah * STRIDE_MUL, san * STRIDE_MUL
    scb, sch, scn = scb * STRIDE_MUL, sch * STRIDE_MUL, scn * STRIDE_MUL
    pid_bh = tl.program_id(1)
    b = (pid_bh // HEADS).to(tl.int64)  # HEADS: the kv heads here
    hkv = (pid_bh % HEADS).to(tl.int64)
    b, q0, k0, m_len, n_len, n_valid, lo_off, hi_off = _sequence(
        b, kvlen_ptr, cuq_ptr, cuk_ptr, M, N, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, VARLEN)
    start_n = tl.program_id(0) * BLOCK_N
    if start_n >= n_len:  # varlen: a short sequence in a grid sized for the longest
        return
    offs_n = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    cols = start_n + offs_n
    key_ok = cols < n_valid
    d_mask = offs_d < D
    dv_mask = offs_dv < DV
    rn, rm, rd, rdv = offs_n, offs_m, offs_d, offs_dv
    if WIDE:  # in-tile offsets past int32 (decided by the launcher); the bases are int64 always
        rn, rm, rd, rdv = rn.to(tl.int64), rm.to(tl.int64), rd.to(tl.int64), rdv.to(tl.int64)
    kv_row = k0 + start_n
    kmask = key_ok[:, None]
    vmask = key_ok[:, None]
    if not EVEN_D:  # a runtime head-dim mask costs the loads their vector width
        kmask = kmask & d_mask[None, :]
    if not EVEN_DV:
        vmask = vmask & dv_mask[None, :]
    k = _load_tile(k_ptr + (b * skb + hkv * skh + kv_row * skn) + (rn[:, None] * skn + rd[None, :] * skd), kmask,
                   True, BF16_BITS)
    v = _load_tile(v_ptr + (b * svb + hkv * svh + kv_row * svn) + (rn[:, None] * svn + rdv[None, :] * svd), vmask,
                   True, BF16_BITS)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)

    # Rows that see some key of [start_n, last]: [lo_r, hi_r); every key of it: [full_lo, full_hi).
    # Keys past n_valid take no part (their dk, dv are set to 0 below), so `last` stops at n_valid.
    last = tl.minimum(start_n + BLOCK_N, n_valid) - 1
    hi_r = tl.where(start_n < n_valid, tl.minimum(last - lo_off + 1, m_len), 0)
    lo_r = tl.maximum(start_n - hi_off, 0)
    full_lo = tl.maximum(last - hi_off, 0)
    full_hi = tl.minimum(tl.minimum(start_n - lo_off + 1, m_len), hi_r)
    lo_rb = (lo_r // BLOCK_M) * BLOCK_M
    # [lo_rb, e1): rows above the causal/right edge (RIGHT_EDGE); [e1, f2): whole blocks of rows
    # that see every key; [f2, f3): rows past the window's left edge (LEFT_EDGE); [f3, hi_r): the
    # block holding row m_len (ROW_TAIL). Loops the launch cannot reach are compiled out.
    e1 = tl.minimum(tl.maximum(((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, lo_rb), hi_r)
    f2 = tl.maximum((full_hi // BLOCK_M) * BLOCK_M, e1)
    f3 = tl.minimum(tl.maximum((m_len // BLOCK_M) * BLOCK_M, f2), hi_r)
    MAIN_EDGE: tl.constexpr = MASK_KIND != 0  # a mask may hide any pair
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        q_ptrs = q_ptr + (b * sqb + h * sqh + q0 * sqm) + (rm[None, :] * sqm + rd[:, None] * sqd)
        do_ptrs = do_ptr + (b * sgb + h * sgh + q0 * sgm) + (rm[:, None] * sgm + rdv[None, :] * sgd)
        ref_ptrs = ref_ptr + (b * sdb + h * sdh + q0) + rm
        delta_ptrs = delta_ptr + (b * sdb + h * sdh + q0) + rm
        mask_ptrs = mask_ptr
        if MASK_KIND != 0:
            mask_ptrs = (mask_ptr + (b * smb + h * smh + tl.cast(start_n, tl.int64) * smn)
                         + (rn[:, None] * smn + rm[None, :] * smm))
        if RIGHT_EDGE:
            for start_m in tl.range(lo_rb, e1, BLOCK_M, num_stages=EDGE_STAGES):
                dk, dv = _dkdv_block(
                    dk, dv, k, v, q_ptrs, do_ptrs, ref_ptrs, delta_ptrs, mask_ptrs, start_m, sqm, sgm, smm,
                    offs_m, cols, m_len, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                    True, ROW_TAIL, ROW_GUARD, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS,
                    IS_FP32)
        for start_m in range(e1, f2, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_ptrs, do_ptrs, ref_ptrs, delta_ptrs, mask_ptrs, start_m, sqm, sgm, smm,
                offs_m, cols, m_len, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                MAIN_EDGE, False, ROW_GUARD, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
        if LEFT_EDGE:
            for start_m in tl.range(f2, f3, BLOCK_M, num_stages=EDGE_STAGES):
                dk, dv = _dkdv_block(
                    dk, dv, k, v, q_ptrs, do_ptrs, ref_ptrs, delta_ptrs, mask_ptrs, start_m, sqm, sgm, smm,
                    offs_m, cols, m_len, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                    True, False, ROW_GUARD, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
        if ROW_TAIL:
            for start_m in tl.range(f3, hi_r, BLOCK_M, num_stages=EDGE_STAGES):
                dk, dv = _dkdv_block(
                    dk, dv, k, v, q_ptrs, do_ptrs, ref_ptrs, delta_ptrs, mask_ptrs, start_m, sqm, sgm, smm,
                    offs_m, cols, m_len, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                    True, True, ROW_GUARD, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
    # Keys past n_valid: their lanes loaded 0 but unmasked blocks gave them weights; exactly 0 here.
    dk = tl.where(key_ok[:, None], dk * sc, 0.0)
    dv = tl.where(key_ok[:, None], dv, 0.0)
    out_ok = (cols < n_len)[:, None]
    store_f32(dk_ptr + (b * sab + hkv * sah + kv_row * san) + (rn[:, None] * san + rd[None, :] * sad), dk,
              out_ok & d_mask[None, :], BF16_BITS)
    store_f32(dv_ptr + (b * scb + hkv * sch + kv_row * scn) + (rn[:, None] * scn + rdv[None, :] * scd), dv,
              out_ok & dv_mask[None, :], BF16_BITS)


@triton.jit
def _dq_block(dq, q, do, ref, di, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, rows, row_ok, offs_n,
              n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
              EDGE: tl.constexpr, TAIL: tl.constexpr, SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr,
              MASK_BF16_BITS: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
              BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr):
    """One key block of the program's query rows. TAIL: keys past n_valid (loads masked); EDGE:
    pairs may be hidden (dS masked)."""
    cols = start_n + offs_n
    sn = tl.cast(start_n, tl.int64)
    key_ok = cols < n_valid
    if TAIL:
        kmask = key_ok[None, :]
        vmask = key_ok[None, :]
        if not EVEN_D:
            kmask = kmask & d_mask[:, None]
        if not EVEN_DV:
            vmask = vmask & dv_mask[:, None]
    else:
        kmask = d_mask[:, None]
        vmask = dv_mask[:, None]
    kt = _load_tile(k_ptrs + sn * skn, kmask, TAIL or not EVEN_D, BF16_BITS)  # K^T (BLOCK_D, BLOCK_N)
    vt = _load_tile(v_ptrs + sn * svn, vmask, TAIL or not EVEN_DV, BF16_BITS)  # V^T (BLOCK_DV, BLOCK_N)
    mvals = 0.0
    if MASK_KIND != 0:
        mvals = _mask_values(mask_ptrs + sn * smn, row_ok[:, None] & key_ok[None, :], MASK_KIND, MASK_BF16_BITS)
    s = _dot(q, kt, None, IS_FP32)
    p, f = _weights(s, ref[:, None], mvals, qk_scale, cap_in, cap_out, SOFTCAP, MASK_KIND)
    dp = _dot(do, vt, None, IS_FP32)
    ds = p * (dp - di[:, None])
    if SOFTCAP:
        ds = ds * f
    if EDGE:
        ds = tl.where(_visible(rows[:, None], cols[None, :], lo_off, hi_off, n_valid, mvals, TAIL, MASK_KIND),
                      ds, 0.0)
    return _dot(_to_input(ds, q, BF16_BITS, IS_FP32), tl.trans(kt), dq, IS_FP32)


@triton.jit(do_not_specialize=_STRIDES + _SIZES, do_not_specialize_on_alignment=_HEAD_DIM)
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, ref_ptr, delta_ptr, kvlen_ptr, cuq_ptr, cuk_ptr, mask_ptr,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sgb, sgh, sgm, sgd, sab, sah, san, sad,
    smb, smh, smm, smn, sdb, sdh,
    HEADS, GROUP, M, N, D, DV, qk_scale, cap_in, cap_out, sc, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, REVERSE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    STRIDE_MUL: tl.constexpr, VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr,
    MASK_BF16_BITS: tl.constexpr, BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr, EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr, WIDE: tl.constexpr, LEFT_EDGE: tl.constexpr, RIGHT_EDGE: tl.constexpr,
    KEY_TAIL: tl.constexpr, ROW_GUARD: tl.constexpr, EDGE_STAGES: tl.constexpr,
):
    sqb, sqh, sqm = sqb * STRIDE_MUL, sqh * STRIDE_MUL, sqm * STRIDE_MUL
    skb, skh, skn = skb * STRIDE_MUL, skh * STRIDE_MUL, skn * STRIDE_MUL
    svb, svh, svn = svb * STRIDE_MUL, svh * STRIDE_MUL, svn * STRIDE_MUL
    sgb, sgh, sgm = sgb * STRIDE_MUL, sgh * STRIDE_MUL, sgm * STRIDE_MUL
    sab, sah, san = sab * STRIDE_MUL, sah * STRIDE_MUL, san * STRIDE_MUL  # dq
    pid_m = tl.program_id(0)
    pid_m = pid_m + REVERSE * (tl.num_programs(0) - 1 - 2 * pid_m)  # causal: the longest rows first
    pid_bh = tl.program_id(1)
    b = (pid_bh // HEADS).to(tl.int64)  # HEADS: the query heads here
    h = (pid_bh % HEADS).to(tl.int64)
    hkv = h // GROUP
    b, q0, k0, m_len, n_len, n_valid, lo_off, hi_off = _sequence(
        b, kvlen_ptr, cuq_ptr, cuk_ptr, M, N, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= m_len:
        return
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = start_m + offs_m
    row_ok = rows < m_len
    d_mask = offs_d < D
    dv_mask = offs_dv < DV
    rn, rm, rd, rdv = offs_n, offs_m, offs_d, offs_dv
    if WIDE:
        rn, rm, rd, rdv = rn.to(tl.int64), rm.to(tl.int64), rd.to(tl.int64), rdv.to(tl.int64)
    row0 = q0 + start_m
    ref = tl.load(ref_ptr + (b * sdb + h * sdh + row0) + rm, mask=row_ok, other=float("inf"))
    live = row_ok
    if ROW_GUARD:  # rows that see no key: q, dO, D read as 0 whatever they hold
        live = row_ok & (ref != _INF)
    di = tl.load(delta_ptr + (b * sdb + h * sdh + row0) + rm, mask=live, other=0.0)
    qmask = live[:, None]
    gmask = live[:, None]
    if not EVEN_D:
        qmask = qmask & d_mask[None, :]
    if not EVEN_DV:
        gmask = gmask & dv_mask[None, :]
    q = _load_tile(q_ptr + (b * sqb + h * sqh + row0 * sqm) + (rm[:, None] * sqm + rd[None, :] * sqd), qmask, True,
                   BF16_BITS)
    do = _load_tile(do_ptr + (b * sgb + h * sgh + row0 * sgm) + (rm[:, None] * sgm + rdv[None, :] * sgd), gmask, True,
                    BF16_BITS)
    k_ptrs = k_ptr + (b * skb + hkv * skh + k0 * skn) + (rn[None, :] * skn + rd[:, None] * skd)
    v_ptrs = v_ptr + (b * svb + hkv * svh + k0 * svn) + (rn[None, :] * svn + rdv[:, None] * svd)
    mask_ptrs = mask_ptr
    if MASK_KIND != 0:
        mask_ptrs = (mask_ptr + (b * smb + h * smh + tl.cast(start_m, tl.int64) * smm)
                     + (rm[:, None] * smm + rn[None, :] * smn))
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    # The forward's key ranges (kernels/attention.py): keys of the tile [lo, hi), seen by every row
    # [full_lo, full_hi); left-edge, whole, right-edge and key-tail loops.
    r0 = start_m
    r1 = tl.minimum(start_m + BLOCK_M, m_len) - 1
    lo = tl.maximum(r0 + lo_off, 0)
    full_lo = tl.maximum(r1 + lo_off, 0)
    hi = tl.maximum(tl.minimum(n_valid, r1 + hi_off + 1), 0)
    full_hi = tl.maximum(tl.minimum(n_valid, r0 + hi_off + 1), 0)
    lo_b = (lo // BLOCK_N) * BLOCK_N
    e1 = tl.minimum(tl.maximum(((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo_b), hi)
    f2 = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, e1)
    f3 = tl.minimum(tl.maximum((n_valid // BLOCK_N) * BLOCK_N, f2), hi)
    MAIN_EDGE: tl.constexpr = MASK_KIND != 0
    if LEFT_EDGE:
        for start_n in tl.range(lo_b, e1, BLOCK_N, num_stages=EDGE_STAGES):
            dq = _dq_block(dq, q, do, ref, di, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, rows, row_ok,
                           offs_n, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                           True, KEY_TAIL, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
    for start_n in range(e1, f2, BLOCK_N):
        dq = _dq_block(dq, q, do, ref, di, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, rows, row_ok,
                       offs_n, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                       MAIN_EDGE, False, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
    if RIGHT_EDGE:
        for start_n in tl.range(f2, f3, BLOCK_N, num_stages=EDGE_STAGES):
            dq = _dq_block(dq, q, do, ref, di, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, rows, row_ok,
                           offs_n, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                           True, False, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
    if KEY_TAIL:
        for start_n in tl.range(f3, hi, BLOCK_N, num_stages=EDGE_STAGES):
            dq = _dq_block(dq, q, do, ref, di, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, rows, row_ok,
                           offs_n, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out,
                           True, True, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV, BF16_BITS, IS_FP32)
    store_f32(dq_ptr + (b * sab + h * sah + row0 * san) + (rm[:, None] * san + rd[None, :] * sad), dq * sc,
              row_ok[:, None] & d_mask[None, :], BF16_BITS)
