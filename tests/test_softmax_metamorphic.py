"""Metamorphic and memory properties of every registered softmax kernel (NUMERICS.md section 4).

They need no oracle for their verdict (the permutation test uses the derived bound as its
tolerance), and each is registered with `@prop` and run through `harness.check`, so a shrunk
failure is saved as an exact-bit fixture like any other:

* shift_invariant: softmax(x + c) has the same bits as softmax(x) when every x_i + c is exact.
  The strategy draws multiples of a quantum q with |x_i| + |c| small enough that x_i + c and
  x_i - max are exact in the input format and in fp32; a kernel that subtracts the max before
  any other rounding then computes bit-identical values ((x_i + c) - (m + c) = x_i - m). A kernel
  that rounds before subtracting (e.g. x * log2(e) - m * log2(e)) is still right but not
  shift-exact: it declares `shift_exact=False` (a `flashcheck` dict key for external
  kernels) and is then held to the derived bound instead.
* permutation_equivariant: softmax(x P) = softmax(x) P within the derived bound, not bitwise:
  permuting the columns reorders the fp32 sum (and moves values between chunks), so its last bits
  may change. Each output is within its bound b of the same correctly rounded value, so the two
  outputs are within 2b ULPs of each other (the ULP distance is a metric); exact specials (NaN,
  the zeros of -inf entries, bound 0) must match exactly.
* configs_identical: every launch configuration of `spec.configs` gives the default's bits.
* tunings_within_bound: every configuration of `spec.tunings` (knobs that may reassociate the
  sum) meets the oracle bound, as the default must.
* deterministic: two runs give the same bits.
* guard_bands: with `out=` a strided view inside a buffer of sentinel bits, the view holds the
  default output's bits and no other byte of the buffer (or of the input) changes. Only kernels
  whose signature takes `out` (the production kernels do); others are skipped with the reason.
* nan_guard_invisible: the output on a view inside NaN guard data equals the output on the same
  view inside zero guard data (a kernel that reads outside its view, or multiplies a masked
  load by 0 instead of selecting, sees the difference).
* input untouched is the core property `input_untouched` (tests/test_softmax.py), checked on
  every case of every class there; guard_bands also checks the input when `out=` is given.

"Same bits" counts any NaN as equal to any NaN (payloads are not part of the contract).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.bounds import ftz_allowed, softmax_ulp_bound
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import BF16, FP16, Format, format_of, to_float64, ulp_distance
from flashcheck.oracles.softmax import softmax_oracle
from flashcheck.strategies.case import Case
from flashcheck.strategies.floats import Layout, layouts, materialize
from flashcheck.strategies.softmax import row_lengths, softmax_cases
from flashcheck.harness import check, prop, storage_of
from .test_softmax import max_n_for

FAMILY = "softmax"
# Each example calls the kernel several times: rows up to 640 on the CPU (past the dispatcher's
# row-kernel limit and past two 256-wide chunks), the core suite's lengths on a GPU.
META_MAX_N = 640 if INTERPRET else None


def meta_max_n(spec: KernelSpec) -> int:
    return min(max_n_for(spec), META_MAX_N or max_n_for(spec))


META_PROPERTIES = ("shift_invariant", "permutation_equivariant", "configs_identical", "tunings_within_bound",
                   "deterministic",
                   "guard_bands", "nan_guard_invisible")


# ---- helpers ---------------------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: identical bit patterns, or both NaN."""
    a, b = a.detach().cpu(), b.detach().cpu()
    return (_bits(a) == _bits(b)) | (torch.isnan(a) & torch.isnan(b))


def _first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    eq = same_bits(a, b)
    if eq.all():
        return ""
    idx = tuple(int(i) for i in torch.nonzero(~eq)[0])
    return (f"{int((~eq).sum())} of {eq.numel()} elements differ; first at {list(idx)}: "
            f"{float(a[idx])!r} vs {float(b[idx])!r}")


def same_layout(x: torch.Tensor, values: torch.Tensor, *, guard: float | None = None) -> torch.Tensor:
    """A fresh storage shaped like x's (same size, strides, offset) holding `values` in the view;
    the rest copies x's storage, or holds `guard`."""
    base = storage_of(x).clone()
    if guard is not None:
        base.fill_(guard)
    view = base.as_strided(x.shape, x.stride(), x.storage_offset())
    view.copy_(values.to(x.dtype))
    return view


