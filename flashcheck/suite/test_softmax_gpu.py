"""GPU-only softmax tests: long rows (1M and one row of 64M), more than 2^31 elements, and the
identical-bits promise of every registered launch configuration on real hardware.

Every output is checked against the certified oracle (`oracles.softmax.softmax_oracle`) with
the kernel's derived bound (`oracles.compare.compare_softmax`: ULP distance, the per-element
bound of `oracles.bounds.softmax_ulp_bound` at the kernel's rounding depth, allowed flushes to
zero). On the CPU (Triton interpreter) these sizes would take hours: the module skips.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcheck import kernels

from flashcheck.plugin import devices
from flashcheck.targets.external import declared_as
from flashcheck.kernels.registry import KernelSpec, get, kernels as registered
from flashcheck.properties.limits import diagnosed, within_declared_numel
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import FLOAT_DTYPES, format_of, to_float64


@pytest.fixture
def big_memory(request: pytest.FixtureRequest):
    """Tests of several GB each take turns on the GPU (`devices.exclusive_memory`): many at once,
    from parallel workers and the zoo's nested runs, ran it out of memory."""
    with devices.exclusive_memory(request.node.nodeid):
        yield


pytestmark = pytest.mark.skipif(kernels.INTERPRET, reason="GPU only: rows of 1M-64M elements and "
                                "tensors over 2^31 elements are out of reach of the Triton interpreter")

FAMILY = "softmax"  # test_past_2_31_elements runs for every active kernel (or --kernel's)
DTYPES = FLOAT_DTYPES


