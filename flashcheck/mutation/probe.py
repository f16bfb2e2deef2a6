"""Inside the mutant's subprocess: the pytest plugin (`-p flashcheck.mutation.probe`) that serves the
mutated kernel module, and the equivalence probe run once the suite has passed (is the mutant
observably different at all?)."""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from flashcheck.mutation.generate import module_file

MUTANT_ENV = "FLASHCHECK_MUTANT"
NO_PROBE_ENV = "FLASHCHECK_MUTANT_NO_PROBE"  # install the mutant, skip the probe (it ran with the suite)


# ---- the pytest plugin (inside the subprocess) ----------------------------------------------------------

class _MutantFinder(importlib.abc.MetaPathFinder):
    """Serves `flashcheck.kernels.<module>` from the mutated file."""

    def __init__(self, fullname: str, path: str) -> None:
        self.fullname, self.path = fullname, path

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001
        if fullname == self.fullname:
            return importlib.util.spec_from_file_location(fullname, self.path)
        return None


def _install_from_env() -> dict[str, Any] | None:
    raw = os.environ.get(MUTANT_ENV)
    if not raw:
        return None
    spec = json.loads(Path(raw).read_text())
    fullname = f"flashcheck.kernels.{spec['module']}"
    if fullname in sys.modules:
        raise RuntimeError(f"{fullname} was imported before the mutant could be installed")
    sys.meta_path.insert(0, _MutantFinder(fullname, spec["path"]))
    return spec


# Loaded with `-p flashcheck.mutation.probe`: pytest imports plugins before any conftest, so the hook is in
# place before the suite's conftest imports the kernels.
_ACTIVE = _install_from_env()


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001
    """The suite passed: is the mutant observably different at all? Run the probe set."""
    if _ACTIVE is None or int(exitstatus) != 0 or os.environ.get(NO_PROBE_ENV):
        return
    try:
        result = probe(_ACTIVE)
    except Exception as exc:  # noqa: BLE001  (the probe must not turn a survivor into a crash)
        result = {"identical": None, "error": f"{type(exc).__name__}: {exc}"}
    Path(_ACTIVE["probe_out"]).write_text(json.dumps(result))


# ---- the equivalence probe -------------------------------------------------------------------------------

