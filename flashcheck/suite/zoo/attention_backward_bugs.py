"""Known-bad attention backward kernels (issue 51): a correct forward, a backward wrong in one way.

Each entry is the production forward (`flashcheck.kernels.attention`) behind a
torch.autograd.Function whose backward is the production Triton backward
(`kernels/attention_backward.py: attention_backward`) fed or post-processed the way a real bug
did it: a wrong D, a dropped flag, a missing factor, a mixed-up output. BUG = NONE is the fixed
twin: exactly the production backward. The bug classes are those of /work/shared/REAL_BUGS.md
("Attention backward", items 1-13; each entry cites its item). The forward is the production one,
so every forward test passes and only the backward properties (flashcheck/properties/attention/
backward.py, run by flashcheck/suite/test_attention_backward.py) can catch them.

Each public attribute is `fn(q, k, v, **options)` with the production kernel's options and
declared capabilities (autograd, deterministic_backward, its backward blocking). Run one with
`pytest --kernel flashcheck/suite/zoo/attention_backward_bugs.py:NAME --family attention -x`.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch.autograd.function import once_differentiable

from flashcheck import kernels  # noqa: F401  (the interpreter switch, before triton)
from flashcheck.kernels import DEVICE
from flashcheck.kernels.attention import attention as _prod
from flashcheck.kernels.attention_args import _mask_view, effective_scale
from flashcheck.kernels.attention_backward import attention_backward as _prod_backward
from flashcheck.kernels.attention_backward_config import bwd_config
from flashcheck.suite.zoo.kernel import ZooKernel

(NONE, DELTA_ROWSUM_DO, DQ_SCALE_MISSING, GQA_FIRST_HEAD, CAUSAL_DROPPED, NONCAUSAL_AS_CAUSAL, WINDOW_DROPPED,
 KV_LENS_DROPPED, EMPTY_ROW_NAN, SOFTCAP_FACTOR_MISSING, DK_DV_SWAPPED, FP32_TF32, DV_HEAD_TAIL, DO_STRIDES_IGNORED) = range(14)

_BACKWARD_OPTIONS = ("causal", "scale", "window", "softcap", "causal_align")


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to TF32 (10 mantissa bits, nearest, ties away): what tl.dot's default reads."""
    bits = x.contiguous().view(torch.int32)
    r = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x) & torch.isfinite(r), r, x)


def _contiguous_reading(t: torch.Tensor) -> torch.Tensor:
    """t's storage read from its offset with contiguous strides: a kernel that takes dO's data
    pointer and ignores its strides. The same tensor where its storage is too short for that (a
    real kernel reads past it)."""
    strides, acc = [], 1
    for s in reversed(t.shape):
        strides.append(acc)
        acc *= s
    strides = tuple(reversed(strides))
    if t.untyped_storage().nbytes() // t.element_size() < t.storage_offset() + t.numel():
        return t
    return torch.as_strided(t, t.shape, strides, t.storage_offset())


