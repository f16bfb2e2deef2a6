"""The exact interpreter (flashcheck/interpreter/exact.py): bf16 conversions bit for bit against torch
through real @triton.jit kernels, bf16 arithmetic, reductions and tl.dot, a naive external softmax
within the oracle's bound, and @triton.autotune kernels checked config by config.

On a GPU the same kernels check the hardware's conversions; the tests that show what the patch
fixes (`unpatched`) need the interpreter.
"""
from __future__ import annotations

import math
import types
from fractions import Fraction

import numpy as np
import pytest
import torch

from flashcheck.interpreter import autotune
from flashcheck.interpreter import exact as fi
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels._runtime import tl, triton
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import format_of, round_float64, to_float64
from flashcheck.oracles.rounding import round_fraction
from tests.bits import ALL16, assert_quiet_nans, assert_same_bits, bits_of, f32_rounding_cases

needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="compares against Triton's own interpreter")
# One program covers a whole test vector in the interpreter (NumPy is vectorised over the block);
# a GPU takes ordinary blocks.
BLOCK = 1 << 16 if INTERPRET else 1024


# ---- kernels written the way a kernel author writes them ---------------------------------------

@triton.jit
def _convert_kernel(x_ptr, y_ptr, n, EXPLICIT: tl.constexpr, RTZ: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if RTZ:
        tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtz"), mask=mask)
    elif EXPLICIT:
        tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptr + offs, x, mask=mask)  # tl.store converts to the pointee type


@triton.jit
def _bitcast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x.to(tl.int16, bitcast=True), mask=mask)


@triton.jit
def _binary_kernel(a_ptr, b_ptr, add_ptr, mul_ptr, sub_ptr, max_ptr, lt_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(add_ptr + offs, a + b, mask=mask)
    tl.store(mul_ptr + offs, a * b, mask=mask)
    tl.store(sub_ptr + offs, a - b, mask=mask)
    tl.store(max_ptr + offs, tl.maximum(a, b), mask=mask)
    tl.store(lt_ptr + offs, (a < b).to(tl.int8), mask=mask)


@triton.jit
def _row_max_kernel(x_ptr, max_ptr, arg_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=float("-inf"))
    tl.store(max_ptr + row, tl.max(x, axis=0))
    tl.store(arg_ptr + row, tl.argmax(x, axis=0))


@triton.jit
def _misc_kernel(a_ptr, b_ptr, i_ptr, const_ptr, int_ptr, where_ptr, fma_ptr, clamp_ptr, pad_ptr, n, n_int,
                 BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(const_ptr + offs, tl.full([BLOCK], 1.00390625, tl.bfloat16) + tl.zeros([BLOCK], tl.bfloat16), mask=mask)
    tl.store(int_ptr + offs, tl.load(i_ptr + offs, mask=offs < n_int).to(tl.bfloat16), mask=offs < n_int)
    tl.store(where_ptr + offs, tl.where(a < b, a, -3.0e38), mask=mask)
    tl.store(fma_ptr + offs, tl.fma(a, b, a), mask=mask)
    tl.store(clamp_ptr + offs, tl.clamp(a, -b, b), mask=mask)
    block = tl.make_block_ptr(a_ptr, shape=(n,), strides=(1,), offsets=(0,), block_shape=(BLOCK,), order=(0,))
    tl.store(pad_ptr + offs, tl.load(block, boundary_check=(0,), padding_option="nan"))


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m = tl.arange(0, M)
    k = tl.arange(0, K)
    n = tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))


@triton.jit
def _naive_softmax_kernel(x_ptr, y_ptr, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    num = tl.exp(z)
    y = num / tl.sum(num, axis=0)
    tl.store(y_ptr + row * stride_y + offs, y, mask=mask)


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _naive_softmax_kernel[(x.shape[0],)](x, y, x.stride(0), y.stride(0), x.shape[1],
                                         BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def convert(x: torch.Tensor, dtype: torch.dtype, *, explicit: bool = True, rtz: bool = False) -> torch.Tensor:
    x = x.to(DEVICE)
    y = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    _convert_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), EXPLICIT=explicit, RTZ=rtz, BLOCK=BLOCK)
    return y.cpu()


# ---- inputs ---------------------------------------------------------------------------------

# ---- conversions ----------------------------------------------------------------------------

@pytest.mark.parametrize("explicit", [True, False], ids=["to", "store"])
def test_bf16_to_f32_all_patterns(explicit: bool) -> None:
    x = ALL16.view(torch.bfloat16)
    assert_same_bits(convert(x, torch.float32, explicit=explicit), x.float(), "bf16 -> fp32")


