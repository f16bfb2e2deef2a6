"""Limits, not numerics (issue 18, `flashcheck.properties.limits`): a correct kernel that cannot run an input
on this device is told which limit it reached and the declaration that skips that input; an fp32
attention result off by what TF32 matmuls give is told so, and `fp32_dot="tf32"` checks it against
the derived TF32 bound (`oracles.bounds.dot_input_error`), never a loosened literal.

On the CPU the GPU's exceptions are raised by fake kernels with the same types and messages
(triton's OutOfResources exists without a GPU); the grid limit by a real Triton kernel under the
interpreter (`flashcheck.interpreter.gpu`); TF32 by a kernel that reads its matmul operands as tf32 the
way the tensor cores do (`interp_gpu.tf32_truncate`).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st
from triton.runtime.errors import OutOfResources

from flashcheck.targets.external import KernelLoadError, apply_capabilities
from flashcheck.properties.runner import check, check_all
from flashcheck.strategies.case import Case
from flashcheck.interpreter.gpu import tf32_truncate
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties.limits import KernelLimit, classify, diagnosed
from flashcheck.oracles.bounds import TF32_INPUT, dot_input_error
from flashcheck.oracles.formats import FP16, FP32
from flashcheck.properties import attention as properties_attention  # noqa: F401  (registers the attention properties)
from flashcheck.properties.softmax import CORE_PROPERTIES
from flashcheck.strategies.attention import CLASSES as ATTENTION_CLASSES


def _softmax(x: torch.Tensor, **kw) -> torch.Tensor:
    return torch.softmax(x.double(), -1).to(x.dtype)


def _spec(fn, family: str = "softmax", **kw) -> KernelSpec:
    return KernelSpec(name=f"fake_{fn.__name__}", family=family, fn=fn, external=True, validates_input=False, **kw)


def _rows(n: int, m: int = 2) -> Case:
    return Case(tensors={"x": torch.randn(m, n, generator=torch.Generator().manual_seed(0)).to(DEVICE)}, label="rows")


def one_block_per_row(x: torch.Tensor, **kw) -> torch.Tensor:
    """A one-program-per-row softmax whose row must fit shared memory (112K fp32 columns do not)."""
    if x.shape[-1] >= 1000:
        raise OutOfResources(4 * triton.next_power_of_2(x.shape[-1]) * 32, 232448, "shared memory")
    return _softmax(x)


def past_the_grid(x: torch.Tensor, **kw) -> torch.Tensor:
    if x.numel() >= 4000:
        raise RuntimeError("Triton Error [CUDA]: invalid argument")
    return _softmax(x)


def test_out_of_shared_memory_names_max_n() -> None:
    with pytest.raises(AssertionError) as e:
        check_all(_spec(one_block_per_row), CORE_PROPERTIES, _rows(1500))
    msg = str(e.value)
    assert "limit reached: out of shared memory (262144 needed, 232448 per block on this GPU)" in msg, msg
    assert "declare `max_n=1499` (--kernel-max-n 1499) to skip inputs this large" in msg
    assert "the kernel raised" not in msg  # a limit, not a kernel failure


def test_invalid_argument_launch_names_max_numel() -> None:
    with pytest.raises(KernelLimit, match=r"limit reached: the launch was rejected .* declare `max_numel=4499` "
                                          r"\(--kernel-cap max_numel=4499\)"):
        check(_spec(past_the_grid), "matches_oracle", _rows(1500, m=3))
    with pytest.raises(KernelLimit, match="past 2.31 elements"):  # the message knows the 2^31 boundary
        with diagnosed(_spec(past_the_grid), {"x": torch.empty((1 << 21) + 2, 1024, device="meta")}):
            raise RuntimeError("Triton Error [CUDA]: invalid argument")


def test_declaration_the_hint_names_skips_the_input() -> None:
    """The hint's declaration is a real capability: declared, the input is outside it."""
    from flashcheck.properties.limits import within_declared_numel

    kw = apply_capabilities({}, {"max_numel": 4499}, "softmax", "test")
    spec = _spec(past_the_grid, **kw)
    assert not within_declared_numel(spec, _rows(1500, m=3).tensors)
    assert within_declared_numel(spec, _rows(1499, m=3).tensors)
    with pytest.raises(KernelLoadError, match="capability 'fp32_dot' is for attention kernels"):
        apply_capabilities({}, {"fp32_dot": "tf32"}, "softmax", "test")


