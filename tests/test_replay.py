"""`kernels/_runtime.py:launch`: a repeated launch replays the binary Triton compiled for the same
specialization, and anything Triton specializes on gives a new one. The interpreter never replays
(Triton's interpreter returns no binary), so these tests drive `launch` with a stand-in for a
`@triton.jit` function; the GPU lane runs the real one (flashcheck/suite/test_replay_gpu.py)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
import torch

R = importlib.import_module("flashcheck.kernels._runtime")


@dataclass
class Param:
    name: str
    is_constexpr: bool = False
    default: object = None
    has_default: bool = False


class Compiled:
    def __init__(self, log: list) -> None:
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("replay", grid, args))


class FakeJit:
    """Triton's JITFunction as `launch` sees it: `fn[grid](*args, **meta)` returns the binary."""

    def __init__(self, params: list[Param], *, returns_binary: bool = True) -> None:
        self.params, self.log, self.returns_binary = params, [], returns_binary

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return Compiled(self.log) if self.returns_binary else None
        return run


PARAMS = [Param("x"), Param("n"), Param("s"), Param("BLOCK", True), Param("FLAG", True, False, True)]


@pytest.fixture
def gpu_like(monkeypatch):
    """`launch` as on a GPU: not the interpreter, device 0 current, an empty replay table."""
    monkeypatch.setattr(R, "INTERPRET", False)
    monkeypatch.setattr(R, "REPLAY", True)
    monkeypatch.setattr(R, "_REPLAYS", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def kinds(fn: FakeJit) -> list[str]:
    return [entry[0] for entry in fn.log]


def test_a_repeated_launch_replays_with_the_constexprs_in_signature_order(gpu_like) -> None:
    fn = FakeJit(PARAMS)
    x, y = torch.zeros(64), torch.ones(64)
    R.launch(fn, (4,), (x, 32, 0.5), dict(BLOCK=128, num_warps=4))
    R.launch(fn, (4,), (y, 48, 0.25), dict(BLOCK=128, num_warps=4))  # other data and values, same classes
    assert kinds(fn) == ["triton", "replay"]
    _, grid, args = fn.log[1]
    assert grid == (4, 1, 1)  # a compiled kernel takes all three axes
    assert args[0] is y and args[1:] == (48, 0.25, 128, False)  # FLAG: its default


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int_one", "int_div16", "int_wide", "meta", "warps",
                                    "grid_only"])
def test_what_triton_specializes_on_never_replays_a_binary(gpu_like, change: str) -> None:
    fn = FakeJit(PARAMS)
    base = torch.zeros(64)
    args, meta = (base, 32, 0.5), dict(BLOCK=128, num_warps=4)
    R.launch(fn, (4,), args, meta)
    other = {
        "misaligned": ((base[1:], 32, 0.5), meta),  # 4 bytes past a 16-byte boundary
        "dtype": ((base.double(), 32, 0.5), meta),
        "int_one": ((base, 1, 0.5), meta),
        "int_div16": ((base, 33, 0.5), meta),
        "int_wide": ((base, 2**31 + 16, 0.5), meta),
        "meta": (args, dict(BLOCK=64, num_warps=4)),
        "warps": (args, dict(BLOCK=128, num_warps=8)),
        "grid_only": (args, meta),
    }[change]
    R.launch(fn, (9,), *other)
    assert kinds(fn) == ["triton", "replay" if change == "grid_only" else "triton"]


def test_no_binary_or_no_value_for_a_parameter_means_no_replay(gpu_like) -> None:
    for fn, args in ((FakeJit(PARAMS, returns_binary=False), (torch.zeros(8), 16, 1.0)),  # the interpreter
                     (FakeJit(PARAMS[:3] + [Param("later")]), (torch.zeros(8), 16, 1.0))):  # a non-constexpr left out
        for _ in range(2):
            R.launch(fn, (1,), args, dict(BLOCK=16))
        assert kinds(fn) == ["triton", "triton"]


def test_unhashable_arguments_take_tritons_path(gpu_like) -> None:
    fn = FakeJit(PARAMS)
    for _ in range(2):
        R.launch(fn, (1,), (torch.zeros(8), 16, 1.0), dict(BLOCK=[16]))
    assert kinds(fn) == ["triton", "triton"]


def test_a_callers_key_stands_for_the_non_tensor_arguments(gpu_like) -> None:
    fn = FakeJit(PARAMS)
    meta = dict(BLOCK=16)
    key = R.spec_key((16, 1.0), meta)
    assert key == R.spec_key((torch.zeros(1), 16, 1.0), meta)  # tensors are classed at each launch
    R.launch(fn, (1,), (torch.zeros(8), 16, 1.0), meta, key=key)
    R.launch(fn, (1,), (torch.zeros(8), 16, 1.0), meta, key=key)
    R.launch(fn, (1,), (torch.zeros(8)[1:], 16, 1.0), meta, key=key)  # alignment is still checked
    assert kinds(fn) == ["triton", "replay", "triton"]


def test_the_interpreter_and_the_switch_always_take_tritons_path(gpu_like, monkeypatch) -> None:
    for attr, value in (("INTERPRET", True), ("REPLAY", False)):
        fn = FakeJit(PARAMS)
        with monkeypatch.context() as m:
            m.setattr(R, attr, value)
            for _ in range(2):
                R.launch(fn, (1,), (torch.zeros(8), 16, 1.0), dict(BLOCK=16))
        assert kinds(fn) == ["triton", "triton"]


@pytest.mark.parametrize("version, ok", [("3.6.0", True), ("3.6.1+gitabc", True), ("3.5.1", False), ("3.7.0", False),
                                         ("4.6.0", False), ("3.60.0", False)])
def test_only_the_triton_versions_a_lane_ran_replay(version: str, ok: bool) -> None:
    assert R.replay_supported(version) is ok