def accepts_out(spec: KernelSpec) -> bool:
    if spec.takes_out is not None:
        return spec.takes_out
    try:
        params = inspect.signature(spec.fn).parameters
    except (TypeError, ValueError):
        return False
    return "out" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _run(spec: KernelSpec, x: torch.Tensor, **kw) -> torch.Tensor:
    y = spec.fn(x, **kw)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        raise AssertionError(f"{spec.name} returned {type(y).__name__} "
                             f"{tuple(getattr(y, 'shape', ()))}, expected {tuple(x.shape)}")
    return y


def _where(case: Case) -> str:
    x = case.tensors["x"]
    return (f"x {tuple(x.shape)} {x.dtype} stride={x.stride()} offset={x.storage_offset()} "
            f"({case.label})")


# ---- properties ------------------------------------------------------------------------------

@prop(FAMILY, "shift_invariant")
def shift_invariant(spec: KernelSpec, case: Case) -> None:
    x, c = case.tensors["x"], float(case.tensors["shift"])
    x64 = to_float64(x)
    shifted = x64 + c
    xs_t = torch.from_numpy(shifted).to(x.dtype)
    if not np.array_equal(to_float64(xs_t), shifted, equal_nan=True):
        raise ValueError(f"case bug: x + {c} is not exact in {x.dtype} ({case.label})")
    xs = same_layout(x, xs_t.to(x.device))
    y, ys = _run(spec, x), _run(spec, xs)
    if spec.shift_exact:
        diff = _first_diff(y, ys)
        if diff:
            raise AssertionError(f"{spec.name}: softmax(x + {c!r}) != softmax(x) bit for bit: {diff}\n"
                                 f"  {_where(case)}")
    else:
        fmt = format_of(y.dtype)
        r = softmax_oracle(x64, fmt)
        bound = softmax_ulp_bound(x64, r, fmt, depth=spec.summation_depth(x.shape[1]))
        dist = ulp_distance(to_float64(ys), to_float64(y), fmt)
        bad = (dist > 2 * bound) & ~ftz_allowed(to_float64(y), r) & ~ftz_allowed(to_float64(ys), r)
        if bad.any():
            raise AssertionError(f"{spec.name}: softmax(x + {c!r}) differs from softmax(x) by "
                                 f"{dist[bad].max():g} ULPs (2 x bound {2 * bound[bad].min():g})\n  {_where(case)}")


@prop(FAMILY, "permutation_equivariant")
def permutation_equivariant(spec: KernelSpec, case: Case) -> None:
    x, perm = case.tensors["x"], case.tensors["perm"].cpu().long()
    xp = same_layout(x, x[:, perm.to(x.device)])
    y, yp = _run(spec, x), _run(spec, xp)
    fmt = format_of(y.dtype)
    x64p = to_float64(x)[:, perm.numpy()]
    want = to_float64(y)[:, perm.numpy()]
    got = to_float64(yp)
    r = softmax_oracle(x64p, fmt)
    bound = softmax_ulp_bound(x64p, r, fmt, depth=spec.summation_depth(x.shape[1]))
    dist = ulp_distance(got, want, fmt)
    flushed = ftz_allowed(got, r) | ftz_allowed(want, r)
    bad = (dist > 2 * bound) & ~flushed
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{spec.name}: softmax(x P) != softmax(x) P: {int(bad.sum())} elements differ by more than twice "
            f"the bound; at [{i}, {j}] (permuted) x={x64p[i, j]!r}: {got[i, j]!r} vs {want[i, j]!r}, "
            f"{dist[i, j]:g} ULPs > 2 x {bound[i, j]:g}\n  {_where(case)}")


_DEFAULT: dict[str, tuple[KernelSpec, torch.Tensor, torch.Tensor]] = {}


def _default_output(spec: KernelSpec, x: torch.Tensor) -> torch.Tensor:
    """The default launch's output, shared by the properties checked on the same case."""
    hit = _DEFAULT.get("last")
    if hit is not None and hit[0] is spec and hit[1] is x:
        return hit[2]
    y = _run(spec, x)
    _DEFAULT["last"] = (spec, x, y)
    return y


