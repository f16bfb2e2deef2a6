"""The interpreter's out-of-bounds check (flashcheck.interpreter.bounds, docs/interpreter.md).

Under TRITON_INTERPRET every load, store and atomic is checked against the view each pointer
argument was handed; a kernel that reads or writes outside it raises OutOfBoundsAccess naming the
kernel, the parameter and the element offsets. On a GPU the same kernels fault or read other data:
the zoo entries here are caught there by the suite's oracle or guard-band properties
(tests/test_zoo.py; GPU runs must confirm, see the zoo docstrings).
"""
from __future__ import annotations

import re

import pytest
import torch

from flashcheck import kernels
from flashcheck.interpreter.bounds import ENV, OutOfBoundsAccess, extent_of
from flashcheck.kernels._common import tl, triton
from flashcheck.suite.zoo import attention_bugs, softmax_bugs

pytestmark = pytest.mark.skipif(not kernels.INTERPRET, reason="the bounds check is the interpreter's (a GPU faults)")


@triton.jit
def _copy(x_ptr, y_ptr, N, sx, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sx + cols, mask=cols < N + EXTRA, other=0.0)
    tl.store(y_ptr + row * N + cols, x, mask=cols < N)


@triton.jit
def _block_ptr_copy(x_ptr, y_ptr, M, N, CHECK: tl.constexpr, BLOCK: tl.constexpr):
    if CHECK:
        xb = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
        x = tl.load(xb, boundary_check=(0, 1), padding_option="zero")
    else:
        xb = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
        x = tl.load(xb)
    yb = tl.make_block_ptr(y_ptr, (BLOCK, BLOCK), (BLOCK, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
    tl.store(yb, x)


def test_extent_of_views() -> None:
    buf = torch.zeros(100)
    v = buf[10:].as_strided((3, 4), (20, 2))
    lo, hi = extent_of(v)
    assert (lo - buf.data_ptr(), hi - buf.data_ptr()) == (40, 4 * (10 + 2 * 20 + 3 * 2 + 1))
    assert extent_of(buf[:0])[0] == extent_of(buf[:0])[1]
    flipped = torch.zeros(3, 4).t()
    assert extent_of(flipped)[1] - extent_of(flipped)[0] == 12 * 4


def test_in_bounds_passes_and_one_past_the_row_end_is_caught() -> None:
    x, y = torch.randn(3, 5), torch.empty(3, 5)
    _copy[(3,)](x, y, 5, 5, EXTRA=0, BLOCK=8)
    assert torch.equal(x, y)
    with pytest.raises(OutOfBoundsAccess) as e:
        _copy[(3,)](x, y, 5, 5, EXTRA=1, BLOCK=8)
    msg = str(e.value)
    assert "load in kernel _copy" in msg and "x_ptr" in msg and "program (2, 0, 0)" in msg
    assert "element offset(s) 15 " in msg and "1 element(s) past the end" in msg and "1 of 6 active lanes" in msg


def test_reading_past_a_view_inside_its_storage_is_caught() -> None:
    buf = torch.zeros(4, 8)
    x = buf[:, :5]  # rows of 5 inside rows of 8: lanes 5..7 of rows 0-2 lie between rows (in the extent)
    y = torch.empty(4, 5)
    _copy[(3,)](x, y, 5, 8, EXTRA=3, BLOCK=8)  # rows 0-2 only: inside the view's extent, not an error
    with pytest.raises(OutOfBoundsAccess, match=r"x_ptr .*valid element offsets \[0, 29\)\) at element "
                                                r"offset\(s\) 29, 30, 31"):
        _copy[(4,)](x, y, 5, 8, EXTRA=3, BLOCK=8)  # the last row's lanes 5..7: in storage, past the view


def test_provenance_catches_an_overflow_into_a_neighbouring_argument() -> None:
    both = torch.randn(2, 6)
    x, y = both[0, :5].reshape(1, 5), both[1].reshape(1, 6)  # y starts 6 elements after x
    with pytest.raises(OutOfBoundsAccess, match="x_ptr"):
        _copy[(1,)](x, y[:, :5], 5, 5, EXTRA=3, BLOCK=8)  # x's lane 6, 7 land inside y


def test_block_pointer_loads_are_checked() -> None:
    x, y = torch.randn(3, 5), torch.empty(8, 8)
    _block_ptr_copy[(1,)](x, y, 3, 5, CHECK=True, BLOCK=8)
    assert torch.equal(y[:3, :5], x)
    with pytest.raises(OutOfBoundsAccess, match="_block_ptr_copy.*x_ptr"):
        _block_ptr_copy[(1,)](x, y, 3, 5, CHECK=False, BLOCK=8)


def test_switched_off_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "0")
    x, y = torch.randn(3, 5), torch.empty(3, 5)
    _copy[(3,)](x, y, 5, 5, EXTRA=1, BLOCK=8)  # reads one element past x, unchecked


# --- the zoo's out-of-bounds entries: caught with the tensor and the offset named -----------------

def test_zoo_read_past_row() -> None:
    kw = softmax_bugs._TRIGGERS["read_past_row"]()
    with pytest.raises(OutOfBoundsAccess) as e:
        softmax_bugs.read_past_row(**kw)
    assert re.search(r"load in kernel _row_kernel, program \(2, 0, 0\): 1 of 301 active lanes read x_ptr "
                     r"\(float32 tensor of shape \(3, 300\).*element offset\(s\) 900 \(up to 1 element\(s\) past the end\)",
                     str(e.value)), str(e.value)
    x = kw["x"]
    assert torch.allclose(softmax_bugs.ZOO["read_past_row"].fixed(x), torch.softmax(x, dim=1))


def test_zoo_write_past_row() -> None:
    kw = softmax_bugs._TRIGGERS["write_past_row"]()
    with pytest.raises(OutOfBoundsAccess, match=r"store in kernel _row_kernel.*y_ptr .*valid element offsets "
                                                r"\[0, 920\)\) at element offset\(s\) 920"):
        softmax_bugs.write_past_row(**kw)
    x, out = kw["x"], kw["out"]
    softmax_bugs.ZOO["write_past_row"].fixed(x, out=out)
    assert torch.allclose(out, torch.softmax(x, dim=1))


def test_zoo_varlen_past_cu_seqlens() -> None:
    z = attention_bugs.ZOO["varlen_past_cu_seqlens"]
    kw = z.trigger()
    args = [kw.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    # sequence 1 (keys 6..6 of 11) reads 6 keys from row 6 on: key 11, one row (8 elements) past K
    with pytest.raises(OutOfBoundsAccess, match=r"load in kernel _attn_kernel, program \(0, 0, 0\).*k_ptr \(float32 "
                                                r"tensor of shape \(1, 2, 5, 8\).*valid element offsets \[0, 80\)\) at "
                                                r"element offset\(s\) 80, 81, .*up to 8 element\(s\) past the end"):
        z.broken.flashcheck["varlen_fn"](*args, **kw)
    o = z.fixed.flashcheck["varlen_fn"](*args, **kw)
    q, k, v, cq, ck = args
    for b in range(3):  # each sequence as its own dense problem
        sq, sk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        ref = torch.nn.functional.scaled_dot_product_attention(*(t[s].transpose(0, 1) for t, s in
                                                                 ((q, sq), (k, sk), (v, sk))))
        assert torch.allclose(o[sq].transpose(0, 1), ref, atol=1e-5)