def _backward(bug: int, q, k, v, o, lse, do, *, kv_lens=None, attn_mask=None, causal=False, scale=None, window=None,
              softcap=None, causal_align="top_left"):
    """(dq, dk, dv): the production backward, with `bug` switched on."""
    opts = dict(kv_lens=kv_lens, attn_mask=attn_mask, causal=causal, scale=scale, window=window, softcap=softcap,
                causal_align=causal_align)
    run = lambda q=q, k=k, v=v, o=o, lse=lse, do=do, **ch: _prod_backward(q, k, v, o, lse, do, **{**opts, **ch})  # noqa: E731
    B, Hq, M, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    if bug == DELTA_ROWSUM_DO:
        # D = rowsum(dO) instead of rowsum(dO * O): the O factor dropped (the delta kernel fed ones)
        return run(o=torch.ones_like(o))
    if bug == DQ_SCALE_MISSING:
        dq, dk, dv = run()
        sc = effective_scale(scale, D)
        return (dq.float() / sc).to(dq.dtype), dk, dv
    if bug == GQA_FIRST_HEAD and Hq > Hkv:
        dq, _, _ = run()
        g = Hq // Hkv
        mask = _mask_view(attn_mask, (B, Hq, M, N), q)[:, ::g] if attn_mask is not None else None
        _, dk, dv = run(q=q[:, ::g], o=o[:, ::g], lse=lse[:, ::g], do=do[:, ::g], attn_mask=mask)
        return dq, dk, dv
    if bug == CAUSAL_DROPPED and causal:
        return run(causal=False)
    if bug == NONCAUSAL_AS_CAUSAL and not causal:
        return run(causal=True)
    if bug == WINDOW_DROPPED and window is not None:
        return run(window=None)
    if bug == KV_LENS_DROPPED and kv_lens is not None:
        return run(kv_lens=None)
    if bug == EMPTY_ROW_NAN:
        # P = exp(s - lse) multiplied by the mask instead of selected: exp(s + inf) * 0 = NaN for a
        # row that sees no key (lse = -inf); that row's dq is NaN
        dq, dk, dv = run()
        empty = (lse == float("-inf"))[..., None]
        return torch.where(empty, torch.full_like(dq, float("nan")), dq), dk, dv
    if bug == SOFTCAP_FACTOR_MISSING and softcap:
        # dS = P (dP - D) without softcap's chain factor 1 - tanh^2: the production backward run
        # uncapped on a float bias that makes its P the capped one (natural units, fp32)
        sc = effective_scale(scale, D)
        g = Hq // Hkv
        s = torch.einsum("bhmd,bhnd->bhmn", q.float(), k.float().repeat_interleave(g, dim=1)) * sc
        bias = softcap * torch.tanh(s / softcap) - s
        if attn_mask is not None:
            m4 = _mask_view(attn_mask, (B, Hq, M, N), q)
            bias = torch.where(m4, bias, float("-inf")) if m4.dtype == torch.bool else bias + m4.float()
        return run(softcap=None, attn_mask=bias.contiguous())
    if bug == DK_DV_SWAPPED:
        dq, dk, dv = run()
        return (dq, dv, dk) if dk.shape == dv.shape else (dq, dk, dv)
    if bug == FP32_TF32 and q.dtype == torch.float32:
        return run(q=_tf32(q), k=_tf32(k), v=_tf32(v), do=_tf32(do))
    if bug == DV_HEAD_TAIL and Hkv > 1:
        # heads 1.. lose dv's first (BLOCK - N % BLOCK) % BLOCK keys (REAL_BUGS 6 with 64-key blocks)
        dq, dk, dv = run()
        block = bwd_config(D, q.dtype, dv=v.shape[3]).block_n
        t = (block - N % block) % block
        if t:
            dv = dv.clone()
            dv[:, 1:, :t] = 0
        return dq, dk, dv
    if bug == DO_STRIDES_IGNORED:
        return run(do=_contiguous_reading(do))
    return run()


class _ZooAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kv_lens, attn_mask, bug, options):
        o, lse = _prod(q, k, v, kv_lens=kv_lens, attn_mask=attn_mask, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, o, lse, kv_lens, attn_mask)
        ctx.bug, ctx.options = bug, options
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, kv_lens, attn_mask = ctx.saved_tensors
        opts = {n: ctx.options[n] for n in _BACKWARD_OPTIONS if n in ctx.options}
        dq, dk, dv = _backward(ctx.bug, q, k, v, o, lse, do, kv_lens=kv_lens, attn_mask=attn_mask, **opts)
        return dq, dk, dv, None, None, None, None


def _attention(q, k, v, *, bug: int = NONE, kv_lens=None, attn_mask=None, return_lse=False, **options):
    if not (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))):
        return _prod(q, k, v, kv_lens=kv_lens, attn_mask=attn_mask, return_lse=return_lse, **options)
    o, lse = _ZooAttention.apply(q, k, v, kv_lens, attn_mask, bug, options)
    return (o, lse) if return_lse else o


def _backward_blocking(head_dim, head_dim_v, m, n, dtype, options):
    from flashcheck.kernels.attention_backward_config import bound_blocks

    return bound_blocks(head_dim, dtype, dv=head_dim_v, window=options.get("window"),
                        attn_mask=options.get("attn_mask"))


# What each entry declares (external-kernel capability keys): the production backward's.
CAPS = {"autograd": True, "deterministic_backward": True, "backward_blocks": _backward_blocking}


def delta_rowsum_do(q, k, v, **kw):
    """D = rowsum(dO) instead of rowsum(dO * O) in dS = P (dP - D): the O factor dropped from the
    delta kernel. dq and dk wrong by P (D - rowsum(dO)) terms that vanish when O is close to ones;
    the wrong-dq-on-some-inputs class of REAL_BUGS attention 2 (TransformerEngine #3216)."""
    return _attention(q, k, v, bug=DELTA_ROWSUM_DO, **kw)