@prop(FAMILY, "configs_identical")
def configs_identical(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    if not spec.configs:
        return
    y = _default_output(spec, x)
    for cfg in spec.configs:
        diff = _first_diff(y, _run(spec, x, **cfg))
        if diff:
            raise AssertionError(f"{spec.name}: launch configuration {cfg} changes the bits: {diff}\n  {_where(case)}")


@prop(FAMILY, "tunings_within_bound")
def tunings_within_bound(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    x64 = to_float64(x)
    for cfg in spec.tunings:
        y = _run(spec, x, **cfg)
        c = compare_softmax(x64, to_float64(y), format_of(y.dtype), depth=spec.summation_depth(x.shape[1]))
        if c.violations.any():
            r, k = np.unravel_index(int(np.argmax(np.where(c.violations, c.dist, -1))), c.dist.shape)
            raise AssertionError(f"{spec.name}: launch configuration {cfg} exceeds the bound at [{r}, {k}]: "
                                 f"kernel {float(to_float64(y)[r, k])!r}, oracle {float(c.oracle[r, k])!r}, "
                                 f"{c.dist[r, k]:g} ULPs > {c.bound[r, k]:g}\n  {_where(case)}")


@prop(FAMILY, "deterministic")
def deterministic(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    diff = _first_diff(_default_output(spec, x), _run(spec, x))
    if diff:
        raise AssertionError(f"{spec.name}: two runs on the same input differ: {diff}\n  {_where(case)}")


SENTINEL_BITS = {torch.float16: 0x7E55, torch.bfloat16: 0x7FD5, torch.float32: 0x7FD55555}  # NaN payloads


@prop(FAMILY, "guard_bands")
def guard_bands(spec: KernelSpec, case: Case) -> None:
    """`out=` a strided view inside sentinel bits: same bits as the default, guard bytes intact."""
    if not accepts_out(spec):
        raise AssertionError(f"{spec.name} takes no out= argument")
    x = case.tensors["x"]
    out0 = case.tensors["out"]
    # work on a copy: the case (a fixture if this fails) keeps the pristine buffer
    out = storage_of(out0).clone().as_strided(out0.shape, out0.stride(), out0.storage_offset())
    before = _bits(storage_of(out)).clone()
    x_before = _bits(storage_of(x)).clone()
    want = _run(spec, x)
    got = spec.fn(x, out=out)
    after = _bits(storage_of(out))
    inside = torch.zeros(after.numel(), dtype=torch.bool)
    idx = torch.arange(after.numel()).as_strided(out.shape, out.stride(), out.storage_offset())
    inside[idx.reshape(-1)] = True
    clobbered = (after != before) & ~inside
    if clobbered.any():
        k = int(torch.nonzero(clobbered)[0])
        raise AssertionError(f"{spec.name} wrote {int(clobbered.sum())} guard elements outside the out= view "
                             f"(first at storage index {k}; view stride={out.stride()} "
                             f"offset={out.storage_offset()} of {after.numel()})\n  {_where(case)}")
    if isinstance(got, torch.Tensor) and got.data_ptr() != out.data_ptr():
        raise AssertionError(f"{spec.name}(x, out=view) returned a tensor that is not the view\n  {_where(case)}")
    diff = _first_diff(want, out)
    if diff:
        raise AssertionError(f"{spec.name}: output written into a strided out= view differs from the default "
                             f"output: {diff}\n  {_where(case)}; out stride={out.stride()}")
    if not torch.equal(x_before, _bits(storage_of(x))):
        raise AssertionError(f"{spec.name} modified its input storage when given out=\n  {_where(case)}")


@prop(FAMILY, "nan_guard_invisible")
def nan_guard_invisible(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    zero_guarded = same_layout(x, x, guard=0.0)
    diff = _first_diff(_run(spec, x), _run(spec, zero_guarded))
    if diff:
        raise AssertionError(f"{spec.name}: the NaN guard data around the view changes the output "
                             f"(vs the same view in zero guard data): {diff}\n  {_where(case)}")


# ---- strategies ------------------------------------------------------------------------------

def shift_limits(fmt: Format) -> tuple[float, int, int]:
    """(quantum q, max |k_x|, max |k_c|): x = k_x q and c = k_c q with |k_x| + |k_c| < 2^p (p the
    format's precision), so x + c is exact in the format; x - max is exact in fp32 (2 k_x < 2^24)."""
    if fmt == FP16:
        return 1.0, 1024, 1023  # fp16 integers are exact up to 2048
    if fmt == BF16:
        return 1.0, 128, 127  # bf16 integers up to 256
    return 2.0**-6, 1 << 22, (1 << 22) - 1


@composite
def shift_cases(draw, *, fmt: Format, max_n: int) -> Case:
    """Rows of multiples of q (some -inf, a NaN or +inf now and then), a shift c that keeps every
    x_i + c exact; shifts past 88 make a kernel without max subtraction overflow."""
    q, kx, kc = shift_limits(fmt)
    m = draw(st.integers(1, 4))
    n = draw(row_lengths(max_n=max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    span = draw(st.sampled_from([8, 64, kx]))
    v = rng.integers(-span, span + 1, (m, n)).astype(np.float64) * q
    if draw(st.booleans()):
        v[rng.random((m, n)) < draw(st.sampled_from([0.1, 0.5, 0.99]))] = -np.inf
    special = draw(st.sampled_from([None, None, None, np.nan, np.inf]))
    if special is not None:
        v[draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))] = special
    c = draw(st.one_of(st.integers(-kc, kc), st.sampled_from([kc, -kc, 1, -1]))) * q
    x = materialize(v, fmt, draw(layouts()), DEVICE)
    return Case(tensors={"x": x, "shift": torch.tensor(float(c), dtype=torch.float64)},
                label=f"shift/c={c:g}")


@composite
def permuted_cases(draw, *, fmt: Format, max_n: int) -> Case:
    case = draw(softmax_cases(fmt=fmt, max_n=max_n))
    n = case.tensors["x"].shape[1]
    kind = draw(st.sampled_from(["random", "reverse", "rotate"]))
    if kind == "random":
        perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    elif kind == "reverse":
        perm = np.arange(n)[::-1].copy()
    else:
        perm = np.roll(np.arange(n), draw(st.integers(0, max(0, n - 1))))
    case.tensors["perm"] = torch.from_numpy(perm.astype(np.int64))
    case.label += f"/perm-{kind}"
    return case


def out_layouts() -> st.SearchStrategy[Layout]:
    """Output views that are never the plain contiguous tensor: a guard on some side always."""
    return st.builds(Layout, transposed=st.booleans(), col_step=st.sampled_from([1, 2, 3]),
                     row_pad=st.sampled_from([0, 1, 7, 64]), offset=st.integers(1, 9), tail=st.integers(1, 8))


def _sentinel_view(shape: tuple[int, int], dtype: torch.dtype, layout: Layout) -> torch.Tensor:
    m, n = shape
    size = max(layout.storage_size(m, n), 1) if m and n else 1
    words = torch.full((size,), SENTINEL_BITS[dtype], dtype=torch.int32 if dtype == torch.float32 else torch.int16)
    buf = words.view(dtype).to(DEVICE)
    return buf.as_strided((m, n), layout.strides(m, n), layout.offset)


@composite
def out_view_cases(draw, *, fmt: Format, max_n: int) -> Case:
    case = draw(softmax_cases(fmt=fmt, max_n=max_n))
    x = case.tensors["x"]
    layout = draw(out_layouts())
    case.tensors["out"] = _sentinel_view(tuple(x.shape), x.dtype, layout)
    case.label += f"/out-{layout.name}"
    return case


# ---- tests -----------------------------------------------------------------------------------

@given(data=st.data())
def test_shift_invariance(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(shift_cases(fmt=format_of(dtype), max_n=meta_max_n(spec)), label="case")
    check(spec, "shift_invariant", case)


@given(data=st.data())
def test_permutation_equivariance(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(permuted_cases(fmt=format_of(dtype), max_n=meta_max_n(spec)), label="case")
    check(spec, "permutation_equivariant", case)


@given(data=st.data())
def test_configs_and_determinism(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(softmax_cases(fmt=format_of(dtype), max_n=meta_max_n(spec)), label="case")
    check(spec, "deterministic", case)
    check(spec, "configs_identical", case)
    check(spec, "tunings_within_bound", case)


@given(data=st.data())
def test_guard_bands(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    if not accepts_out(spec):
        pytest.skip(f"{spec.name} takes no out= argument (an external kernel declares it by accepting "
                    f"`out` or **kwargs), so there is no output view to guard")
    case = data.draw(out_view_cases(fmt=format_of(dtype), max_n=meta_max_n(spec)), label="case")
    check(spec, "guard_bands", case)


@given(data=st.data())
def test_nan_guard_invisible(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(softmax_cases(fmt=format_of(dtype), max_n=meta_max_n(spec)), label="case")
    check(spec, "nan_guard_invisible", case)
