"""The attention backward kernel (kernels/attention_backward.py) against the correctly rounded
oracle (oracles/attention_backward.py) within the FA2 bound (oracles/attention_backward_bound.py,
docs/NUMERICS.md 10.4), and the autograd path of `attention` / `attention_varlen`.

The bound gets the kernel's real blocks (`bound_blocks`: the dK/dV kernel's query block, the dQ
kernel's key block, for the call's options) and the forward's own error bounds at the forward's real key
blocking (`kernels.specs._attention_blocking`), not the bound's default, which assumes a forward
blocked like the backward. Small shapes with M, N off the block sizes; the interpreter runs them."""
from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from flashcheck.kernels import DEVICE
from flashcheck.kernels.attention import attention, attention_varlen
from flashcheck.kernels.attention_backward_config import bound_blocks
from flashcheck.kernels.specs import _attention_blocking
from flashcheck.oracles.attention_backward import attention_backward_quantities
from flashcheck.oracles.attention_backward_bound import _forward_errors, attention_backward_bound
from flashcheck.oracles.formats import format_of, ulp_of

B_ = importlib.import_module("flashcheck.kernels.attention_backward")  # the package exports the function
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = ["fp16", "bf16", "fp32"]
BACKWARD_OPTIONS = ("causal", "scale", "kv_lens", "window", "softcap", "attn_mask", "causal_align")


def _inputs(seed, dtype, B=2, Hq=2, Hkv=2, M=37, N=29, D=16, Dv=None, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    q = (torch.randn(B, Hq, M, D, generator=g) * spread).to(dtype)
    k = torch.randn(B, Hkv, N, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, N, Dv, generator=g).to(dtype)
    do = torch.randn(B, Hq, M, Dv, generator=g).to(dtype)
    return tuple(t.to(DEVICE) for t in (q, k, v, do))


def _forward(q, k, v, **opts):
    with torch.no_grad():
        return attention(q, k, v, return_lse=True, **opts)


def _bounds(r, q, k, v, **opts):
    """The bound at the kernel's blocks, with the forward's errors at the forward's blocking."""
    D, Dv, N = q.shape[-1], v.shape[-1], k.shape[2]
    fwd_block_n, _ = _attention_blocking(D, N, q.dtype, opts)
    o_err, lse_err = _forward_errors(r, fwd_block_n)
    block_m, block_n = bound_blocks(D, q.dtype, dv=Dv, **opts)
    return attention_backward_bound(r, block_m=block_m, block_n=block_n, o_err=o_err, lse_err=lse_err)


def _within(got, r, bounds) -> list[float]:
    """Each gradient within its bound, NaN exactly where the oracle's is; the worst error/bound."""
    worst = []
    for name, g, want, bnd in zip(("dq", "dk", "dv"), got, r.grads, bounds):
        g = g.detach().double().cpu().numpy()
        assert np.array_equal(np.isnan(g), np.isnan(want)), f"{name}: NaN where the oracle has none, or not NaN"
        ok = ~np.isnan(want)
        err = np.abs(g - want)[ok]
        assert np.all(err <= bnd[ok]), (name, float(np.max(err / np.where(bnd[ok] > 0, bnd[ok], 1e-300))))
        worst.append(float(np.max(err / np.where(bnd[ok] > 0, bnd[ok], np.inf), initial=0.0)))
    return worst


def _check(q, k, v, do, **opts):
    """Run forward and backward, check against the oracle; returns (dq, dk, dv) and the oracle."""
    o, lse = _forward(q, k, v, **opts)
    got = B_.attention_backward(q, k, v, o, lse, do, **{n: opts[n] for n in BACKWARD_OPTIONS if n in opts})
    r = attention_backward_quantities(q, k, v, do, **{n: opts[n] for n in BACKWARD_OPTIONS if n in opts})
    worst = _within(got, r, _bounds(r, q, k, v, **opts))
    print(f"\n{q.dtype} error/bound max: dq {worst[0]:.3g} dk {worst[1]:.3g} dv {worst[2]:.3g}")  # shown with -s
    return got, r


def _bool_mask(seed, B, Hq, M, N):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, 1, M, N, generator=g) > 0.4
    m[0, :, 3] = False  # a row that sees nothing
    m[:, :, :, 5] = False  # a key no row sees
    return m.to(DEVICE)


def _float_mask(seed, B, Hq, M, N, dtype):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(B, Hq, M, N, generator=g) * 3
    m[m < -4] = -math.inf
    m[1, 0, 6] = -math.inf  # a row that sees nothing
    m[:, :, :, 2] = -math.inf  # a key no row sees
    m[0, 1, 9] = -1e4  # a row masked whole by a finite bias: the bias cancels
    return m.to(dtype).to(DEVICE)


