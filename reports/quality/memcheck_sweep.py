"""Memory-safety sweep of every production kernel, made to run under compute-sanitizer.

    compute-sanitizer --tool memcheck python3 -m flashcheck.reports.quality.memcheck_sweep [--from I] [--only SUBSTR]

Each case runs one launch of a production kernel on inputs chosen for their addresses, not their
values: odd lengths, empty and single-token sequences, huge strides (in-tile offsets past 2^31),
every attention feature (GQA/MQA, Dv != D, varlen, window, softcap, bool and additive masks,
LSE, bottom-right causal, split-KV, packed GQA). Every launch is synchronised, so a fault is
attributed to the case that made it. The script prints `CASE i name` before and `OK i` after
each case; a fault kills the CUDA context, so the driver (`flashcheck.reports.quality.gpu_lane`) restarts
it from the next case and the sanitizer's report names the kernel and address.

Without a GPU the cases run in the interpreter (with flashcheck's out-of-bounds check when it is
installed), sized down: `--list` prints them.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterator

import importlib

import torch

from flashcheck.oracles.formats import FLOAT_DTYPES

# flashcheck.kernels re-exports the functions `softmax` and `attention`: import the modules.
A = importlib.import_module("flashcheck.kernels.attention")
S = importlib.import_module("flashcheck.kernels.softmax")

DTYPES = FLOAT_DTYPES
BIG_STRIDE = 2**31 + 64  # elements: in-tile offsets computed in int32 would wrap


def _dev() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=_dev()).to(dtype)


def _sparse_view(shape, strides, dtype: torch.dtype) -> torch.Tensor:
    """A view with huge strides into an uninitialised buffer; only its own elements are filled."""
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    view = torch.empty(extent, dtype=dtype, device=_dev()).as_strided(shape, strides)
    src = torch.rand(shape, device=_dev())
    view.copy_(src > 0.5 if dtype == torch.bool else src.to(dtype))
    return view


def _strided_rows(m: int, n: int, row_stride: int, dtype: torch.dtype) -> torch.Tensor:
    """(m, n) view whose rows are row_stride elements apart."""
    return _sparse_view((m, n), (row_stride, 1), dtype)


Case = tuple[str, Callable[[], object]]


def softmax_cases(big: bool) -> Iterator[Case]:
    lengths = (1, 2, 3, 17, 255, 1000, 4097, 16385, 40000, 65537) if big else (1, 3, 17, 255, 600)
    for dt in DTYPES:
        t = str(dt).split(".")[-1]
        for n in lengths:
            for m in (1, 5):
                x = lambda m=m, n=n, dt=dt: _rand(m, n, dtype=dt)  # noqa: E731
                if n <= S.row_max_n(dt):
                    yield f"softmax_row {t} {m}x{n}", lambda x=x: S.softmax_row(x())
                yield f"softmax_online {t} {m}x{n}", lambda x=x: S.softmax_online(x())
                yield f"softmax_split {t} {m}x{n}", lambda x=x: S.softmax_split(x())
                yield f"softmax {t} {m}x{n}", lambda x=x: S.softmax(x())
        # transposed / column-strided input and a strided out= view
        xt = lambda dt=dt: _rand(300, 7, dtype=dt).t()  # noqa: E731
        yield f"softmax_row {t} transposed 7x300", lambda x=xt: S.softmax_row(x())
        yield f"softmax_online {t} transposed 7x300", lambda x=xt: S.softmax_online(x())
        yield f"softmax_split {t} transposed 7x300", lambda x=xt: S.softmax_split(x())
        yield f"softmax_online {t} strided out", lambda x=xt, dt=dt: S.softmax_online(
            x(), out=torch.empty(7, 600, dtype=dt, device=_dev())[:, ::2])
        if big:
            for name, fn in (("row", S.softmax_row), ("online", S.softmax_online), ("split", S.softmax_split)):
                yield f"softmax_{name} {t} row stride 2^31+64", lambda fn=fn, dt=dt: fn(
                    _strided_rows(2, 33, BIG_STRIDE, dt))
    yield "softmax empty 0x5", lambda: S.softmax(_rand(0, 5, dtype=torch.float16))


def _qkv(b, hq, hkv, m, n, d, dv, dt):
    return _rand(b, hq, m, d, dtype=dt), _rand(b, hkv, n, d, dtype=dt), _rand(b, hkv, n, dv, dtype=dt)


def attention_cases(big: bool) -> Iterator[Case]:
    dts = DTYPES
    for dt in dts:
        t = str(dt).split(".")[-1]
        shapes = [  # (B, Hq, Hkv, M, N, D, Dv)
            (1, 1, 1, 1, 1, 16, 16), (2, 2, 2, 7, 13, 16, 16), (1, 4, 1, 3, 70, 32, 32),
            (2, 8, 2, 1, 300, 64, 64), (1, 6, 3, 65, 129, 40, 24), (1, 2, 2, 130, 5, 128, 64),
            (1, 4, 2, 33, 33, 96, 96), (1, 4, 2, 70, 90, 64, 32), (1, 4, 4, 70, 90, 32, 64),
            (1, 2, 1, 17, 300, 128, 64), (1, 3, 3, 5, 200, 80, 48), (1, 2, 2, 40, 40, 256, 128),
        ]
        if big:
            shapes += [(1, 8, 1, 1, 4099, 128, 128), (2, 4, 4, 257, 1031, 64, 64), (1, 2, 1, 1000, 1000, 256, 256)]
        for (b, hq, hkv, m, n, d, dv) in shapes:
            qkv = lambda s=(b, hq, hkv, m, n, d, dv, dt): _qkv(*s)  # noqa: E731
            tag = f"{t} B{b} Hq{hq} Hkv{hkv} M{m} N{n} D{d} Dv{dv}"
            yield f"attention {tag}", lambda qkv=qkv: A.attention(*qkv())
            yield f"attention causal lse {tag}", lambda qkv=qkv: A.attention(*qkv(), causal=True, return_lse=True)
            yield f"attention bottom_right causal {tag}", lambda qkv=qkv: A.attention(
                *qkv(), causal=True, causal_align="bottom_right")
            yield f"attention window softcap {tag}", lambda qkv=qkv: A.attention(
                *qkv(), window=(5, 3), softcap=20.0, return_lse=True)
            kvl = [(i * 7) % (n + 1) for i in range(b)]
            yield f"attention kv_lens {tag}", lambda qkv=qkv, kvl=kvl: A.attention(
                *qkv(), kv_lens=torch.tensor(kvl, dtype=torch.int32, device=_dev()))
            yield f"attention bool mask {tag}", lambda qkv=qkv, s=(b, 1, m, n): A.attention(
                *qkv(), attn_mask=torch.rand(*s, device=_dev()) > 0.3)
            yield f"attention bias mask lse {tag}", lambda qkv=qkv, s=(1, hq, m, n), dt=dt: A.attention(
                *qkv(), attn_mask=_rand(*s, dtype=dt), return_lse=True)
            for splits in (0, 3):
                yield f"attention splits={splits} lse {tag}", lambda qkv=qkv, s=splits: A.attention(
                    *qkv(), num_splits=s, return_lse=True)
            if hq != hkv:
                yield f"attention pack_gqa {tag}", lambda qkv=qkv: A.attention(*qkv(), pack_gqa=True,
                                                                                      causal=True)
                yield f"attention pack_gqa splits=4 lse {tag}", lambda qkv=qkv: A.attention(
                    *qkv(), pack_gqa=True, num_splits=4, return_lse=True)
        # varlen: empty, single-token and odd sequences; GQA; every feature that varlen takes
        for seqs_q, seqs_k in (([0, 1, 5, 0, 17], [3, 1, 0, 9, 33]), ([1, 1, 1], [1, 64, 129]),
                               ([40, 3], [40, 200]), ([0], [0]), ([7], [0])):
            for hq, hkv, d, dv in ((4, 4, 64, 64), (4, 1, 64, 64), (6, 2, 40, 24), (4, 2, 128, 64)):
                packed = lambda sq=seqs_q, sk=seqs_k, hq=hq, hkv=hkv, d=d, dv=dv, dt=dt: (  # noqa: E731
                    _rand(sum(sq), hq, d, dtype=dt), _rand(sum(sk), hkv, d, dtype=dt), _rand(sum(sk), hkv, dv, dtype=dt),
                    torch.tensor([0, *_cumsum(sq)], dtype=torch.int32, device=_dev()),
                    torch.tensor([0, *_cumsum(sk)], dtype=torch.int32, device=_dev()))
                kw = dict(max_seqlen_q=max(seqs_q), max_seqlen_k=max(seqs_k))
                tag = f"{t} q{seqs_q} k{seqs_k} Hq{hq} Hkv{hkv} D{d} Dv{dv}"
                for name, extra in (("", {}), ("causal lse", dict(causal=True, return_lse=True)),
                                    ("bottom_right window", dict(causal=True, causal_align="bottom_right",
                                                                 window=(4, 0))),
                                    ("softcap splits=3 lse", dict(softcap=10.0, num_splits=3, return_lse=True)),
                                    ("pack_gqa", dict(pack_gqa=True)),
                                    ("pack_gqa splits=0 lse", dict(pack_gqa=True, num_splits=0, return_lse=True))):
                    yield f"attention_varlen {name} {tag}", (
                        lambda packed=packed, kw=kw, extra=extra: A.attention_varlen(*packed(), **kw, **extra))
        if big:
            # K and a mask with huge strides: in-tile offsets (BLOCK - 1) * stride pass 2^31
            def wide_k(dt=dt):
                kk = _sparse_view((1, 1, 64, 64), (0, 0, 2**25, 1), dt)
                return A.attention(_rand(1, 1, 16, 64, dtype=dt), kk, kk)

            def wide_mask(dt=dt):
                mask = _sparse_view((1, 1, 16, 48), (0, 0, 1, 2**25), torch.bool)
                return A.attention(_rand(1, 1, 16, 64, dtype=dt), _rand(1, 1, 48, 64, dtype=dt),
                                   _rand(1, 1, 48, 64, dtype=dt), attn_mask=mask)
            yield f"attention {t} K row stride 2^25 (wide)", wide_k
            yield f"attention {t} bool mask key stride 2^25 (wide)", wide_mask


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


def cases(big: bool) -> list[Case]:
    torch.manual_seed(0)
    return list(softmax_cases(big)) + list(attention_cases(big))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashcheck.reports.quality.memcheck_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="start", type=int, default=0, help="first case index")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--ids", default="", help="comma-separated case indices to run")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--small", action="store_true", help="leave out the large cases (the default on a CPU)")
    a = ap.parse_args(argv)
    big = torch.cuda.is_available() and not a.small
    todo = cases(big)
    if a.list:
        for i, (name, _) in enumerate(todo):
            print(i, name)
        return 0
    ids = {int(i) for i in a.ids.split(",") if i} if a.ids else None
    failed = ran = 0
    for i, (name, fn) in enumerate(todo):
        if i < a.start or a.only not in name or (ids is not None and i not in ids):
            continue
        ran += 1
        print(f"CASE {i} {name}", flush=True)
        torch.manual_seed(i)
        try:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a fault: name the case, end; the driver goes on)
            print(f"FAIL {i} {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            failed += 1
            if torch.cuda.is_available():
                return 1  # the CUDA context may be dead: a fresh process goes on from i + 1
            continue
        print(f"OK {i}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # sweeps run side by side: hand the wide cases' memory back
    print(f"DONE {ran} of {len(todo)} cases, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
