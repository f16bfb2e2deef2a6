"""The attention backward strategies' building blocks, on top of the forward's (`attention_build`):
the output gradient dO (its values, its own layout, added to a forward case), the size limits the
CPU oracle can afford, a float64 reference of the backward's intermediates (for classes that aim at
a value of P, dP - D or the gradients' size), and the peaked q/k of the confident and tied classes.
The classes are in `attention_backward.py`.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels._runtime import INTERPRET
from flashcheck.oracles.attention import visibility
from flashcheck.oracles.formats import FP32, Format

from .attention import is_varlen
from .attention_build import (
    LAYOUTS, Caps, Limits, _bh, _caps, _causal, _fmt, _head_dim, _key_len, _lengths, _lim, _normal, _Parts,
    _storage_offset, _value_dim, geometry_layout, place,
)
from .case import Case
from .floats import backgrounds, representable

#: dO's layouts: the forward's, and "transposed", a (B, H, Dv, M) buffer seen as (B, H, M, Dv) (dO
#: handed over as the transpose of another op's output: its head dim is the strided one).
DO_LAYOUTS = (*LAYOUTS, "transposed")
VARLEN_DO_LAYOUTS = ("bshd", "padded", "dstep")  # a packed (total_q, Hq, Dv) tensor's


# ---- limits ------------------------------------------------------------------------------------
#
# The oracle's float64 fast path decides nearly every element of fp16/bf16 gradients; for fp32 it
# leaves about 1e-5 of them to the exact path, and one undecided dk element evaluates every row of
# its key/value head in ball arithmetic (about M N exps at 64+ bits: 0.4 s at 64 x 64, against 3 ms
# for the fast path). So fp32 draws smaller heads, and classes that put cancellation everywhere (dS
# exactly or nearly 0) cap their sizes further (`cheap`, `fold`). On a GPU the oracle still runs on
# the CPU: the forward's GPU limits (M 192, N 512, D 256) are out of its reach; M <= 160 still puts
# several query tiles in a launch, N <= 128 two 64-key blocks (a dk/dv kernel's loop), and D <= 128
# covers the head dims most kernels compile (0.8 s a case at most, measured on CPU draws).

def backward_limits(dtype) -> Limits:
    """The default limits of every class for `dtype` (a caller's explicit limits replace them)."""
    fp32 = _fmt(dtype) == FP32
    if INTERPRET:
        return Limits(max_bh=2, max_m=32 if fp32 else 64, max_n=32 if fp32 else 64,
                      max_head_dim=32 if fp32 else 64)
    return Limits(max_bh=2, max_m=48 if fp32 else 160, max_n=32 if fp32 else 128,
                  max_head_dim=64 if fp32 else 128)


def blim(dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None) -> Limits:
    """The forward's `_lim` with the backward's defaults."""
    d = backward_limits(dtype)
    return _lim(max_m or d.max_m, max_n or d.max_n, max_head_dim or d.max_head_dim, max_bh or d.max_bh, shapes)


def setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes) -> tuple[Caps, Format, Limits]:
    """A class's capabilities, format and limits from its arguments."""
    return _caps(caps), _fmt(dtype), blim(dtype, max_m, max_n, max_head_dim, max_bh, shapes)


def cheap(lim: Limits, *, m: int | None = None, n: int | None = None, d: int | None = None) -> Limits:
    """`lim` capped at m, n, d (a class whose gradients go to the oracle's exact path)."""
    cap = lambda x, c: x if c is None else min(x, c)  # noqa: E731
    return replace(lim, max_m=cap(lim.max_m, m), max_n=cap(lim.max_n, n), max_head_dim=cap(lim.max_head_dim, d))


def fold(sizes: tuple[int, ...], caps: dict, *, lo: dict | None = None) -> tuple[int, int, int, int, int]:
    """(B, H, M, N, D) drawn at a class's limits, each of M, N, D above its cap in `caps` wrapped
    back into [lo, cap]. A mode with caps of its own then makes the same draws as the others, so
    the shrinker still prefers the first mode (caps that narrowed the draws themselves changed
    which draws were made and let a later, capped mode be the shorter, "simpler", sequence)."""
    b, h, *rest = sizes
    lo = lo or {}
    out = []
    for name, x in zip("mnd", rest):
        c, a = caps.get(name), lo.get(name, 1)
        out.append(x if c is None or x <= c else a + (x - a) % (c - a + 1))
    return (b, h, *out)


@composite
def dims(draw, lim: Limits, *, min_m: int = 1, min_n: int = 1, min_d: int = 1,
         bh: tuple[int, int] | None = None) -> tuple[int, int, int, int, int]:
    """(B, H, M, N, D) through the forward's draws (`bh`: B and H given)."""
    b, h = bh or draw(_bh(lim))
    m = draw(_lengths(lim.max_m, min_len=min(min_m, lim.max_m)))
    return b, h, m, draw(_key_len(lim, m, min_len=min_n)), max(min_d, draw(_head_dim(lim)))