CASES = {
    "plain": (dict(), dict()),
    "causal": (dict(), dict(causal=True)),
    "causal_bottom_right": (dict(M=20, N=33), dict(causal=True, causal_align="bottom_right")),
    "causal_bottom_right_empty_rows": (dict(M=33, N=20), dict(causal=True, causal_align="bottom_right")),
    "kv_lens": (dict(), dict(kv_lens=[0, 19])),
    "gqa_4_2": (dict(Hq=4, Hkv=2, B=1), dict(causal=True)),
    "mqa": (dict(Hq=4, Hkv=1, B=1), dict()),
    "dv_ne_d": (dict(D=20, Dv=9), dict()),
    "window": (dict(), dict(window=(5, 2))),
    "window_left_bottom_right": (dict(M=21, N=34), dict(window=(6, -1), causal=True, causal_align="bottom_right")),
    "softcap": (dict(spread=3.0), dict(softcap=2.5)),
    "bool_mask": (dict(), dict(attn_mask="bool")),
    "float_mask": (dict(), dict(attn_mask="float")),
    "float_mask_softcap": (dict(spread=2.0), dict(attn_mask="float", softcap=4.0)),
    "scale": (dict(), dict(scale=0.37)),
    "seqlen_k_1": (dict(N=1), dict()),
}
# Every case in fp16; these in all three dtypes (the rest in bf16/fp32 under -m slow).
ALL_DTYPES = {"plain", "causal_bottom_right_empty_rows", "kv_lens", "gqa_4_2", "float_mask"}


def _case(name, dtype, seed):
    shape, opts = CASES[name]
    q, k, v, do = _inputs(seed, dtype, **shape)
    B, Hq, M, N = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    opts = dict(opts)
    if opts.get("attn_mask") == "bool":
        opts["attn_mask"] = _bool_mask(seed, B, Hq, M, N)
    elif opts.get("attn_mask") == "float":
        opts["attn_mask"] = _float_mask(seed, B, Hq, M, N, dtype)
    if "kv_lens" in opts:
        opts["kv_lens"] = torch.tensor(opts["kv_lens"], device=DEVICE)
        for b, n in enumerate(opts["kv_lens"].tolist()):  # what is stored past kv_lens never counts
            k[b, :, n:] = float("nan")
            v[b, :, n:] = float("inf")
        q[0, 1], do[0, 0] = float("nan"), float("nan")  # rows of batch 0 see no key: whatever they hold
    return q, k, v, do, opts


def _params():
    out = []
    for name in CASES:
        for dtype, i in zip(DTYPES, IDS):
            marks = () if (dtype == torch.float16 or name in ALL_DTYPES) else (pytest.mark.slow,)
            out.append(pytest.param(name, dtype, id=f"{name}-{i}", marks=marks))
    return out


@pytest.mark.parametrize("name,dtype", _params())
def test_matches_oracle_within_bound(name: str, dtype: torch.dtype) -> None:
    q, k, v, do, opts = _case(name, dtype, 3 + list(CASES).index(name))
    (dq, dk, dv), r = _check(q, k, v, do, **opts)
    # Structural zeros are exact +0 or -0 (bound 0 there), never NaN: padded keys, keys no row sees,
    # rows that see nothing.
    for g, special, want in ((dq, r.dq_special, r.dq), (dk, r.dk_special, r.dk), (dv, r.dv_special, r.dv)):
        zero = special & (want == 0)
        assert (g.double().cpu().numpy()[zero] == 0).all()
    if name == "kv_lens":
        assert (dk[0] == 0).all() and (dv[0] == 0).all() and (dk[1, :, 19:] == 0).all()
        assert (dq[0] == 0).all()


