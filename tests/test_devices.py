"""Device and stream properties of every production kernel (GPU only).

- Same bits on `cuda:1` while the current device is `cuda:0` (FlashAttention #1782: Triton
  launches on the *current* device and its current stream, so a launcher that does not enter
  the tensor's device runs on the wrong GPU).
- Same bits on a non-default stream (`torch.cuda.Stream`), as PyTorch's own non-default-stream
  checks do.

Each race is made wide on purpose: the input is NaN until a long `torch.cuda._sleep` on the
stream (or device) that owns it has passed and the real values are copied in. A kernel ordered
on that stream reads the real values; one launched on another stream or device reads NaN (or
faults), and its bits differ from the reference's.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import PRODUCTION, KernelSpec
from flashcheck.oracles.formats import format_of

pytestmark = pytest.mark.skipif(INTERPRET, reason="GPU only: devices and streams do not exist in Triton's interpreter")

TWO_GPUS = pytest.mark.skipif(INTERPRET or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
#: GPU cycles the owning stream sleeps before the input is written (about 0.1 s on an H200): far
#: longer than a warm launch takes on the host.
SLEEP_CYCLES = 200_000_000

# Shapes reaching every path: softmax rows for the row kernel and, with few long rows, the
# dispatcher's split path; attention with a ragged key length, causal and kv_lens.
SOFTMAX_SHAPES = ((4, 1000), (3, 70_000))
ATTENTION_SHAPE = dict(b=2, h=3, m=100, n=173, d=64)
#: The training families' inputs, in the order their kernels take them (rows of the softmax shapes).
TRAINING = {"softmax_backward": ("y", "dy"), "log_softmax": ("x",), "log_softmax_backward": ("logp", "dy"),
            "cross_entropy": ("logits", "target")}


def _cases(spec: KernelSpec, dtype: torch.dtype) -> list[tuple[dict[str, torch.Tensor], dict]]:
    """CPU inputs and keyword arguments: each case is (tensors by argument name, kwargs)."""
    g = torch.Generator().manual_seed(20261123)
    if spec.family in TRAINING:
        out = []
        for m, n in SOFTMAX_SHAPES:
            if not spec.supports(dtype, n):
                continue
            x = 4 * torch.randn(m, n, generator=g)
            made = {"x": x, "y": torch.softmax(x, -1), "logp": torch.log_softmax(x, -1), "logits": x,
                    "dy": torch.randn(m, n, generator=g), "target": torch.randint(0, n, (m,), generator=g)}
            tensors = {k: (made[k].to(dtype) if made[k].is_floating_point() else made[k]) for k in TRAINING[spec.family]}
            out += [(tensors, kw) for kw in ([{}, {"reduction": "none"}] if spec.family == "cross_entropy" else [{}])]
        return out
    if spec.family == "softmax":
        return [({"x": (4 * torch.randn(m, n, generator=g)).to(dtype)}, {})
                for m, n in SOFTMAX_SHAPES if spec.supports(dtype, n)]
    s = ATTENTION_SHAPE
    q = torch.randn(s["b"], s["h"], s["m"], s["d"], generator=g).to(dtype)
    k = torch.randn(s["b"], s["h"], s["n"], s["d"], generator=g).to(dtype)
    v = torch.randn(s["b"], s["h"], s["n"], s["d"], generator=g).to(dtype)
    kv = {"q": q, "k": k, "v": v}
    return [(kv, {}), (kv, {"causal": True}), ({**kv, "kv_lens": torch.tensor([s["n"], 57])}, {})]


def _call(spec: KernelSpec, tensors: dict[str, torch.Tensor], kwargs: dict) -> torch.Tensor:
    if spec.family in TRAINING:
        return spec.fn(*(tensors[n] for n in TRAINING[spec.family]), **kwargs)
    if spec.family == "softmax":
        return spec.fn(tensors["x"], **kwargs)
    t = dict(tensors)
    return spec.fn(t.pop("q"), t.pop("k"), t.pop("v"), **t, **kwargs)


def _late_copy(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The inputs on `device`, written on its current stream only after a long sleep (NaN before)."""
    with torch.cuda.device(device):
        # Host-to-device copies wait for the stream; device-to-device ones do not: stage first.
        staged = {name: t.to(device) for name, t in tensors.items()}
        out = {name: (torch.full_like(t, float("nan")) if t.is_floating_point() else t) for name, t in staged.items()}
        torch.cuda._sleep(SLEEP_CYCLES)
        for name, t in staged.items():
            if t.is_floating_point():  # kv_lens (integers) is written before the sleep: no NaN form
                out[name].copy_(t, non_blocking=True)
    return out


def _assert_same_bits(ref: torch.Tensor, got: torch.Tensor, what: str) -> None:
    ref, got = ref.cpu(), got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape, (what, got.dtype, got.shape)
    ints = {2: torch.int16, 4: torch.int32}[ref.element_size()]
    diff = ref.view(ints) != got.view(ints)
    if diff.any():
        idx = tuple(int(i) for i in diff.nonzero()[0])
        raise AssertionError(f"{what}: {int(diff.sum())} of {diff.numel()} elements differ from the reference "
                             f"(first at {idx}: got {got[idx].item()!r}, reference {ref[idx].item()!r})")


def _params() -> list:
    return [pytest.param(s, d, id=f"{s.name}-{format_of(d).name}") for s in PRODUCTION for d in s.dtypes]


def _check(spec: KernelSpec, dtype: torch.dtype, run: Callable[[dict, dict], torch.Tensor], where: str) -> None:
    for tensors, kwargs in _cases(spec, dtype):
        with torch.cuda.device(0):
            ref = _call(spec, {k: t.cuda(0) for k, t in tensors.items()}, kwargs)
        got = run(tensors, kwargs)
        torch.cuda.synchronize()
        shape = tuple(next(iter(tensors.values())).shape)
        _assert_same_bits(ref, got, f"{spec.name} {format_of(dtype).name} {shape} {kwargs or ''} {where}")


@TWO_GPUS
@pytest.mark.parametrize("kernel,dtype", _params())
def test_same_bits_on_the_second_gpu(kernel: KernelSpec, dtype: torch.dtype) -> None:
    dev1 = torch.device("cuda:1")

    def run(tensors: dict, kwargs: dict) -> torch.Tensor:
        with torch.cuda.device(dev1):  # compile and load for cuda:1 first, so the race below is not hidden
            _call(kernel, {k: t.to(dev1) for k, t in tensors.items()}, kwargs)
            torch.cuda.synchronize(dev1)
        x1 = _late_copy(tensors, dev1)
        with torch.cuda.device(0):
            out = _call(kernel, x1, kwargs)
        assert out.device == dev1, f"{kernel.name}: output on {out.device}, inputs on {dev1}"
        return out

    _check(kernel, dtype, run, "on cuda:1 while the current device is cuda:0")


@pytest.mark.parametrize("kernel,dtype", _params())
def test_same_bits_on_a_side_stream(kernel: KernelSpec, dtype: torch.dtype) -> None:
    dev = torch.device("cuda:0")
    side = torch.cuda.Stream(device=dev)

    def run(tensors: dict, kwargs: dict) -> torch.Tensor:
        with torch.cuda.device(dev):
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                _call(kernel, {k: t.to(dev) for k, t in tensors.items()}, kwargs)  # warm: compiled and loaded
                x = _late_copy(tensors, dev)
                out = _call(kernel, x, kwargs)
            torch.cuda.current_stream(dev).wait_stream(side)
        return out

    _check(kernel, dtype, run, "on a non-default stream")