@pytest.mark.parametrize("explicit", [True, False], ids=["to", "store"])
def test_f32_to_bf16_rounding(explicit: bool) -> None:
    x = f32_rounding_cases()
    y = convert(x, torch.bfloat16, explicit=explicit)
    assert_same_bits(y, x.to(torch.bfloat16), "fp32 -> bf16")
    assert_quiet_nans(y, "fp32 -> bf16")


def test_f32_to_bf16_round_toward_zero() -> None:
    x = f32_rounding_cases()
    want = torch.from_numpy((bits_of(x) >> np.uint32(16)).astype(np.uint16)).view(torch.bfloat16)
    want[torch.isnan(x)] = float("nan")  # truncating a NaN's bits can leave an infinity
    y = convert(x, torch.bfloat16, rtz=True)
    assert_same_bits(y, want, "fp32 -> bf16 rtz")
    assert_quiet_nans(y, "fp32 -> bf16 rtz")


def test_f32_to_f16_round_toward_zero() -> None:
    x = f32_rounding_cases()
    x = x[torch.isfinite(x)].numpy().astype(np.float64)
    h = ALL16.view(torch.float16)
    grid = np.unique(np.abs(h[torch.isfinite(h)].double().numpy()))  # every finite fp16 magnitude
    want = np.copysign(grid[np.searchsorted(grid, np.abs(x), side="right") - 1], x)  # largest not above |x|
    y = convert(torch.from_numpy(x).float(), torch.float16, rtz=True)
    assert_same_bits(y, torch.from_numpy(want).to(torch.float16), "fp32 -> fp16 rtz")


def test_f64_to_bf16_single_rounding() -> None:
    x32 = f32_rounding_cases().double()
    # a tie in fp32 that is not a tie in fp64: rounding through fp32 would round twice
    near_ties = np.array([1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8 - 2.0**-40, -(3 + 2.0**-7 + 2.0**-45),
                          2.0**-133 * (6.5 + 2.0**-30), 3.3961e38, 1e300, -1e300, 1e-300])
    x = torch.cat([x32, torch.from_numpy(near_ties)])
    finite = torch.isfinite(x).numpy()
    want = torch.from_numpy(round_float64(x.numpy(), format_of(torch.bfloat16))).to(torch.bfloat16)
    want[~torch.from_numpy(finite)] = x[~torch.from_numpy(finite)].to(torch.bfloat16)
    assert_same_bits(convert(x, torch.bfloat16), want, "fp64 -> bf16")


def test_f16_bf16_all_patterns() -> None:
    h = ALL16.view(torch.float16)
    assert_same_bits(convert(h, torch.bfloat16), h.float().to(torch.bfloat16), "fp16 -> bf16")
    b = ALL16.view(torch.bfloat16)
    y = convert(b, torch.float16)
    assert_same_bits(y, b.float().to(torch.float16), "bf16 -> fp16")
    assert_quiet_nans(y, "bf16 -> fp16")


def test_f16_conversions_exact() -> None:
    h = ALL16.view(torch.float16)
    assert_same_bits(convert(h, torch.float32), h.float(), "fp16 -> fp32")
    # every midpoint between neighbouring fp16 values (subnormals included; exact in fp32) and the
    # fp32 values just beside it, plus the bf16-based cases (overflow boundary, NaN payloads)
    v = torch.unique(h.float()[torch.isfinite(h)]).numpy()
    mids = (v[:-1] + v[1:]) / np.float32(2)
    beside = [np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    x = np.concatenate([mids, *beside, np.float32([65520.0, -65520.0, 65519.996])])
    x = torch.from_numpy(np.concatenate([x, f32_rounding_cases().numpy()]))
    y = convert(x, torch.float16)
    assert_same_bits(y, x.to(torch.float16), "fp32 -> fp16")
    assert_quiet_nans(y, "fp32 -> fp16")


def test_bitcast_untouched() -> None:
    x = ALL16.view(torch.bfloat16).to(DEVICE)
    y = torch.empty(x.shape, dtype=torch.int16, device=DEVICE)
    _bitcast_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    assert torch.equal(y.cpu(), ALL16)


# ---- arithmetic, reductions, dot --------------------------------------------------------------

def _bf16_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-(1 << 15), 1 << 15, (1 << 14,), generator=g, dtype=torch.int32).to(torch.int16)
    b = torch.randint(-(1 << 15), 1 << 15, (1 << 14,), generator=g, dtype=torch.int32).to(torch.int16)
    # near-equal magnitudes and exponents too: cancellation, ties, subnormal results
    b[: 1 << 12] = a[: 1 << 12] ^ torch.randint(0, 1 << 4, (1 << 12,), generator=g, dtype=torch.int16)
    return a.view(torch.bfloat16), b.view(torch.bfloat16)


