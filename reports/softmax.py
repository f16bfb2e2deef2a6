"""Stability measurements of softmax-family kernels: error against the oracle per class."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.compare import compare_softmax
from flashcheck.oracles.formats import format_of, to_float64
from flashcheck.strategies.sample import draw_examples
from flashcheck.strategies.softmax import CLASSES

from ._stats import Accumulator


def max_n_for(spec: KernelSpec) -> int:
    cap = 2048 if INTERPRET else 1 << 16
    return min(cap, spec.max_n or cap)


def stability_rows(spec: KernelSpec, dtype: torch.dtype, *, examples: int) -> list[dict[str, Any]]:
    fmt = format_of(dtype)
    rows = []
    for cls, strategy in CLASSES.items():
        s = strategy(fmt=fmt) if cls == "elementwise" else strategy(fmt=fmt, max_n=max_n_for(spec))
        acc = Accumulator()
        for case in draw_examples(s, examples):
            x = case.tensors["x"]
            y = spec.fn(x)
            x64 = to_float64(x)
            c = compare_softmax(x64, to_float64(y), fmt, depth=spec.summation_depth(x.shape[1]))
            acc.add(c, scatter_x=np.abs(x64 - np.nanmax(np.where(np.isnan(x64), -np.inf, x64), axis=1,
                                                         keepdims=True)))
        rows.append({"kernel": spec.name, "family": spec.family, "dtype": fmt.name, "strategy": cls,
                     "examples": examples, **acc.summary()})
    return rows