def kv_lens(draw, caps: Caps, b: int, n: int) -> list[int] | None:
    """The forward's optional kv_lens, only where the kernel takes them."""
    if "kv_lens" not in caps or not draw(st.booleans()):
        return None
    return [draw(st.integers(0, n)) for _ in range(b)]


def options(draw, caps: Caps, causal: bool) -> tuple[bool, str, dict]:
    """(causal, its alignment, the kwargs naming it) as the forward's feature classes draw them."""
    causal = causal and _causal(draw, caps)
    align = draw(st.sampled_from(caps.aligns)) if causal else "top_left"
    return causal, align, ({"causal_align": align} if causal and len(caps.aligns) > 1 else {})


def plain_parts(draw, rng, lim: Limits, caps: Caps, *, sigma: float = 1.0, causal: bool = True,
                fold_to: dict | None = None, **sizes) -> _Parts:
    """N(0, sigma) q, k and N(0, 1) v (Dv of its own where declared), causal and kv_lens where
    declared; `sizes` as `dims` takes them, then `fold`ed to `fold_to`."""
    b, h, m, n, d = fold(draw(dims(lim, **sizes)), fold_to or {})
    dv = _value_dim(draw, caps, d, lim)
    causal, _, opts = options(draw, caps, causal)
    return _Parts(_normal(rng, (b, h, m, d), sigma), _normal(rng, (b, h, n, d), sigma), _normal(rng, (b, h, n, dv)),
                  causal=causal, kv_lens=kv_lens(draw, caps, b, n), options=opts)


# ---- dO ----------------------------------------------------------------------------------------

def do_shape(case: Case) -> tuple[int, int, int, int]:
    """dO's shape as (B, Hq, M, Dv); a varlen case's as (1, Hq, total_q, Dv)."""
    q, v = case.tensors["q"], case.tensors["v"]
    if is_varlen(case):
        return 1, q.shape[1], q.shape[0], v.shape[-1]
    return q.shape[0], q.shape[1], q.shape[2], v.shape[-1]


#: dO about 1 and never 0, for classes whose point needs dO (cancellations that dO = 0 would make
#: trivial, a dO to scale up): the background's cycled values 1 + 0.25 {-2 .. 2} and 1 + 0.25 N(0, 1)
#: stay off 0 (at scale 1, 1 + (-1) made whole rows of dO, or all of it, zero).
ABOUT_ONE = {"loc": 1.0, "scale": 0.25}


@composite
def do_values(draw, shape: tuple[int, ...], *, loc: float = 0.0, scale: float = 1.0) -> np.ndarray:
    """dO values that shrink: `floats.backgrounds` over its rows (a constant `loc` at the simplest)."""
    rows = int(np.prod(shape[:-1]))
    return draw(backgrounds((rows, shape[-1]), scale=scale, loc=loc)).reshape(shape)


def place_do(x: np.ndarray, fmt: Format, layout: str, *, pad: int = 3, offset: int = 1) -> torch.Tensor:
    """A (B, H, M, Dv) view of `x` in one of `DO_LAYOUTS`, inside a NaN-filled buffer (`place`)."""
    if layout == "transposed":
        return place(np.swapaxes(x, 2, 3), fmt, "bhsd", pad=pad, offset=offset).transpose(2, 3)
    return place(x, fmt, layout, pad=pad, offset=offset)


def with_do(draw, case: Case, fmt: Format, do: np.ndarray | None = None, *, layout: str | None = None,
            strided: bool = True, unaligned: bool = False, label: str | None = None, **values) -> Case:
    """`case` plus "do": `do` (or drawn `do_values(**values)`) rounded to the format, in its own layout
    (the geometry's on a GPU, else any of `DO_LAYOUTS`; packed varlen: `VARLEN_DO_LAYOUTS`), pad
    and storage offset."""
    shape = do_shape(case)
    x = representable(draw(do_values(shape, **values)) if do is None else do, fmt)
    varlen = is_varlen(case)
    if layout is None and varlen:
        layout = draw(st.sampled_from(VARLEN_DO_LAYOUTS)) if strided else VARLEN_DO_LAYOUTS[0]
    elif layout is None:  # on a GPU the geometry's: dO's strides then specialise as q's do (compilations)
        layout = geometry_layout() or (draw(st.sampled_from(DO_LAYOUTS)) if strided else "bhsd")
    pad, off = draw(st.integers(1, 9)), _storage_offset(draw, fmt, unaligned=unaligned)
    t = place_do(x, fmt, layout, pad=pad, offset=off)
    tensors = {**case.tensors, "do": t[0].transpose(0, 1) if varlen else t}
    return Case(tensors=tensors, kwargs=dict(case.kwargs), label=f"{label or case.label}/do_{layout}")