def test_bf16_arithmetic_correctly_rounded() -> None:
    a, b = _bf16_pairs()
    outs = [torch.empty_like(a, device=DEVICE) for _ in range(4)] + [torch.empty(a.shape, dtype=torch.int8, device=DEVICE)]
    _binary_kernel[(triton.cdiv(a.numel(), BLOCK),)](a.to(DEVICE), b.to(DEVICE), *outs, a.numel(), BLOCK=BLOCK)
    add, mul, sub, mx, lt = (o.cpu() for o in outs)
    # torch's CPU bf16 ops compute in fp32 and round once: correctly rounded for + - *
    assert_same_bits(add, a + b, "bf16 a + b")
    assert_same_bits(mul, a * b, "bf16 a * b")
    assert_same_bits(sub, a - b, "bf16 a - b")
    # tl.maximum's default propagate_nan=NONE is maxnum on the GPU (PTX max): NaN and x give x, for
    # signalling NaNs too (torch.fmax makes those NaN)
    maxnum = torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.maximum(a, b)))
    assert_same_bits(mx, maxnum, "tl.maximum on bf16")
    assert torch.equal(lt, (a < b).to(torch.int8)), "bf16 a < b"


def test_bf16_max_argmax() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 100, generator=g).mul(torch.logspace(-40, 30, 64).unsqueeze(1)).to(torch.bfloat16)
    x[3] = -x[3].abs()  # all negative: a raw-bit max picks the most negative
    mx = torch.empty(64, dtype=torch.bfloat16, device=DEVICE)
    arg = torch.empty(64, dtype=torch.int32, device=DEVICE)
    _row_max_kernel[(64,)](x.to(DEVICE), mx, arg, 100, BLOCK=128)
    assert_same_bits(mx.cpu(), x.max(dim=1).values, "tl.max on bf16")
    assert torch.equal(x.gather(1, arg.cpu().long().unsqueeze(1)).squeeze(1), x.max(dim=1).values)