def test_head_dim_256_and_odd_dims() -> None:
    q, k, v, do = _inputs(40, torch.float16, B=1, Hq=2, Hkv=1, M=18, N=21, D=256, Dv=130)
    _check(q, k, v, do, causal=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_large_head_dims_every_dtype(dtype: torch.dtype) -> None:
    for D, Dv in ((256, 256), (200, 72), (5, 3)):
        q, k, v, do = _inputs(41 + D, dtype, B=1, Hq=2, Hkv=2, M=19, N=23, D=D, Dv=Dv)
        _check(q, k, v, do, window=(7, 3))


def test_a_negative_scale_mirrors_a_positive_one() -> None:
    """scale -s on q is scale s on -q (every product exactly negated): dq negated, dk, dv equal, bit
    for bit; and within the bound against the oracle itself (the bound takes |sc|)."""
    q, k, v, do = _inputs(45, torch.bfloat16, B=1, Hq=2, Hkv=1, M=17, N=22)
    (dq, dk, dv), _ = _check(-q, k, v, do, scale=0.6, causal=True)
    got, _ = _check(q, k, v, do, scale=-0.6, causal=True)
    assert torch.equal(got[0], -dq) and torch.equal(got[1], dk) and torch.equal(got[2], dv)


def test_gqa_equals_repeated_heads_summed() -> None:
    """GQA's dq is MHA's with k, v repeated, bit for bit (the same arithmetic per query head); its
    dk, dv are the group's sums, within the two calls' bounds and the oracles' own roundings."""
    dtype = torch.float32
    q, k, v, do = _inputs(50, dtype, B=1, Hq=4, Hkv=2, M=23, N=26)
    (dq, dk, dv), r = _check(q, k, v, do, causal=True)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    (dq_m, dk_m, dv_m), r_m = _check(q, kr, vr, do, causal=True)
    assert torch.equal(dq, dq_m)
    fmt = format_of(dtype)
    b_g, b_m = _bounds(r, q, k, v, causal=True), _bounds(r_m, q, kr, vr, causal=True)
    for i, (g, m) in enumerate(((dk, dk_m), (dv, dv_m))):
        summed = m.double().reshape(1, 2, 2, *m.shape[2:]).sum(2).numpy()
        # |gqa - sum| <= |gqa - exact| + sum |mha_h - exact_h|, each within bound + half an ulp
        tol = (b_g[1 + i] + ulp_of(np.abs(r.grads[1 + i]), fmt) / 2
               + (b_m[1 + i] + ulp_of(np.abs(r_m.grads[1 + i]), fmt) / 2).reshape(summed.shape[:1] + (2, 2)
                                                                                  + summed.shape[2:]).sum(2))
        assert np.all(np.abs(g.double().numpy() - summed) <= tol)


def test_varlen_equals_each_sequence_alone() -> None:
    """Bit for bit the dense backward of each sequence (blocks start at each sequence's first row),
    empty sequences included; packed rows past the last sequence get 0."""
    g = torch.Generator().manual_seed(60)
    cu_q = torch.tensor([0, 5, 5, 30, 31], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 7, 19, 19, 36], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(*s, generator=g) for s in ((34, 4, 16), (38, 2, 16), (38, 2, 8)))
    q, k, v = (t.to(torch.bfloat16).to(DEVICE) for t in (q, k, v))
    opts = dict(causal=True, causal_align="bottom_right", window=(9, -1))
    with torch.no_grad():
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=25, max_seqlen_k=17, return_lse=True, **opts)
    do = torch.randn(o.shape, generator=g).to(o.dtype).to(DEVICE)
    dq, dk, dv = B_.attention_varlen_backward(q, k, v, o, lse, do, cu_q, cu_k, max_seqlen_q=25, max_seqlen_k=17,
                                              **opts)
    seq = lambda t, a, b: t[a:b].transpose(0, 1).unsqueeze(0)  # noqa: E731
    for b in range(4):
        (qa, qb), (ka, kb) = cu_q[b:b + 2].tolist(), cu_k[b:b + 2].tolist()
        qs, ks, vs, dos = seq(q, qa, qb), seq(k, ka, kb), seq(v, ka, kb), seq(do, qa, qb)
        os_, lses = _forward(qs, ks, vs, **opts)
        want = B_.attention_backward(qs, ks, vs, os_, lses, dos, **opts)
        for got, w, (a, e) in zip((dq, dk, dv), want, ((qa, qb), (ka, kb), (ka, kb))):
            assert torch.equal(seq(got, a, e), w), b
    assert (dq[31:] == 0).all() and (dk[36:] == 0).all() and (dv[36:] == 0).all()