def _load_original(module: str):  # noqa: ANN202
    name = f"flashcheck.kernels._original_{module}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, module_file(module))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _softmax_probe_inputs() -> Iterator[tuple[str, Any]]:
    import numpy as np
    import torch

    from flashcheck.kernels import DEVICE
    from flashcheck.oracles.formats import FLOAT_DTYPES

    rng = np.random.default_rng(12)
    for dtype in FLOAT_DTYPES:
        for n in (1, 7, 64, 65, 129, 300, 1025, 2500):
            rows = [rng.standard_normal(n) * 3, rng.standard_normal(n) * 0.01 + np.eye(1, n, n // 2)[0] * 20,
                    np.full(n, -np.inf), rng.standard_normal(n) - 1e4 * (dtype != torch.float16),
                    -np.arange(n, dtype=float)[::-1] * 0.3, np.full(n, 3.0),
                    rng.standard_normal(n) * 5 - 100]
            r = rng.standard_normal(n)
            r[: max(1, n // 3)] = -np.inf
            rows.append(r)
            # every value far below -1e4 (fp16: -inf): a running max started at a finite
            # stand-in for -inf (-1e4) underflows each exp and empties the row
            rows.append(rng.standard_normal(n) - 1e9)
            r = rng.standard_normal(n)
            r[n // 2] = np.nan
            rows.append(r)
            r = rng.standard_normal(n)
            r[-1] = np.inf
            rows.append(r)
            x = torch.from_numpy(np.array(rows)).to(dtype).to(DEVICE)
            yield f"{dtype} {tuple(x.shape)}", x
            yield f"{dtype} {tuple(x.shape)} transposed", x.t().contiguous().t()


def _attention_probe_inputs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Plain, causal, kv_lens and large inputs on three shapes, then every feature the kernel has
    (softcap on both tanh branches, windows, GQA, masks, lse, split-KV, bottom-right alignment,
    a v head dim of its own, varlen) on one: a probe that never reaches a feature calls its mutants
    bit-identical and skips their suite, so they would look equivalent without being so."""
    import torch

    from flashcheck.kernels import DEVICE
    from flashcheck.oracles.formats import FLOAT_DTYPES

    g = torch.Generator().manual_seed(12)

    def rnd(*shape: int, dtype: torch.dtype, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * s).to(dtype).to(DEVICE)

    for dtype in FLOAT_DTYPES:
        for (b, h, m, n, d) in ((1, 2, 5, 7, 16), (2, 1, 40, 70, 64), (1, 1, 33, 100, 24)):
            q, k, v = (rnd(b, h, s, d, dtype=dtype) for s in (m, n, n))
            yield f"{dtype} {(b, h, m, n, d)}", dict(q=q, k=k, v=v)
            yield f"{dtype} {(b, h, m, n, d)} causal", dict(q=q, k=k, v=v, causal=True)
            kv = torch.tensor([n // 2, 0][:b] if b > 1 else [n // 3], dtype=torch.int32, device=DEVICE)
            yield f"{dtype} {(b, h, m, n, d)} kv_lens", dict(q=q, k=k, v=v, kv_lens=kv)
            yield f"{dtype} {(b, h, m, n, d)} big", dict(q=q * 8, k=k * 8, v=v * 1000)
        b, h, m, n, d = 2, 2, 37, 75, 32
        q, k, v = (rnd(b, h, s, d, dtype=dtype) for s in (m, n, n))
        tag = f"{dtype} {(b, h, m, n, d)}"
        yield f"{tag} softcap 2 (large scores)", dict(q=q * 4, k=k * 4, v=v, softcap=2.0)
        yield f"{tag} softcap 30", dict(q=q, k=k, v=v, softcap=30.0)
        yield f"{tag} window (3, 2)", dict(q=q, k=k, v=v, window=(3, 2))
        yield f"{tag} window (0, -1) causal bottom_right", dict(q=q, k=k, v=v, window=(0, -1), causal=True,
                                                                 causal_align="bottom_right")
        yield f"{tag} causal bottom_right kv_lens", dict(q=q, k=k, v=v, causal=True, causal_align="bottom_right",
                                                         kv_lens=torch.tensor([n, n // 3], dtype=torch.int32,
                                                                              device=DEVICE))
        yield f"{tag} gqa 4/2", dict(q=rnd(b, 4, m, d, dtype=dtype), k=k, v=v)
        yield f"{tag} dv 24", dict(q=q, k=k, v=rnd(b, h, n, 24, dtype=dtype))
        keep = torch.rand(b, 1, m, n, generator=g).to(DEVICE) < 0.6
        keep[:, :, 0, :] = False  # a row that sees nothing
        yield f"{tag} bool mask", dict(q=q, k=k, v=v, attn_mask=keep)
        # with the kernel's own visibility too: a mask that replaced it rather than adding to it
        yield f"{tag} bool mask causal", dict(q=q, k=k, v=v, attn_mask=keep, causal=True)
        yield f"{tag} float mask", dict(q=q, k=k, v=v, attn_mask=rnd(1, h, m, n, dtype=dtype, s=3.0))
        yield f"{tag} lse", dict(q=q, k=k, v=v, return_lse=True)
        for splits in (2, 3):
            yield f"{tag} {splits} splits", dict(q=q, k=k, v=v, num_splits=splits, return_lse=True)
        # causal: the first row sees one key, so its sum is exactly 1 (an lse guard against 0 that
        # tests 1 instead shows only there)
        yield f"{tag} 3 splits causal", dict(q=q, k=k, v=v, num_splits=3, return_lse=True, causal=True)
        # a batch with no key at all and one whose later splits are empty: every split of a row
        # -inf, the state the merge must keep finite (no -inf - -inf)
        kv = torch.tensor([0, n // 3], dtype=torch.int32, device=DEVICE)
        yield f"{tag} 3 splits kv_lens {kv.tolist()}", dict(q=q, k=k, v=v, num_splits=3, return_lse=True, kv_lens=kv)
        floor = torch.zeros(m, n, dtype=dtype, device=DEVICE)
        floor[1] = -3.0e4  # every split of row 1 has its max near -3e4
        yield f"{tag} 3 splits finite-min row", dict(q=q, k=k, v=v, num_splits=3, return_lse=True, attn_mask=floor)
        lens_q, lens_k = [0, 5, 17, 1], [3, 0, 40, 9]
        cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        yield f"{dtype} varlen", dict(_fn="attention_varlen", q=rnd(sum(lens_q), 4, d, dtype=dtype),
                                      k=rnd(sum(lens_k), 2, d, dtype=dtype), v=rnd(sum(lens_k), 2, d, dtype=dtype),
                                      cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens_q),
                                      max_seqlen_k=max(lens_k), causal=True, causal_align="bottom_right")


_PROBE_INPUTS = {"softmax": _softmax_probe_inputs, "attention": _attention_probe_inputs}
_PUBLIC = {"softmax": ("softmax_row", "softmax_online", "softmax_split"), "attention": ("attention",)}
# Each function with its defaults and, on a GPU, with the small chunks the suite also tunes it to
# (kernels/specs.py SMALL_CHUNKS): a GPU's defaults (4096 lanes, 32768-column spans merged 1024 at a
# time) take the probes' rows of at most 2500 columns in one chunk, so the loops over chunks, spans
# and merge steps ran nowhere, and a GPU run called every mutant of them bit-identical without
# running its suite.


def same_output(a: Any, b: Any) -> bool:
    """Same shape, dtype and bits (`oracles.formats.same_bits`: any NaN equals any NaN), where the
    outputs lie; tuples (out, lse) element by element."""
    from flashcheck.oracles.formats import same_bits

    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(same_output, a, b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(same_bits(a, b).all())


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the mutated and the original public functions on fixed inputs and compare bits."""
    import importlib

    from flashcheck.isolation import hooks as kernel_hooks

    mutated = importlib.import_module(f"flashcheck.kernels.{spec['module']}")
    from flashcheck.kernels.specs import SMALL_CHUNKS  # after the mutant: it imports the family modules

    kernel_hooks.attach()  # after the mutant's import: the kernels' first import stays the mutant's
    original = _load_original(spec["module"])
    family = spec["family"]
    fns = [f for f in _PUBLIC[family] if f in spec["specs"]] or list(_PUBLIC[family])
    if spec["module"] != family:  # a helper module (_common, the merge) is reached through the family's module
        mutated = importlib.import_module(f"flashcheck.kernels.{family}")
        original = _load_original_with(spec["module"], family, Path(spec["path"]).parent)
    count = 0
    if family not in _PROBE_INPUTS:
        raise SystemExit(f"flashcheck mutation probe: no probe inputs for family {family!r}: add its own to "
                         "_PROBE_INPUTS (the inputs its kernels' public functions take)")
    inputs = _PROBE_INPUTS[family]()
    for label, inp in inputs:
        kwargs = dict(inp) if isinstance(inp, dict) else {"x": inp}
        only = kwargs.pop("_fn", None)  # a probe for one public function (varlen)
        for f in ([only] if only else fns):
            for knobs in ({}, *SMALL_CHUNKS.get(f, ())):  # (none in the interpreter: its defaults)
                at = f"{f}({', '.join(f'{k}={v}' for k, v in knobs.items())}) on {label}"
                try:
                    got = getattr(mutated, f)(**kwargs, **knobs)
                except Exception as exc:  # noqa: BLE001
                    return {"identical": False, "probes": count, "witness": f"{at}: raised {type(exc).__name__}: {exc}"}
                want = getattr(original, f)(**kwargs, **knobs)
                count += 1
                if not same_output(got, want):
                    return {"identical": False, "probes": count, "witness": f"{at}: different bits"}
    return {"identical": True, "probes": count}


def _load_original_with(helper: str, family: str, where: Path):  # noqa: ANN202
    """The family module bound to an unmutated copy of `helper`: loaded by file, the family's
    relative import of the helper would otherwise resolve to the mutant itself, and the probe
    would compare the mutant with itself. The copy goes in `where`, the mutant's own folder,
    which the runner removes with it."""
    src = module_file(family).read_text()
    stmt = f"from .{helper} import"
    if stmt not in src:
        raise RuntimeError(f"kernels/{family}.py has no `{stmt}`: cannot bind it to the original {helper}")
    src = src.replace(stmt, f"from ._original_{helper} import")
    _load_original(helper)
    name = f"flashcheck.kernels._original_{family}_{helper}"
    copy = where / f"_original_{family}.py"
    copy.write_text(src)
    spec = importlib.util.spec_from_file_location(name, copy)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def probe_main() -> None:
    """`python -c "import flashcheck.mutation.probe as P; P.probe_main()"` with FLASHCHECK_MUTANT set: the
    probe alone (the import installed the mutant)."""
    if _ACTIVE is None:
        raise SystemExit(f"{MUTANT_ENV} is not set")
    Path(_ACTIVE["probe_out"]).write_text(json.dumps(probe(_ACTIVE)))