def dq_scale_missing(q, k, v, **kw):
    """dq not multiplied by the softmax scale (dk is): dq off by 1 / scale (4x at D = 16, 8x at D =
    64), invisible at scale = 1. REAL_BUGS attention 2 (dQ about 5x too large, TransformerEngine
    #3216)."""
    return _attention(q, k, v, bug=DQ_SCALE_MISSING, **kw)


def gqa_dkdv_first_head(q, k, v, **kw):
    """GQA/MQA dk, dv not summed over the group: each kv head gets only its group's first query
    head. REAL_BUGS attention 5 (varlen GQA backward splitting the head index by the wrong count,
    native-sparse-attention-triton #27)."""
    return _attention(q, k, v, bug=GQA_FIRST_HEAD, **kw)


def causal_dropped_in_backward(q, k, v, **kw):
    """Causal mask applied in the forward but not in the backward's recomputed P: future keys get
    weights exp(s - lse). REAL_BUGS attention 7 (a mask flag lost in the backward launch, MSLK PR
    #263) and 1 (causal and non-causal backward paths that differ, triton #4174, #5660)."""
    return _attention(q, k, v, bug=CAUSAL_DROPPED, **kw)


def noncausal_takes_causal_path(q, k, v, **kw):
    """The backward wrong for causal=False: the non-causal launch takes the causal loop bounds, so
    keys past the diagonal get no gradient and dq misses their terms. REAL_BUGS attention 1
    (triton #4174, #5660: tests covered causal=True only)."""
    return _attention(q, k, v, bug=NONCAUSAL_AS_CAUSAL, **kw)


def window_dropped_in_backward(q, k, v, **kw):
    """Sliding-window backward run without the window (the flag expression always False): keys
    outside the band get weights exp(s - lse). REAL_BUGS attention 7 (MSLK PR #263)."""
    return _attention(q, k, v, bug=WINDOW_DROPPED, **kw)


def kv_lens_dropped_in_backward(q, k, v, **kw):
    """kv_lens honoured by the forward but not the backward: padded keys get nonzero dk, dv and
    add to dq. REAL_BUGS attention 13 (gradients of padded rows and keys, cudnn-frontend #385,
    #676; FlashAttention 3/4's varlen tests overwrite padded gradients, so they never see it)."""
    return _attention(q, k, v, bug=KV_LENS_DROPPED, **kw)


def empty_row_nan(q, k, v, **kw):
    """NaN instead of zeros in dq for a row that sees no key: P = exp(s - lse) with lse = -inf
    masked by a multiplication (inf * 0) instead of a select. REAL_BUGS attention 13
    (cudnn-frontend #385, #676) and 8 (NaN with a mask past the sequence, pytorch #136232)."""
    return _attention(q, k, v, bug=EMPTY_ROW_NAN, **kw)


def softcap_chain_factor_missing(q, k, v, **kw):
    """Softcap's chain factor 1 - tanh^2(s / c) missing from dS: dq, dk too large wherever the cap
    saturates. REAL_BUGS attention 9 (tokamax PR #1121; FlashAttention PR #2402's softcap with no
    backward)."""
    return _attention(q, k, v, bug=SOFTCAP_FACTOR_MISSING, **kw)


def dk_dv_swapped(q, k, v, **kw):
    """dk and dv returned swapped by the wrapper: a shape error when D != Dv, silent when D = Dv.
    REAL_BUGS attention 10 (K/V transposed twice in a backward wrapper, hidden by square shapes,
    diffusers PR #14341)."""
    return _attention(q, k, v, bug=DK_DV_SWAPPED, **kw)


def fp32_backward_tf32(q, k, v, **kw):
    """fp32 backward dots on TF32 operands (tl.dot's default input_precision): q, k, v, dO read
    with 10 mantissa bits, 2^-11 relative error where the fp32 bound allows ~2^-24 n. REAL_BUGS
    attention 12 (triton_docs_tutorials #6: an fp32 backward off by 0.72)."""
    return _attention(q, k, v, bug=FP32_TF32, **kw)


def dv_head_tail(q, k, v, **kw):
    """dv wrong (zero) for kv heads 1..H-1 on the first (BLOCK - N % BLOCK) % BLOCK keys when N is
    not a multiple of the key block (the head offset computed from the padded length). REAL_BUGS
    attention 6 (FlagGems PR #898)."""
    return _attention(q, k, v, bug=DV_HEAD_TAIL, **kw)


