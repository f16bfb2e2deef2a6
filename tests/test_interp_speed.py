"""Triton's interpreter made faster (flashcheck/interpreter/speed.py, docs/interpreter.md): each cut leaves
what a kernel computes unchanged, and Triton's own behaviour is what `unpatched()` puts back."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from flashcheck.interpreter import exact as fi
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels._runtime import tl, triton

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the interpreter's own speed patches")


@triton.jit
def _plus_one(x):
    return x + 1.0


@triton.jit
def _helper_loop_kernel(out_ptr, N: tl.constexpr):
    acc = tl.zeros((4,), tl.float32)
    for _ in range(N):
        acc = _plus_one(acc)
    tl.store(out_ptr + tl.arange(0, 4), acc)


def test_helper_calls_inside_a_launch_do_not_repatch_the_language(monkeypatch: pytest.MonkeyPatch) -> None:
    """flashcheck.interpreter.speed: the language is patched once per launch, not once per helper call
    (Triton re-scanned every module of triton.language at each call), and the launch still
    restores it."""
    import triton.runtime.interpreter as interp

    scans = []
    real = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda *a: (scans.append(1), real(*a))[1])
    builtin = tl.program_id
    _helper_loop_kernel[(1,)](torch.zeros(4, device=DEVICE), N=1)  # Triton's first launch patches more
    counts = {}
    for n in (3, 30):
        out = torch.zeros(4, device=DEVICE)
        scans.clear()
        _helper_loop_kernel[(1,)](out, N=n)
        counts[n] = len(scans)
        assert torch.equal(out, torch.full((4,), float(n), device=DEVICE))
    assert counts[3] == counts[30] > 0, counts
    assert tl.program_id is builtin, "the launch restores the language it patched"


def test_speed_patches_answer_as_triton_does() -> None:
    """interp_speed keeps Triton's dtype map per element type and formats a tuple type's name when
    read: the same answers as Triton's own code, for every kind of type the interpreter asks about."""
    from triton.runtime import interpreter as interp

    kinds = [tl.int1, tl.int8, tl.uint16, tl.int32, tl.int64, tl.float16, tl.bfloat16, tl.float32, tl.float64,
             tl.pointer_type(tl.float16), tl.block_type(tl.float32, [4, 8]), tl.block_type(tl.bfloat16, [2]),
             tl.block_type(tl.pointer_type(tl.int8), [16])]
    fields = ([tl.float32, tl.block_type(tl.int64, [4])], None), ([tl.float16, tl.int32], ["m", "l"])
    now = [interp._get_np_dtype(t) for t in kinds], [tl.core.tuple_type(t, f).name for t, f in fields]
    with fi.unpatched():
        triton_own = [interp._get_np_dtype(t) for t in kinds], [tl.core.tuple_type(t, f).name for t, f in fields]
    assert now == triton_own


@triton.jit
def _int_add_kernel(a_ptr, b_ptr, out_ptr):
    tl.store(out_ptr, tl.load(a_ptr) + tl.load(b_ptr))


def test_overflow_checks_run_only_where_their_assert_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's int32 overflow check ends in `device_assert`, which does nothing unless the builder's
    options ask for debug (the interpreter's never do), so the check is skipped then: an overflowing
    add wraps as on the GPU, with or without the patch. With debug on, Triton's own check runs and
    names the overflow."""
    import triton.runtime.interpreter as interp
    from triton.runtime.errors import InterpreterError

    a, b = (torch.tensor([v], dtype=torch.int32, device=DEVICE) for v in (2**31 - 1, 1))
    asserts = []
    real_assert = interp.TritonSemantic.device_assert
    monkeypatch.setattr(interp.TritonSemantic, "device_assert",
                        lambda self, *args: (asserts.append(args[1]), real_assert(self, *args))[1])
    outs, checked = [], []
    for patched in (True, False):
        asserts.clear()
        out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        if patched:
            _int_add_kernel[(1,)](a, b, out)
        else:
            with fi.unpatched():
                _int_add_kernel[(1,)](a, b, out)
        outs.append(out.item())
        checked.append(list(asserts))
    assert outs == [-2**31, -2**31]
    assert checked == [[], ["int32 overflow detected for operation add"]], checked
    builder = interp.interpreter_builder
    assert not builder.options.debug
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    with pytest.raises(InterpreterError, match="int32 overflow detected for operation add"):
        _int_add_kernel[(1,)](a, b, torch.zeros(1, dtype=torch.int32, device=DEVICE))