def test_bf16_constants_ints_where_fma_clamp_padding() -> None:
    a, b = (t[:1000] for t in _bf16_pairs())
    b = b.abs()
    # as long as the other inputs: the kernel loads 1000 of each (60 read 940 past the end, on a GPU too)
    ints = torch.tensor([257, 259, -(2**24) - 3, 2**31 - 1, 0, -1] * 167, dtype=torch.int32)[:1000]
    n = ints.numel()
    outs = [torch.empty(1000 if i < 5 else 1024, dtype=torch.bfloat16, device=DEVICE) for i in range(6)]
    _misc_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), ints.to(DEVICE), *outs, 1000, n, BLOCK=1024)
    const, as_bf16, where, fma, clamp, pad = (o.cpu() for o in outs)
    assert (const.view(torch.int16) == 0x3F80).all(), "1 + 2**-8 is a tie: to even, 1.0"
    assert_same_bits(as_bf16[:n], ints.double().to(torch.bfloat16), "int32 -> bf16")  # exact in fp64
    assert_same_bits(where, torch.where(a < b, a, torch.tensor(-3.0e38).to(torch.bfloat16)), "tl.where on bf16")
    # The exact a * b + a rounded once (the GPU's fma); a float64 sum first would round twice.
    bf = format_of(torch.bfloat16)
    want_fma = [round_fraction(Fraction(x) * Fraction(y) + Fraction(x), bf) if math.isfinite(x) and math.isfinite(y)
                else x * y + x for x, y in zip(a.tolist(), b.tolist())]
    assert_same_bits(fma, torch.tensor(want_fma, dtype=torch.float64).to(torch.bfloat16), "tl.fma on bf16")
    assert_same_bits(clamp, torch.minimum(torch.maximum(a, -b), b), "tl.clamp on bf16")
    assert_same_bits(pad[:1000], a, "block-pointer load of bf16")
    assert torch.isnan(pad[1000:]).all(), "padding_option='nan' on bf16"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dot_exact(dtype: torch.dtype) -> None:
    """Integers up to 2**8 are exact in both formats, and so is every sum here in fp32: the dot
    must give the exact product."""
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-256, 257, (16, 32), generator=g).to(dtype)
    b = torch.randint(-256, 257, (32, 16), generator=g).to(dtype)
    c = torch.empty(16, 16, dtype=torch.float32, device=DEVICE)
    _dot_kernel[(1,)](a.to(DEVICE), b.to(DEVICE), c, M=16, K=32, N=16)
    assert torch.equal(c.cpu().double(), a.double() @ b.double())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dot_row_bits_do_not_depend_on_the_tile(dtype: torch.dtype) -> None:
    """A row of a @ b has the same bits in a 32-row tile, in a 16-row tile of other rows and with
    the rows permuted. np.matmul (BLAS) broke this on an AVX2 CPU: the bit-identity properties
    (query permutation, block_m) then failed a correct kernel."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(32, 32, generator=g).to(dtype)
    b = torch.randn(32, 16, generator=g).to(dtype)

    def dot(rows: torch.Tensor) -> torch.Tensor:
        c = torch.empty(rows.shape[0], 16, dtype=torch.float32, device=DEVICE)
        _dot_kernel[(1,)](rows.contiguous().to(DEVICE), b.to(DEVICE), c, M=rows.shape[0], K=32, N=16)
        return c.cpu()

    full = dot(a)
    perm = torch.randperm(32, generator=g)
    assert_same_bits(dot(a[perm]), full[perm], "rows permuted")
    assert_same_bits(dot(a[perm[:16]]), full[perm[:16]], "16 of the rows")


# ---- a naive external softmax on adversarial bf16 rows -----------------------------------------

def adversarial_bf16_rows() -> torch.Tensor:
    """Rows whose bf16 outputs are subnormal (spreads of 88-93 nats), round near ties, hold
    huge and tiny magnitudes, -inf, and equal entries."""
    n = 48
    rows = [
        torch.cat([torch.zeros(1), -torch.linspace(85.0, 93.0, n - 1)]),  # subnormal outputs
        torch.cat([torch.full((2,), 3.0e38), torch.linspace(3.0e38, -3.0e38, n - 2)]),
        torch.cat([torch.zeros(4), torch.full((n - 4,), -89.5)]),
        torch.cat([torch.full((n - 1,), -float("inf")), torch.zeros(1)]),
        torch.full((n,), -7.25),
        torch.linspace(-1e-38, 1e-38, n),
        -torch.logspace(-2, 2, n).flip(0) * 0.93,
    ]
    g = torch.Generator().manual_seed(3)
    rows += [torch.randn(n, generator=g) * s for s in (1.0, 10.0, 40.0)]
    return torch.stack(rows).to(torch.bfloat16)


def softmax_violations(y: torch.Tensor, x: torch.Tensor) -> tuple[int, float]:
    cmp = compare_softmax(to_float64(x), to_float64(y), format_of(x.dtype), depth=x.shape[1])
    bad = cmp.violations
    return int(bad.sum()), float(np.max(np.where(bad, cmp.dist, 0.0)))


def test_naive_softmax_within_bound() -> None:
    x = adversarial_bf16_rows()
    x0 = x.clone()
    count, worst = softmax_violations(naive_softmax(x.to(DEVICE)).cpu(), x)
    assert torch.equal(x.view(torch.int16), x0.view(torch.int16))
    assert count == 0, f"{count} elements beyond the bound, worst {worst} ULP"


@needs_interpreter
def test_naive_softmax_fails_unpatched() -> None:
    """The same correct kernel on Triton's own interpreter: its bf16 store truncates and mangles
    subnormals, and the suite would blame the kernel."""
    x = adversarial_bf16_rows()
    with fi.unpatched():
        y = naive_softmax(x.to(DEVICE)).cpu()
    count, worst = softmax_violations(y, x)
    assert count > 0 and worst > 2, (count, worst)


@needs_interpreter
def test_unpatched_conversions_are_wrong() -> None:
    """What the patch fixes, measured: without it, fp32 -> bf16 truncates and subnormals break."""
    x = f32_rounding_cases()
    with fi.unpatched():
        y = convert(x, torch.bfloat16)
        b = convert(ALL16.view(torch.bfloat16), torch.float32)
    assert (bits_of(y) != bits_of(x.to(torch.bfloat16))).sum() > 1000
    assert (bits_of(b) != bits_of(ALL16.view(torch.bfloat16).float())).sum() > 100


# ---- @triton.autotune --------------------------------------------------------------------------

CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=4),
           triton.Config({"BLOCK": 256}, num_warps=8)]


@triton.autotune(configs=CONFIGS, key=["n_cols"])
@triton.jit
def _tuned_softmax_kernel(x_ptr, y_ptr, cols_ptr, n_cols, BLOCK: tl.constexpr):
    """Online softmax over tiles of BLOCK: each config takes a different path through the row."""
    row = tl.program_id(0)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, tl.exp(x - m) / s, mask=offs < n_cols)
    tl.store(cols_ptr + row, BLOCK)  # which config ran


def tuned_softmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty_like(x)
    block = torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
    _tuned_softmax_kernel[(x.shape[0],)](x, y, block, x.shape[1])
    return y, block


def test_autotune_runs_every_config() -> None:
    x = torch.cat([adversarial_bf16_rows()] * 6, dim=1)[:, :200].contiguous()  # several tiles per row
    assert autotune.autotuned_kernels(tuned_softmax) == [_tuned_softmax_kernel]
    assert autotune.autotune_configs(tuned_softmax) == CONFIGS
    tunings = autotune.tunings(tuned_softmax)
    assert [t.label for t in tunings] == [f"_tuned_softmax_kernel[{autotune.describe_config(c)}]" for c in CONFIGS]
    for tuning, config in zip(tunings, CONFIGS):
        with tuning():
            y, block = tuned_softmax(x.to(DEVICE))
        assert (block.cpu() == config.kwargs["BLOCK"]).all(), tuning.label
        count, worst = softmax_violations(y.cpu(), x)
        assert count == 0, f"{tuning.label}: {count} elements beyond the bound, worst {worst} ULP"
    y, block = tuned_softmax(x.to(DEVICE))  # nothing forced: runs (the first config, in the interpreter)
    if INTERPRET:
        assert (block.cpu() == CONFIGS[0].kwargs["BLOCK"]).all()


def test_force_config_rejects_foreign_config() -> None:
    with pytest.raises(ValueError, match="not one of"):
        with autotune.force_config(_tuned_softmax_kernel, triton.Config({"BLOCK": 64}, num_warps=1)):
            pass
    with pytest.raises(ValueError, match="holds 0"):
        autotune.autotune_configs(naive_softmax)


# ---- the patch's own guard rails ----------------------------------------------------------------

@needs_interpreter
def test_install_is_idempotent_and_checked() -> None:
    assert fi.installed() and fi.install()
    import triton.runtime.interpreter as interp
    saved = interp.InterpreterBuilder.cast_impl
    try:
        interp.InterpreterBuilder.cast_impl = lambda self, src: None  # an interpreter of another shape
        with pytest.raises(fi.InterpreterPatchError, match=f"triton {triton.__version__}"):
            fi._check_internals(interp)
    finally:
        interp.InterpreterBuilder.cast_impl = saved


def test_skip_helper_names_the_bug() -> None:
    with pytest.raises(KeyError):
        fi.skip_if_interpreter_bug("no such bug")
    if INTERPRET:
        with pytest.raises(pytest.skip.Exception, match="interpreter bug, not the kernel's"):
            fi.skip_if_interpreter_bug("fp8")


_kernels_module = types.ModuleType("kernels_module")
_kernels_module.softmax_kernel = _tuned_softmax_kernel


def test_autotuned_kernels_found_through_module_and_closure() -> None:
    def through_module(x: torch.Tensor) -> None:
        _kernels_module.softmax_kernel[(1,)](x, x, x, 1)

    def make_closure():
        kernel = _tuned_softmax_kernel

        def launch(x: torch.Tensor) -> None:
            kernel[(1,)](x, x, x, 1)
        return launch

    assert autotune.autotuned_kernels(through_module) == [_tuned_softmax_kernel]
    assert autotune.autotuned_kernels(make_closure()) == [_tuned_softmax_kernel]
    assert autotune.autotuned_kernels(_tuned_softmax_kernel) == [_tuned_softmax_kernel]
    assert autotune.tunings(naive_softmax) == []


@needs_interpreter
def test_run_time_loop_bounds_convert_without_int_of_an_array() -> None:
    """NumPy >= 2.4 refuses `int()` of a 1-element array, which Triton 3.6's interpreter used for
    every scalar index and run-time loop bound: each kernel with `range(lo, hi, BLOCK)` failed, and
    a mutation run on such a machine counted that as killing every mutant."""
    import triton.runtime.interpreter as interp

    fi.install()

    class _Strict(np.ndarray):  # NumPy 2.4's conversion rule, on any NumPy
        def __int__(self) -> int:
            if self.ndim:
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
            return int(self.item())

    scope = interp._LangPatchScope()
    interp._patch_lang_tensor(tl.tensor, scope)
    try:
        bound = tl.tensor(interp.TensorHandle(np.array([7], dtype=np.int32).view(_Strict), tl.int32), tl.int32)
        assert list(range(0, bound, 3)) == [0, 3, 6]
    finally:
        scope.restore()