def _adversarial_rows(m: int, n: int, seed: int) -> np.ndarray:
    """Rows mixing the hard classes at scale: a leading -inf run covering several chunks then
    logits < -90 only, an interior -inf run, an increasing row (rescale every chunk), a peaked
    row, wide-spread normals."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n)) * 4
    kinds = ["lead_inf", "mid_inf", "increasing", "peaked", "spread"]
    for r in range(m):
        k = kinds[r % len(kinds)]
        if k == "lead_inf":
            x[r] = rng.uniform(-130, -95, n)
            x[r, : n // 3] = -np.inf
        elif k == "mid_inf":
            x[r, n // 4: n // 2] = -np.inf
        elif k == "increasing":
            x[r] = np.linspace(-60, 30, n)
        elif k == "peaked":
            x[r] = rng.uniform(-0.5, 0.5, n)
            x[r, rng.integers(n)] = 20
        else:
            x[r] = rng.standard_normal(n) * 30
    return x


def _check(spec_name: str | KernelSpec, x: torch.Tensor, y: torch.Tensor, rows: np.ndarray | None = None) -> None:
    spec = get(spec_name) if isinstance(spec_name, str) else spec_name
    spec_name = spec.name
    x64, y64 = to_float64(x if rows is None else x[rows]), to_float64(y if rows is None else y[rows])
    c = compare_softmax(x64, y64, format_of(y.dtype), depth=spec.summation_depth(x.shape[1]))
    bad = c.violations
    if bad.any():
        r, col = np.argwhere(bad)[0]
        raise AssertionError(
            f"{spec_name} {x.dtype}->{y.dtype} {tuple(x.shape)}: {int(bad.sum())} elements over the bound; "
            f"first at [{r}, {col}]: x={x64[r, col]!r} y={y64[r, col]!r} oracle={c.oracle[r, col]!r} "
            f"ulps={c.dist[r, col]} bound={c.bound[r, col]}")
    ratio = c.bound_ratio()
    print(f"{spec_name} {x.dtype} {tuple(x.shape)}: max ulps {np.nanmax(np.where(np.isfinite(c.dist), c.dist, 0)):g}, "
          f"max measured/bound {np.nanmax(ratio):.3g}, flushed {int(c.ftz.sum())}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", ["softmax_online", "softmax_split", "softmax"])
def test_rows_of_1m(name: str, dtype: torch.dtype) -> None:
    x = torch.from_numpy(_adversarial_rows(5, 1 << 20, seed=1)).to(dtype).cuda()
    before = x.clone()
    y = get(name).fn(x)
    torch.cuda.synchronize()
    assert torch.equal(x.view(torch.uint8), before.view(torch.uint8)), "input modified"
    _check(name, x, y)


# One row of 64M elements. The oracle in float64 over 64M elements takes minutes, so two
# constructions give the exact answer from a small oracle call:
#  * dense: a row of 4096 values tiled 2^14 times. Its exact sum is 2^14 times the pattern's,
#    so each exact output is the pattern's exact output times 2^-14; correct rounding commutes
#    with that power-of-two scaling while the results stay in the normal range of the output
#    format (pattern values in [-24, 0] keep every output above 2^-70), so fp32 and bf16
#    outputs only. The bound is the kernel's at n = 64M.
#  * sparse: -inf everywhere but 2^20 finite entries in runs (whole spans of -inf first, in the
#    middle and at the end: every kind of empty-state merge); the exact softmax of the row is
#    that of its finite entries at their places and exact zeros elsewhere.
N64M = 1 << 26


@pytest.mark.parametrize("dtype,out_dtype,name", [
    (torch.float16, torch.float32, "softmax"), (torch.bfloat16, torch.bfloat16, "softmax"),
    (torch.float32, torch.float32, "softmax"), (torch.float32, torch.float32, "softmax_split"),
], ids=str)
def test_single_row_of_64m_dense(dtype: torch.dtype, out_dtype: torch.dtype, name: str, big_memory: None) -> None:
    from flashcheck.oracles.bounds import ftz_allowed, softmax_ulp_bound
    from flashcheck.oracles.formats import ulp_distance
    from flashcheck.oracles.softmax import softmax_oracle

    spec = get(name)
    rng = np.random.default_rng(5)
    p = 4096
    pattern = torch.from_numpy(rng.uniform(-24, 0, (1, p))).to(dtype)
    x = pattern.cuda().repeat(1, N64M // p)
    y = spec.fn(x, out_dtype=out_dtype)
    fmt = format_of(out_dtype)
    p64 = to_float64(pattern)
    oracle = softmax_oracle(p64, fmt) * 2.0**-14  # exact scaling, normal range
    assert np.all(oracle >= 2.0**-100)
    bound = softmax_ulp_bound(p64, oracle, fmt, depth=spec.summation_depth(N64M))
    y64 = to_float64(y).reshape(-1, p)
    dist = ulp_distance(y64, np.broadcast_to(oracle, y64.shape), fmt)
    bad = (dist > bound) & ~ftz_allowed(y64, np.broadcast_to(oracle, y64.shape))
    assert not bad.any(), (f"{name} {dtype}->{out_dtype}: {int(bad.sum())} of {bad.size} over the bound; "
                           f"max ulps {dist.max():g}, bound {bound.min():g}..{bound.max():g}")
    print(f"{name} {dtype}->{out_dtype} 1x64M dense: max ulps {dist.max():g}, "
          f"max measured/bound {(dist / bound).max():.3g}")


@pytest.mark.parametrize("dtype,name", [(torch.float16, "softmax"), (torch.bfloat16, "softmax_split"),
                                        (torch.float32, "softmax")], ids=str)
def test_single_row_of_64m_sparse(dtype: torch.dtype, name: str, big_memory: None) -> None:
    from flashcheck.oracles.bounds import ftz_allowed, softmax_ulp_bound
    from flashcheck.oracles.formats import ulp_distance
    from flashcheck.oracles.softmax import softmax_oracle

    spec = get(name)
    rng = np.random.default_rng(6)
    x = torch.full((1, N64M), float("-inf"), dtype=dtype)
    starts = np.sort(rng.choice(np.arange(N64M // 8, N64M - (1 << 16)), 64, replace=False))
    starts[0] = N64M // 2 - 12345  # an unaligned run in the middle
    finite = np.concatenate([np.arange(s, s + (1 << 14)) for s in starts])
    finite = np.unique(finite)
    vals = torch.from_numpy(rng.standard_normal(finite.size) * 8).to(dtype)
    x[0, torch.from_numpy(finite)] = vals
    y = spec.fn(x.cuda()).cpu()
    fmt = format_of(y.dtype)
    v64 = to_float64(vals)[None, :]
    oracle = softmax_oracle(v64, fmt)
    y64 = to_float64(y)
    assert np.all(y64[0, np.setdiff1d(np.arange(0, N64M, 4099), finite)] == 0), "-inf must give exact 0"
    rest = y64.copy()
    rest[0, finite] = 0
    assert not np.any(rest != 0), "-inf entries must give exact zeros"
    yf = y64[:, finite]
    bound = softmax_ulp_bound(v64, oracle, fmt, depth=spec.summation_depth(N64M))
    dist = ulp_distance(yf, oracle, fmt)
    bad = (dist > bound) & ~ftz_allowed(yf, oracle)
    assert not bad.any(), f"{name} {dtype}: {int(bad.sum())} over the bound, max ulps {dist.max():g}"
    print(f"{name} {dtype} 1x64M sparse: max ulps {dist.max():g}")


def test_more_than_2_31_elements(big_memory: None) -> None:
    """fp16 (65537, 32768): M*N = 2^31 + 32768 elements, 4.3 GB in, 4.3 GB out. Rows around the
    2^31 element boundary and at the end are checked against the oracle for every variant."""
    m, n = (1 << 16) + 1, 1 << 15
    assert m * n > 2**31
    torch.manual_seed(3)
    x = torch.randn(m, n, device="cuda", dtype=torch.float16) * 5
    x[-1, : n // 2] = float("-inf")
    boundary = (2**31) // n  # the first row past 2^31 elements
    rows = np.array([0, 1, boundary - 1, boundary, m - 1])
    y = torch.empty_like(x)
    for name in ("softmax_row", "softmax_online", "softmax_split", "softmax"):
        y.fill_(float("nan"))
        get(name).fn(x, out=y)
        torch.cuda.synchronize()
        assert not torch.isnan(y[:-1]).any(), f"{name}: output rows left unwritten"
        _check(name, x, y, rows)


def test_past_2_31_elements(spec: KernelSpec, big_memory: None) -> None:
    """Any kernel under test (registered or --kernel) on fp16 (2^21 + 2, 1024): 2^31 + 2048
    elements; the rows on both sides of the 2^31-element boundary and the last one against the
    oracle (the zoo's int32_offsets is caught here)."""
    m, n = (1 << 21) + 2, 1024
    if not spec.supports(torch.float16, n):
        pytest.skip(f"{spec.name} does not take fp16 rows of {n}")
    if not within_declared_numel(spec, {"x": torch.empty(m, n, device="meta")}):
        pytest.skip(f"{spec.name} declares {declared_as(spec, 'max_numel')}: not {m * n} elements")
    x = torch.randn(m, n, device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(5)) * 5
    with diagnosed(spec, {"x": x}):  # a launch limit is named with the declaration that skips it
        y = spec.fn(x)
    torch.cuda.synchronize()
    _check(spec, x, y, np.array([0, (1 << 21) - 1, 1 << 21, m - 1]))


def test_strides_past_2_31(spec: KernelSpec, big_memory: None) -> None:
    """Any kernel under test on a transposed fp16 view whose column stride times N passes 2^31
    elements (N = 2^16, or the kernel's max_n): column offsets computed in int32 overflow."""
    n = min(1 << 16, spec.max_n or 1 << 16)
    m = (2**31 // (n - 1) + 16) // 8 * 8  # (n - 1) * m > 2^31: the last column starts past it
    if not spec.supports(torch.float16, n) or spec.contiguous_only:
        pytest.skip(f"{spec.name} does not take strided fp16 rows of {n}")
    torch.manual_seed(4)
    base = torch.randn(n, m, device="cuda", dtype=torch.float16)
    x = base.t()  # (m, n), strides (1, m)
    assert (n - 1) * x.stride(1) > 2**31
    if not within_declared_numel(spec, {"x": x}):
        pytest.skip(f"{spec.name} declares {declared_as(spec, 'max_numel')}: not {m * n} elements")
    with diagnosed(spec, {"x": x}):
        y = spec.fn(x)
    torch.cuda.synchronize()
    _check(spec, x, y, np.array([0, m // 2, m - 1]))


def _config_cases() -> list[tuple[str, torch.dtype, tuple[int, int]]]:
    cases = []
    for spec in registered("softmax"):
        shapes = [(37, 1000), (4, 4097), (3, 30000)]
        if spec.max_n is None:
            shapes += [(2, 300000)]
        for dtype in DTYPES:
            for shape in shapes:
                if spec.supports(dtype, shape[1]):
                    cases.append((spec.name, dtype, shape))
    return cases


@pytest.mark.parametrize("name,dtype,shape", _config_cases(), ids=str)
def test_configs_identical_bits_on_gpu(name: str, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """Every configuration a spec lists gives the same bits as the default, and reruns agree."""
    spec = get(name)
    x = (torch.randn(shape, device="cuda") * 8).to(dtype)
    x[0, : shape[1] // 2] = float("-inf")
    ref = spec.fn(x)
    assert torch.equal(spec.fn(x).view(torch.uint8), ref.view(torch.uint8)), "not deterministic"
    differ = []
    for cfg in spec.configs:
        y = spec.fn(x, **cfg)
        same = (y.view(torch.uint8) == ref.view(torch.uint8)) | (torch.isnan(y) & torch.isnan(ref)).repeat_interleave(
            y.element_size(), dim=1)
        if not bool(same.all()):
            differ.append(cfg)
    assert not differ, f"{name} configs {differ} change the bits ({dtype}, {shape})"