def do_strides_ignored(q, k, v, **kw):
    """dO's strides ignored: the backward reads dO's storage as if contiguous (a transposed or
    padded dO gives another tensor's values). REAL_BUGS attention 8 (garbage K.grad for some
    strides, pytorch #146377) and CE 11 (strides ignored, Torch-FL PR #172)."""
    return _attention(q, k, v, bug=DO_STRIDES_IGNORED, **kw)


# ---- triggers (tests/test_zoo.py: the broken backward fails a backward property, the twin none) ---

def _t(*shape, seed, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def _case(b=1, hq=2, hkv=2, m=20, n=20, d=16, dv=None, seed=0, dtype=torch.float32, **kw):
    dv = dv or d
    q, k, v = _t(b, hq, m, d, seed=seed, dtype=dtype), _t(b, hkv, n, d, seed=seed + 1, dtype=dtype), \
        _t(b, hkv, n, dv, seed=seed + 2, dtype=dtype)
    return dict(q=q, k=k, v=v, do=_t(b, hq, m, dv, seed=seed + 3, dtype=dtype), **kw)


def _trigger_plain():
    return _case()


def _trigger_gqa():
    return _case(hq=6, hkv=2, m=12, n=20)


def _trigger_causal():
    return _case(causal=True)


def _trigger_window():
    return _case(window=(2, 1))


def _trigger_kv_lens():
    return _case(b=2, kv_lens=torch.tensor([7, 20], dtype=torch.int32, device=DEVICE))


def _trigger_empty_rows():
    return _case(b=2, kv_lens=torch.tensor([0, 20], dtype=torch.int32, device=DEVICE))


def _trigger_softcap():
    c = _case(seed=4)
    c["q"], c["k"] = c["q"] * 4, c["k"] * 4
    return dict(c, softcap=2.0)


def _trigger_dv_tail():
    return _case(n=17)


def _trigger_strided_do():
    c = _case()
    c["do"] = c["do"].transpose(2, 3).contiguous().transpose(2, 3)  # (b, h, d, m) storage
    return c


_CLASSES = {
    "delta_rowsum_do": ("D = rowsum(dO) without O (attention backward 2)", _trigger_plain, "backward_matches_oracle"),
    "dq_scale_missing": ("dq missing the softmax scale (attention backward 2)", _trigger_plain,
                         "backward_matches_oracle"),
    "gqa_dkdv_first_head": ("GQA dk, dv not summed over the group (attention backward 5)", _trigger_gqa,
                            "backward_matches_oracle"),
    "causal_dropped_in_backward": ("causal mask dropped in the backward (attention backward 7, 1)", _trigger_causal,
                                   "backward_matches_oracle"),
    "noncausal_takes_causal_path": ("backward wrong for causal=False (attention backward 1)", _trigger_plain,
                                    "backward_matches_oracle"),
    "window_dropped_in_backward": ("sliding window dropped in the backward (attention backward 7)", _trigger_window,
                                   "backward_matches_oracle"),
    "kv_lens_dropped_in_backward": ("padded keys get gradients (attention backward 13)", _trigger_kv_lens,
                                    "backward_matches_oracle"),
    "empty_row_nan": ("NaN dq for rows that see no key (attention backward 13, 8)", _trigger_empty_rows,
                      "backward_matches_oracle"),
    "softcap_chain_factor_missing": ("softcap chain factor missing (attention backward 9)", _trigger_softcap,
                                     "backward_matches_oracle"),
    "dk_dv_swapped": ("dk, dv swapped by the wrapper (attention backward 10)", _trigger_plain,
                      "backward_matches_oracle"),
    "fp32_backward_tf32": ("fp32 backward dots in TF32 (attention backward 12)", _trigger_plain,
                           "backward_matches_oracle"),
    "dv_head_tail": ("dv wrong for heads 1.. on the first keys (attention backward 6)", _trigger_dv_tail,
                     "backward_matches_oracle"),
    "do_strides_ignored": ("dO strides ignored (attention backward 8)", _trigger_strided_do,
                           "backward_matches_oracle"),
}

ZOO: dict[str, ZooKernel] = {}
for _name, (_cls, _trig, _hint) in _CLASSES.items():
    _fn = globals()[_name]
    _fn.flashcheck = dict(CAPS)
    ZOO[_name] = ZooKernel(
        name=_name, family="attention", bug_class=_cls, references=" ".join(inspect.getdoc(_fn).split()),
        broken=_fn, fixed=functools.partial(_attention, bug=NONE), trigger=_trig, caps=dict(CAPS),
        property_hint=_hint, module="attention_backward_bugs", backward=True,
    )

__all__ = list(ZOO)
