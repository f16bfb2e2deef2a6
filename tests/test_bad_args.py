"""Our kernels reject bad arguments with one clear line (issue 18.6): launch knobs, out= that
overlaps itself or an input (also through a second storage object over the same memory), inputs
that need a gradient (softmax; attention is differentiable, but a mask that needs a gradient is
rejected and its checks run before any launch), and tensors without plain dense data (sparse,
quantized, meta).

The family suites' bad-input tests hold for any kernel that declares validation; these cases are
promises of our launchers only (an external kernel need not reject a requires_grad input)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
import torch

from flashcheck.kernels import DEVICE
from flashcheck.kernels.attention import attention, attention_varlen
from flashcheck.kernels.softmax import ROW_MAX_N, softmax, softmax_online, softmax_row, softmax_split

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support:UserWarning",
                                       "ignore:torch.quantize_per_tensor:UserWarning")

SOFTMAX = {"softmax_row": softmax_row, "softmax_online": softmax_online, "softmax_split": softmax_split}


def _x() -> torch.Tensor:
    return torch.linspace(-1, 1, 6, device=DEVICE).reshape(2, 3)


def _shared_memory() -> tuple[torch.Tensor, torch.Tensor]:
    """x and out over one buffer through two storage objects with different data pointers: an
    identity check of the storages (or of their data pointers) misses it."""
    if DEVICE.type != "cpu":
        pytest.skip("numpy-backed aliasing is a CPU construction")
    buf = np.zeros(12, dtype=np.float32)
    x, out = torch.from_numpy(buf[:6]).view(2, 3), torch.from_numpy(buf[3:9]).view(2, 3)
    assert x.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    return x, out


def _quantized() -> torch.Tensor:
    return torch.quantize_per_tensor(torch.ones(2, 3), 0.1, 0, torch.qint8)


# name -> (call, exception, words of the message)
SOFTMAX_CASES: dict[str, tuple[Callable[[Callable], Any], type[Exception], str]] = {
    "rows_per_program -1": (lambda f: f(_x(), rows_per_program=-1), ValueError, "rows_per_program"),
    "rows_per_program 0": (lambda f: f(_x(), rows_per_program=0), ValueError, "rows_per_program"),
    "rows_per_program 3": (lambda f: f(_x(), rows_per_program=3), ValueError, "power of two"),
    "rows_per_program True": (lambda f: f(_x(), rows_per_program=True), TypeError, "rows_per_program"),
    "rows_per_program 2.0": (lambda f: f(_x(), rows_per_program=2.0), TypeError, "rows_per_program"),
    "row block_n 0": (lambda f: f(_x(), block_n=0), ValueError, "block_n"),
    "row num_warps 3": (lambda f: f(_x(), num_warps=3), ValueError, "num_warps"),
    # fp32 rows stop at ROW_MAX_N (16-bit ones go on to ROW_MAX_N_16BIT): the message names the dtype
    "row fp32 too long": (lambda f: f(torch.zeros(1, ROW_MAX_N + 1, device=DEVICE)), ValueError, "torch.float32"),
    "online block_n 3": (lambda f: f(_x(), block_n=3), ValueError, "block_n"),
    "online block_n True": (lambda f: f(_x(), block_n=True), TypeError, "block_n"),
    "online num_warps 0": (lambda f: f(_x(), num_warps=0), ValueError, "num_warps"),
    "split chunks_per_block 0": (lambda f: f(_x(), chunks_per_block=0), ValueError, "chunks_per_block"),
    "split chunks_per_block '2'": (lambda f: f(_x(), chunks_per_block="2"), TypeError, "chunks_per_block"),
    "split merge_block 6": (lambda f: f(_x(), merge_block=6), ValueError, "merge_block"),
    "out stride 0": (lambda f: f(_x(), out=torch.empty(3, device=DEVICE).expand(2, 3)), ValueError, "overlapping"),
    "out overlapping strides": (lambda f: f(_x(), out=torch.empty(4, device=DEVICE).as_strided((2, 3), (1, 1))),
                                ValueError, "overlapping"),
    "out is x": (lambda f: (lambda x: f(x, out=x))(_x()), ValueError, "shares memory"),
    "out inside x's storage": (lambda f: (lambda b: f(b[:, :3], out=b[:, 3:]))(torch.zeros(2, 6, device=DEVICE)),
                               ValueError, "shares memory"),
    "out aliases x via another storage": (lambda f: (lambda x, o: f(x, out=o))(*_shared_memory()),
                                          ValueError, "shares memory"),
    "out not a tensor": (lambda f: f(_x(), out=[0.0] * 6), TypeError, "out"),
    "out sparse": (lambda f: f(_x(), out=torch.zeros(2, 3).to_sparse()), ValueError, "layout"),
    "out meta": (lambda f: f(_x(), out=torch.empty(2, 3, device="meta")), ValueError, "meta"),
    # softmax is differentiable (kernels/_autograd.py), but not into an out= buffer
    "x requires grad, out=": (lambda f: f(_x().requires_grad_(), out=torch.empty(2, 3, device=DEVICE)), ValueError,
                              "autograd"),
    "x sparse": (lambda f: f(_x().cpu().to_sparse()), ValueError, "layout"),
    "x sparse csr": (lambda f: f(_x().cpu().to_sparse_csr()), ValueError, "layout"),
    "x quantized": (lambda f: f(_quantized()), TypeError, "quantized"),
    "x meta": (lambda f: f(torch.empty(2, 3, device="meta")), ValueError, "meta"),
}
_ONLY = {"rows_per_program": "softmax_row", "row ": "softmax_row", "online ": "softmax_online", "split ": "softmax_split"}

def _softmax_params() -> list[tuple[str, str]]:
    out = []
    for case in SOFTMAX_CASES:
        only = next((fn for prefix, fn in _ONLY.items() if case.startswith(prefix)), None)
        out += [(fn, case) for fn in SOFTMAX if only in (None, fn)]
    return out


@pytest.mark.parametrize("fn,case", _softmax_params())
def test_softmax_rejects(fn: str, case: str) -> None:
    call, exc, words = SOFTMAX_CASES[case]
    with pytest.raises(exc) as info:
        call(SOFTMAX[fn])
    msg = str(info.value)
    assert words in msg and "\n" not in msg, msg


def test_softmax_dispatcher_rejects_bad_input() -> None:
    for call, exc, words in (SOFTMAX_CASES["x requires grad, out="], SOFTMAX_CASES["out stride 0"],
                             SOFTMAX_CASES["x sparse"]):
        with pytest.raises(exc, match=words):
            call(softmax)


@pytest.mark.parametrize("fn", sorted(SOFTMAX))
def test_softmax_still_accepts_good_arguments(fn: str) -> None:
    """Guards of the rejections above: a strided out= with gaps, knobs at their smallest, a
    requires_grad input under no_grad."""
    f, x = SOFTMAX[fn], _x()
    want = torch.softmax(x, dim=-1)
    out = torch.full((2, 5), 7.0, device=DEVICE)[:, 1:4]
    assert torch.allclose(f(x, out=out), want, atol=1e-6)
    knobs = {"softmax_row": {"rows_per_program": 1, "num_warps": 1, "block_n": 3},
             "softmax_online": {"block_n": 2, "num_warps": 1},
             "softmax_split": {"block_n": 2, "chunks_per_block": 1, "merge_block": 2}}[fn]
    assert torch.allclose(f(x, **knobs), want, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(f(x.clone().requires_grad_()), want, atol=1e-6)


def _qkv(**over: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {n: torch.randn(1, 1, 4, 16, generator=g).to(DEVICE) for n in "qkv"}
    t.update(over)
    return t


ATTENTION_CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "q and mask require grad": (lambda: attention(**_qkv(q=_qkv()["q"].requires_grad_()),
                                                  attn_mask=torch.zeros(4, 4, device=DEVICE, requires_grad=True)),
                                ValueError, "no gradient"),
    "v requires grad, block_m 8": (lambda: attention(**_qkv(v=_qkv()["v"].requires_grad_()), block_m=8),
                                   ValueError, "block_m"),
    "k sparse": (lambda: attention(**_qkv(k=_qkv()["k"].cpu().to_sparse())), ValueError, "layout"),
    "q meta": (lambda: attention(**_qkv(q=torch.empty(1, 1, 4, 16, device="meta"))), ValueError, "meta"),
    "mask requires grad": (lambda: attention(**_qkv(), attn_mask=torch.zeros(4, 4, device=DEVICE, requires_grad=True)),
                           ValueError, "backward"),
    "mask sparse": (lambda: attention(**_qkv(), attn_mask=torch.zeros(4, 4).to_sparse()), ValueError, "layout"),
    "block_m 0": (lambda: attention(**_qkv(), block_m=0), ValueError, "block_m"),
    "block_m 8": (lambda: attention(**_qkv(), block_m=8), ValueError, "block_m"),
    "block_m 16.0": (lambda: attention(**_qkv(), block_m=16.0), TypeError, "block_m"),
    "block_n 24": (lambda: attention(**_qkv(), block_n=24), ValueError, "power of two"),
    "num_warps 3": (lambda: attention(**_qkv(), num_warps=3), ValueError, "num_warps"),
    "num_warps True": (lambda: attention(**_qkv(), num_warps=True), TypeError, "num_warps"),
    "num_stages 0": (lambda: attention(**_qkv(), num_stages=0), ValueError, "num_stages"),
    "pack_gqa 'yes'": (lambda: attention(**_qkv(), pack_gqa="yes"), TypeError, "pack_gqa"),
    "varlen block_n 0": (lambda: _varlen(block_n=0), ValueError, "block_n"),
    "varlen q requires grad, kv_lens": (lambda: _varlen(q=torch.randn(4, 1, 16, device=DEVICE, requires_grad=True),
                                                        kv_lens=torch.tensor([2, 2], device=DEVICE)),
                                        ValueError, "kv_lens"),
}


def _varlen(q: torch.Tensor | None = None, **kw: Any) -> Any:
    t = {n: torch.randn(4, 1, 16, device=DEVICE) for n in "qkv"}
    if q is not None:
        t["q"] = q
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    return attention_varlen(t["q"], t["k"], t["v"], cu, cu, max_seqlen_q=2, max_seqlen_k=2, **kw)


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_rejects(case: str) -> None:
    call, exc, words = ATTENTION_CASES[case]
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert words in msg and "\n" not in msg, msg


def test_attention_still_accepts_good_arguments() -> None:
    want = attention(**_qkv())
    # Knobs that change no arithmetic give the same bits; block_n is a tuning (it reblocks the
    # sum). num_warps keeps the bits under the interpreter only: on a GPU the fp32 row sum
    # (tl.sum) follows the layout num_warps sets (an H200 put this case 2.4e-7 apart at
    # num_warps=1 and 8, at df85c3d's kernels as at 757b3ba's), and the spec lists only
    # num_stages as a bit-identical GPU config (kernels/specs.py).
    same = dict(block_m=16, num_stages=1, pack_gqa=False) | ({"num_warps": 1} if DEVICE.type == "cpu" else {})
    assert torch.equal(attention(**_qkv(), **same), want)
    assert attention(**_qkv(), num_warps=1).shape == want.shape
    assert attention(**_qkv(), block_n=16).shape == want.shape
    with torch.no_grad():
        assert torch.equal(attention(**_qkv(q=_qkv()["q"].requires_grad_())), want)
    _varlen(block_n=16)
