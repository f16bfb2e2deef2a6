"""Stability measurements of softmax-family kernels: one case's oracle, any kernel's output
against it, and the torch.softmax baseline on the same inputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import Format, to_float64
from flashcheck.oracles.softmax import softmax_oracle
from flashcheck.strategies.case import Case
from flashcheck.strategies.softmax import CLASSES

from ._stats import Measurement

FAMILY = "softmax"
#: What the profile features mean, for the plots' axes.
FEATURES = {"n": "row length N", "cond": "|x_i - max|  (condition of exp)"}
UNITS = "ULP"  # the unit of Measurement.y


def max_n_for(spec: KernelSpec) -> int:
    cap = 2048 if INTERPRET else 1 << 16
    return min(cap, spec.max_n or cap)


def strategies(specs: list[KernelSpec], fmt: Format) -> dict[str, Any]:
    """One strategy per class, shared by every kernel of the run (so all see the same inputs):
    rows as long as the longest any of them takes; a kernel skips the rows it does not."""
    max_n = max(max_n_for(s) for s in specs)
    return {cls: (st(dtype=fmt) if cls == "elementwise" else st(dtype=fmt, max_n=max_n)) for cls, st in CLASSES.items()}


def class_names() -> list[str]:
    return list(CLASSES)


@dataclass
class Prepared:
    x: torch.Tensor
    x64: np.ndarray
    fmt: Format
    oracle: np.ndarray  # correctly rounded
    exact: np.ndarray  # float64 approximation of the exact softmax (~1e-15 relative)
    cond: np.ndarray  # |x_i - max|


def prepare(case: Case, fmt: Format) -> Prepared:
    x = case.tensors["x"]
    x64 = to_float64(x)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.nanmax(np.where(np.isnan(x64), -np.inf, x64), axis=1, keepdims=True) if x64.size else x64
        e = np.exp(x64 - m)
        exact = e / e.sum(axis=1, keepdims=True)
        cond = np.abs(x64 - m)
    return Prepared(x, x64, fmt, softmax_oracle(x64, fmt), exact, np.where(np.isfinite(cond), cond, np.nan))


def supports(spec: KernelSpec, p: Prepared) -> bool:
    return spec.supports(p.x.dtype, p.x.shape[1])


def call(spec: KernelSpec, p: Prepared) -> torch.Tensor:
    x = p.x.contiguous() if spec.contiguous_only else p.x
    return returned(spec.fn(x), p.x.shape, p.x.dtype)


def returned(y: Any, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """`y` when it is a tensor of `shape` and `dtype`, else the kernel's error in one line."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"returned a {type(y).__name__}, not a tensor (expected {dtype} {tuple(shape)})")
    if y.shape != shape or y.dtype != dtype:
        raise TypeError(f"returned {y.dtype} {tuple(y.shape)}, expected {dtype} {tuple(shape)}")
    return y


def mismatch_of(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """NaN or infinity on one side only, or infinities that differ."""
    ny, nr = np.isnan(y), np.isnan(r)
    return (ny != nr) | ((np.isinf(y) | np.isinf(r)) & ~ny & ~nr & (y != r))


def measure(spec: KernelSpec, p: Prepared, out: torch.Tensor) -> Measurement:
    y = to_float64(out)
    r = p.oracle
    c = compare_softmax(p.x64, y, p.fmt, depth=spec.summation_depth(p.x.shape[1]), oracle=r)
    mism = mismatch_of(y, r)
    ratio = np.where(mism, np.inf, c.bound_ratio())
    plain = ~mism & ~c.ftz & np.isfinite(y) & np.isfinite(r) & ~((r == 0) & (p.exact == 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        signed_ulp = np.where(plain, np.sign(y - r) * c.dist, np.nan)
        # relative error only where the output is a normal number (below, rounding is absolute)
        signed_rel = np.where(plain & (p.exact >= p.fmt.min_normal), (y - p.exact) / p.exact, np.nan)
    return Measurement(dist=c.dist, ratio=ratio, violation=c.violations | mism, mismatch=mism, ftz=c.ftz,
                       wide=c.bound > 1, signed_ulp=signed_ulp, signed_rel=signed_rel, y=c.dist, ybound=c.bound,
                       # outputs that underflow, and NaN rows, say nothing about |x_i - max|
                       features={"n": np.full(y.shape, float(y.shape[1])),
                                 "cond": np.where(((r == 0) & (p.exact < p.fmt.min_subnormal)) | np.isnan(r),
                                                  np.nan, p.cond)})


def _torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)  # in the input dtype, as torch computes it on this device


def baselines() -> list[KernelSpec]:
    """torch.softmax on the same inputs; its bound assumes recursive summation (the worst case)."""
    return [KernelSpec(name="torch.softmax", family=FAMILY, fn=_torch_softmax, external=True,
                       description="torch.softmax(x, dim=-1) in the input dtype (baseline, not judged)",
                       extra={"baseline": True})]


__all__ = ["FAMILY", "FEATURES", "UNITS", "class_names", "strategies", "prepare", "supports", "call", "measure", "baselines",
           "max_n_for", "mismatch_of", "returned"]