@triton.jit
def _row_per_program_y(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(1)  # rows on grid axis y: a GPU takes at most 65535 of them
    cols = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    e = tl.exp(v - tl.max(v, 0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, 0), mask=cols < n)


def rows_on_grid_y(x: torch.Tensor, **kw) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _row_per_program_y[(1, x.shape[0])](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's grid check stands in for the GPU's launch error")
def test_grid_limit_of_a_real_kernel_names_max_numel() -> None:
    with pytest.raises(KernelLimit, match=r"launch was rejected .*M?max_numel=131071"):
        check(_spec(rows_on_grid_y, dtypes=(torch.float32,)), "matches_oracle", _rows(2, m=65536))


def test_an_ordinary_exception_is_not_a_limit() -> None:
    assert classify(ValueError("N=5 is too short"), _spec(_softmax), _rows(5).tensors) is None
    assert classify(RuntimeError("CUDA error: an illegal memory access"), _spec(_softmax), _rows(5).tensors) is None


# ---- TF32 ------------------------------------------------------------------------------------

def _tf32(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(tf32_truncate(t.detach().cpu().float().numpy())).to(t.device)


def tf32_attention(q, k, v, *, causal=False, scale=None, kv_lens=None):
    """fp32 attention as a kernel with tl.dot's default fp32 precision computes it: Q, K, P and V
    read as tf32 (low 13 mantissa bits dropped), products exact, sums in float64 (fewer roundings
    than fp32: inside any bound that holds for fp32 sums)."""
    assert not causal and kv_lens is None
    sc = scale if scale is not None else q.shape[-1] ** -0.5
    s = _tf32(q).double() @ _tf32(k).double().transpose(-1, -2) * float(np.float32(sc))
    p = torch.exp(s - s.amax(-1, keepdim=True)).float()
    o = _tf32(p).double() @ _tf32(v).double() / p.double().sum(-1, keepdim=True)
    return o.float()


def _tf32_spec(fp32_dot: str | None) -> KernelSpec:
    caps = {"dtypes": "fp32", "causal": False, "kv_lens": False, "gqa": False, "dv": False, "window": False,
            "softcap": False, "lse": False, "attn_mask": False, "splits": False, "varlen": False}
    if fp32_dot:
        caps["fp32_dot"] = fp32_dot
    return _spec(tf32_attention, "attention", **apply_capabilities({}, caps, "attention", "test"))


def _attention_case(n: int = 200, d: int = 64, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, s, d, generator=g).to(DEVICE) for s in (8, n, n))
    return Case(tensors={"q": q * 2, "k": k, "v": v}, kwargs={"causal": False, "scale": None}, label="tf32")


def test_tf32_unit_is_derived() -> None:
    assert TF32_INPUT == 2.0**-10  # 10 explicit mantissa bits, truncated: < 1 ulp of tf32
    x = np.float32(1) + np.float32(2.0**-10) * np.arange(1, 1024, dtype=np.float32) / 1024
    assert np.all(np.abs(tf32_truncate(x) - x) / x < TF32_INPUT)
    assert dot_input_error(FP32, "tf32") == TF32_INPUT and dot_input_error(FP16, "tf32") == 0.0
    assert dot_input_error(FP32, "ieee") == 0.0


def test_tf32_error_is_diagnosed_and_declared_tf32_passes() -> None:
    with pytest.raises(AssertionError, match=r"limit reached: fp32 precision of its matmuls: every element is within "
                                             r"the TF32 bound.*declare `fp32_dot='tf32'`"):
        check(_tf32_spec(None), "matches_oracle", _attention_case())
    check(_tf32_spec("tf32"), "matches_oracle", _attention_case())  # a new case: outcomes are cached per case


def test_the_report_judges_a_declared_tf32_kernel_by_the_suites_bound() -> None:
    from flashcheck.oracles.formats import FP32 as F32
    from flashcheck.reports.stability import attention as report

    p = report.prepare(_attention_case(), F32)
    verdicts = {dot: report.measure(spec, p, report.call(spec, p)).violation.sum()
                for dot, spec in (("ieee", _tf32_spec(None)), ("tf32", _tf32_spec("tf32")))}
    assert verdicts["ieee"] > 0 and verdicts["tf32"] == 0, verdicts


@settings(max_examples=15, deadline=None, database=None, derandomize=True)
@given(data=st.data())
def test_tf32_bound_holds_for_a_tf32_kernel(data: st.DataObject) -> None:
    """Soundness of the derived TF32 terms: a tf32 kernel meets the bound on adversarial classes."""
    cls = data.draw(st.sampled_from(["benign", "wide_logit_spread", "odd_head_dims", "tied_scores"]))
    case = data.draw(ATTENTION_CLASSES[cls](dtype=torch.float32, strided=False))
    case = Case(tensors={k: v for k, v in case.tensors.items() if k in "qkv"},
                kwargs={"causal": False, "scale": case.kwargs.get("scale")}, label=case.label)
    check(_tf32_spec("tf32"), "matches_oracle", case)


def _no_gqa(q, k, v, **kw):
    if q.shape[1] != k.shape[1]:
        raise RuntimeError(f"heads of q ({q.shape[1]}) and k ({k.shape[1]}) differ")
    return q


def _attn_tensors(hq: int, hkv: int, m: int = 4, n: int = 4, dv: int = 8) -> dict[str, torch.Tensor]:
    return {"q": torch.zeros(1, hq, m, 8), "k": torch.zeros(1, hkv, n, 8), "v": torch.zeros(1, hkv, n, dv)}


@pytest.mark.parametrize("shape, key", [((4, 2), "gqa=False"), ((2, 2, 4, 6), "square_only=True"),
                                        ((2, 2, 4, 4, 16), "dv=False")])
def test_a_feature_no_signature_shows_is_named_with_its_declaration(shape, key):
    """A bare attention function that raises on grouped heads failed with the raw RuntimeError, no hint
    that `gqa=False` was the declaration; the same for M != N and a v head dim of its own."""
    def kernel(q, k, v, **kw):
        raise RuntimeError("unsupported shape")

    spec = _spec(kernel, family="attention")
    with pytest.raises(Exception) as e, diagnosed(spec, _attn_tensors(*shape)):
        spec.fn(**_attn_tensors(*shape))
    assert type(e.value).__name__ == "KernelUnsupported", e.value
    assert f"declare `{key}`" in str(e.value) and "unsupported shape" in str(e.value), str(e.value)
    with pytest.raises(RuntimeError, match="differ") as e2, diagnosed(_spec(_no_gqa, family="attention"), _attn_tensors(4, 4)):
        raise RuntimeError("oracle side: heads differ")  # raised outside the kernel's file: no hint
    assert type(e2.value) is RuntimeError