def test_strided_inputs_and_output_gradient() -> None:
    """BSHD views, slices and a broadcast (stride 0) dO give the bits of contiguous inputs."""
    dtype = torch.float16
    q, k, v, do = _inputs(70, dtype, B=2, Hq=2, Hkv=1, M=21, N=18, D=12)
    o, lse = _forward(q, k, v, causal=True)
    want = B_.attention_backward(q, k, v, o, lse, do, causal=True)
    big = lambda t: torch.full((t.shape[0], t.shape[2] + 3, t.shape[1], t.shape[3] + 5), float("nan"),  # noqa: E731
                               dtype=t.dtype, device=DEVICE)
    views = []
    for t in (q, k, v, o, do):
        b = big(t)
        b[:, 2:2 + t.shape[2], :, 1:1 + t.shape[3]] = t.transpose(1, 2)
        views.append(b[:, 2:2 + t.shape[2], :, 1:1 + t.shape[3]].transpose(1, 2))
    got = B_.attention_backward(*views[:4], lse.transpose(1, 2).contiguous().transpose(1, 2), views[4], causal=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    ones = torch.ones(1, 1, 1, 1, dtype=dtype, device=DEVICE).expand_as(o)  # what o.sum().backward() passes
    r = attention_backward_quantities(q, k, v, ones, causal=True)
    _within(B_.attention_backward(q, k, v, o, lse, ones, causal=True), r, _bounds(r, q, k, v, causal=True))


def test_repeat_runs_are_bit_identical() -> None:
    q, k, v, do = _inputs(80, torch.bfloat16, B=1, Hq=4, Hkv=2, M=35, N=40)
    o, lse = _forward(q, k, v, window=(11, 4))
    first = B_.attention_backward(q, k, v, o, lse, do, window=(11, 4))
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(first, B_.attention_backward(q, k, v, o, lse, do, window=(11, 4))))


@pytest.mark.parametrize("forward_options", [dict(), dict(num_splits=2, pack_gqa=True)], ids=["plain", "split_packed"])
def test_autograd_equals_the_explicit_backward(forward_options: dict) -> None:
    q, k, v, do = _inputs(90, torch.float16, B=2, Hq=4, Hkv=2, M=9, N=37)
    mask = _bool_mask(90, 2, 4, 9, 37)
    opts = dict(causal=True, causal_align="bottom_right", softcap=3.0, attn_mask=mask)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attention(*leaves, return_lse=True, **opts, **forward_options)
    assert o.requires_grad and not lse.requires_grad
    o.backward(do)
    o_ref, lse_ref = _forward(q, k, v, **opts, **forward_options)
    assert torch.equal(o.detach(), o_ref) and torch.equal(lse, lse_ref)
    want = B_.attention_backward(q, k, v, o_ref, lse_ref, do, **opts)
    assert all(torch.equal(t.grad, w) for t, w in zip(leaves, want))
    # only k needs a gradient: no dq is computed or returned
    kk = k.clone().requires_grad_()
    attention(q, kk, v, **opts, **forward_options).backward(do)
    assert torch.equal(kk.grad, want[1])


def test_varlen_autograd_equals_the_explicit_backward() -> None:
    g = torch.Generator().manual_seed(95)
    cu_q = torch.tensor([0, 11, 30], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 20, 27], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(*s, generator=g) for s in ((30, 2, 16), (27, 1, 16), (27, 1, 16)))
    do = torch.randn(30, 2, 16, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kw = dict(max_seqlen_q=19, max_seqlen_k=20, causal=True)
    attention_varlen(*leaves, cu_q, cu_k, **kw).backward(do)
    with torch.no_grad():
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    want = B_.attention_varlen_backward(q, k, v, o, lse, do, cu_q, cu_k, **kw)
    assert all(torch.equal(t.grad, w) for t, w in zip(leaves, want))


def test_a_mask_that_requires_grad_is_one_clear_error() -> None:
    q, k, v, do = _inputs(99, torch.float32, B=1, Hq=1, Hkv=1, M=4, N=5)
    mask = torch.zeros(4, 5, device=DEVICE, requires_grad=True)
    o, lse = _forward(q, k, v)
    for call in (lambda: attention(q.requires_grad_(), k, v, attn_mask=mask),
                 lambda: B_.attention_backward(q, k, v, o, lse, do, attn_mask=mask)):
        with pytest.raises(ValueError) as info:
            call()
        assert "no gradient" in str(info.value) and "\n" not in str(info.value)


def test_bad_arguments_are_one_line_errors() -> None:
    q, k, v, do = _inputs(98, torch.float32, B=1, Hq=2, Hkv=1, M=4, N=5)
    o, lse = _forward(q, k, v)
    bad = {"o shape": dict(o=o[:, :1]), "do dtype": dict(do=do.half()), "lse dtype": dict(lse=lse.double()),
           "lse shape": dict(lse=lse[..., :3]), "window": dict(window=(1,)), "block_n": dict(block_n=24)}
    for name, over in bad.items():
        args = dict(q=q, k=k, v=v, o=o, lse=lse, do=do) | over
        tensors = [args.pop(n) for n in ("q", "k", "v", "o", "lse", "do")]
        with pytest.raises((TypeError, ValueError)) as info:
            B_.attention_backward(*tensors, **args)
        assert "\n" not in str(info.value), name