# ---- float64 reference (what a class aims at; the oracle certifies) ----------------------------

def visible(b: int, m: int, n: int, lens: list[int] | None, causal: bool, align: str = "top_left",
            window=None) -> np.ndarray:
    """(B, 1, M, N) visibility, as the oracle sees it."""
    return np.stack([visibility(m, n, min(x, n), causal, window, align) for x in (lens or [n] * b)])[:, None]


def grads64(q, k, v, do, vis, sc: float) -> dict[str, np.ndarray]:
    """P, O, dP, D, dS, dq, dk, dv of one head per query head (no GQA, no cap), in float64."""
    with np.errstate(all="ignore"):
        s = np.where(vis, sc * np.einsum("bhmd,bhnd->bhmn", q, k), -np.inf)
        top = s.max(-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
        e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
        total = e.sum(-1, keepdims=True)
        p = e / np.where(total > 0, total, 1.0)
        dp = do @ np.swapaxes(v, -1, -2)
        D = (p * dp).sum(-1, keepdims=True)
        ds = p * (dp - D)
        return dict(p=p, o=p @ v, dp=dp, D=D, ds=ds, dq=sc * ds @ k, dk=sc * np.swapaxes(ds, -1, -2) @ q,
                    dv=np.swapaxes(p, -1, -2) @ do)


# ---- peaked rows (confident, tied) -------------------------------------------------------------

def _logit_of_group(q, k, vis, member, sc) -> np.ndarray:
    """log(P(group) / P(rest)) per row, from the scores (stable; +inf where the row sees only its group)."""
    with np.errstate(all="ignore"):
        s = sc * np.einsum("bhmd,bhnd->bhmn", q, k)

        def lse(sel):
            x = np.where(sel, s, -np.inf)
            top = x.max(-1)
            t = np.where(np.isfinite(top), top, 0.0)
            return t + np.log(np.exp(x - t[..., None]).sum(-1))

        return lse(vis & member) - lse(vis & ~member)


def peaked_qk(rng, fmt: Format, shape: tuple[int, ...], vis: np.ndarray, sc: float, *, ties: int,
              window: tuple[float, float], front: bool) -> tuple[np.ndarray, np.ndarray]:
    """q, k (exact in `fmt`) where each row that sees a key puts softmax weight P in `window` on a
    group of `ties` identical keys. Keys are N(0, 1) but for up to D groups set to R e_a (R above
    every other key's entries: the group's score grows fastest with q); row i is r_i e_a + N(0, 0.1)
    noise, and r_i is found by bisection on the float64 log-odds of the group (monotone in r_i),
    aimed at a point of the window drawn per row. `front`: the groups are the first keys (every
    causal row that sees a key sees key 0), else anywhere.

    Only +e_a, and a target per row: groups at -e_a made rows of opposite groups mirror images
    (with D = 1 the noise is absorbed into r_i, so all rows had one |q|), and a dk summing as many
    of one as of the other was exactly 0, a cancellation of transcendental terms the oracle cannot
    decide (UndecidedRounding)."""
    b, h, m, n, d = shape
    k = _normal(rng, (b, h, n, d))
    R = 4.0 * float(np.abs(k).max()) + 1.0
    groups = max(1, min(d, n // ties))
    keys = (np.arange(n) if front else rng.permutation(n))[:groups * ties].reshape(groups, ties)
    dirs = np.eye(groups, d)
    for g in range(groups):
        k[:, :, keys[g], :] = R * dirs[g]
    k = representable(k, fmt)
    vis = np.broadcast_to(vis, (b, h, m, n))
    sees = vis[..., keys].all(-1)  # (b, h, m, groups): the row sees the whole group
    pick = np.argmax(rng.random(sees.shape) * sees, axis=-1)
    has = sees.any(-1)
    member = (keys[pick][..., None] == np.arange(n)).any(-2)
    e = dirs[pick] * has[..., None]
    noise = _normal(rng, (b, h, m, d), 0.1)
    lo_t, hi_t = (math.log(p / (1.0 - p)) for p in window)
    target = lo_t + (hi_t - lo_t) * (0.1 + 0.8 * rng.random((b, h, m)))
    lo, hi = np.full((b, h, m), -6.0), np.full((b, h, m), math.log(min(fmt.max_finite, 6.0e4) / 4.0))
    for _ in range(40):  # log r to 2^-35 of its range: far finer than the window
        mid = 0.5 * (lo + hi)
        z = _logit_of_group(representable(np.exp(mid)[..., None] * e + noise, fmt), k, vis, member, sc)
        below = z < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return representable(np.exp(hi)[..., None] * e + noise, fmt), k
