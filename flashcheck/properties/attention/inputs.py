"""The attention family's input checks: bad input must be rejected (`rejects_bad_input`, with the
variants it tries), and `fit_to_declarations`, which fits a drawn or replayed case to what the
kernel declares or rejects it (a declared-unsupported call is never made).
"""
from __future__ import annotations

from typing import Any


import torch

from flashcheck.properties import refusals

from flashcheck.targets import signature
from flashcheck.families import prop
from flashcheck.strategies.case import Case
from flashcheck.properties.limits import within_declared_numel
from flashcheck.kernels.registry import KernelSpec
from flashcheck.strategies.attention import case_inputs, is_varlen
from flashcheck.properties.attention.outcome import FAMILY


# ---- bad input ---------------------------------------------------------------------------------

def bad_variants(spec: KernelSpec, case: Case) -> dict[str, tuple[type[Exception], tuple, dict]]:
    q, k, v, kw = case_inputs(case)
    B, H, M, D = q.shape
    N = k.shape[2]
    other = torch.float32 if q.dtype != torch.float32 else torch.float16
    lens = torch.full((B,), N, dtype=torch.int32, device=q.device)
    kw = {kk: vv for kk, vv in kw.items() if kk != "kv_lens"}
    out = {
        "q_rank_3": (ValueError, (q[0], k, v), kw),
        "k_rank_5": (ValueError, (q, k[None], v), kw),
        "mixed_dtypes": (TypeError, (q, k.to(other), v), kw),
        "int_dtype": (TypeError, (q.to(torch.int32), k.to(torch.int32), v.to(torch.int32)), kw),
        "float64": (TypeError, (q.double(), k.double(), v.double()), kw),
        "k_v_lengths_differ": (ValueError, (q, k, torch.cat([v, v], dim=2)), kw),
        "head_dims_differ": (ValueError, (q, torch.cat([k, k], dim=3), torch.cat([v, v], dim=3)), kw),
        "batch_differs": (ValueError, (q, torch.cat([k, k]), torch.cat([v, v])), kw),
        "head_dim_257": (ValueError, tuple(torch.zeros(1, 1, 2, 257, dtype=q.dtype, device=q.device)
                                           for _ in range(3)), {}),
        "wrong_device": (ValueError, (q.to("meta"), k.to("meta"), v.to("meta")), kw),
        "kv_lens_float": (TypeError, (q, k, v), {**kw, "kv_lens": lens.float()}),
        "kv_lens_shape": (ValueError, (q, k, v), {**kw, "kv_lens": torch.cat([lens, lens])}),
        "kv_lens_above_n": (ValueError, (q, k, v), {**kw, "kv_lens": lens + 1}),
        "kv_lens_negative": (ValueError, (q, k, v), {**kw, "kv_lens": lens * 0 - 1}),
        "kv_lens_list": (TypeError, (q, k, v), {**kw, "kv_lens": lens.tolist()}),
        "causal_not_bool": (TypeError, (q, k, v), {**kw, "causal": "yes"}),
    }
    if spec.has("gqa"):  # heads that do not divide
        out["heads_not_divisible"] = (ValueError, (torch.cat([q, q[:, :1]], dim=1), k, v), kw)
    if spec.has("window"):
        out["window_below_minus_1"] = (ValueError, (q, k, v), {**kw, "window": (-2, 0)})
        out["window_not_pair"] = (TypeError, (q, k, v), {**kw, "window": 3})
    if spec.has("softcap"):
        out["softcap_negative"] = (ValueError, (q, k, v), {**kw, "softcap": -1.0})
        out["softcap_nan"] = (ValueError, (q, k, v), {**kw, "softcap": float("nan")})
    if spec.has("attn_mask"):
        out["mask_not_broadcastable"] = (ValueError, (q, k, v), {**kw, "attn_mask": torch.ones(
            M + 1, N + 1, dtype=torch.bool, device=q.device)})
        out["mask_int"] = (TypeError, (q, k, v), {**kw, "attn_mask": torch.ones(M, N, dtype=torch.int32,
                                                                                 device=q.device)})
    if spec.has("splits"):
        out["num_splits_negative"] = (ValueError, (q, k, v), {**kw, "num_splits": -1})
    out["causal_align_unknown"] = (ValueError, (q, k, v), {**kw, "causal_align": "middle"})
    return out


def bad_varlen_variants(spec: KernelSpec, q, k, v, cu_q, cu_k, kw) -> dict[str, tuple[type[Exception], tuple, dict]]:
    tq, tk = q.shape[0], k.shape[0]
    bump = cu_k.clone()
    bump[1] = tk + 5
    dec = cu_q.clone()
    if len(dec) > 2:
        dec[1], dec[2] = dec[2] + 1, dec[1]
    return {
        "cu_seqlens_int64": (TypeError, (q, k, v, cu_q.long(), cu_k), kw),
        "cu_seqlens_not_monotone": (ValueError, (q, k, v, dec, cu_k), kw),
        "cu_seqlens_out_of_range": (ValueError, (q, k, v, cu_q, bump), kw),
        "cu_seqlens_lengths_differ": (ValueError, (q, k, v, cu_q, cu_k[:-1]), kw),
        "max_seqlen_too_small": (ValueError, (q, k, v, cu_q, cu_k), {**kw, "max_seqlen_q": 0}),
        "varlen_rank_4": (ValueError, (q[None], k, v, cu_q, cu_k), kw),
    }


def _expect_raises(spec_name: str, fn, variants, *, typed: bool = True) -> list[str]:
    """typed: the documented exception type (ours); else any exception counts as a rejection."""
    failures = []
    for name, (exc, args, kw) in variants.items():
        exc = exc if typed else Exception
        try:
            fn(*args, **kw)
        except exc:
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: raised {type(e).__name__}: {e} (expected {exc.__name__})")
            continue
        failures.append(f"{name}: no exception (expected {exc.__name__})")
    return failures


@prop(FAMILY, "rejects_bad_input")
def rejects_bad_input(spec: KernelSpec, case: Case) -> None:
    """Bad ranks, shapes, dtypes, devices, kv_lens and feature options raise TypeError/ValueError
    naming the problem; with varlen, bad cu_seqlens too."""
    typed = spec.validates_input == "typed"
    failures = _expect_raises(spec.name, spec.fn, bad_variants(spec, case), typed=typed)
    if spec.has("varlen"):
        q, k, v, _ = case_inputs(case)
        qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # batch 0 as 2 packed sequences
        tq, tk = qp.shape[0], kp.shape[0]
        cu_q = torch.tensor([0, tq // 2, tq], dtype=torch.int32, device=q.device)
        cu_k = torch.tensor([0, tk // 2, tk], dtype=torch.int32, device=q.device)
        kw = {"max_seqlen_q": tq, "max_seqlen_k": tk}
        failures += _expect_raises(spec.name, spec.varlen_fn, bad_varlen_variants(spec, qp, kp, vp, cu_q, cu_k, kw),
                                   typed=typed)
    if failures:
        raise AssertionError(f"{spec.name} does not reject bad input:\n  " + "\n  ".join(failures))


def _features_used(case: Case) -> set[str]:
    """The optional features a dense case asks for (a fixture may predate a declaration)."""
    q, k, v, kw = case_inputs(case)
    keyword = signature.KEYWORDS[FAMILY]
    used = {f for f in ("attn_mask", "window", "softcap", "splits")
            if not signature.asks_nothing(keyword[f], kw.get(keyword[f]))}
    return used | {f for f, on in (("gqa", q.shape[1] != k.shape[1]), ("dv", v.shape[-1] != q.shape[-1])) if on}


def refusable(case: Case) -> dict[str, str]:
    """The optional features a dense case uses, by the capability key that declares each, with what
    it was (a clean refusal of one the kernel left undeclared is a skip: flashcheck.properties.refusals)."""
    if is_varlen(case):
        return {}  # varlen is declared through varlen_fn: never assumed
    q, k, v, kw = case_inputs(case)
    m, n, d = q.shape[2], k.shape[2], q.shape[3]
    used = _features_used(case)
    out = {f: what for f, what in (
        ("gqa", f"grouped heads (Hq={q.shape[1]}, Hkv={k.shape[1]})"), ("dv", f"a v head dim of its own "
                                                                           f"(D={d}, Dv={v.shape[-1]})"),
        ("attn_mask", "an attn_mask"), ("window", f"window={kw.get('window')}"),
        ("softcap", f"softcap={kw.get('softcap')}"), ("splits", f"num_splits={kw.get('num_splits')}"),
    ) if f in used}
    for key, on, what in (("square_only", m != n, f"M != N (M={m}, N={n})"),
                          ("causal", bool(kw.get("causal")), "causal=True"),
                          ("kv_lens", "kv_lens" in case.tensors, "kv_lens"),
                          ("custom_scale", kw.get("scale") is not None, f"scale={kw.get('scale')}"),
                          ("head_dims", bool(d & (d - 1)) or d > 128, f"head dim {d}"),
                          ("max_n", n > refusals.LONG, f"{n} keys")):
        if on:
            out[key] = what
    return out


def fit_to_declarations(spec: KernelSpec, case: Case) -> Case | None:
    """The case as the kernel's declarations allow it, or None when it needs something the kernel
    does not declare (the caller rejects it: a declared-unsupported call is never made).

    contiguous_only gives contiguous copies of q, k, v (same values); every other declaration
    (key counts, head dims, M = N, causal, alignment, kv_lens, custom scale) rejects the case.
    """
    if is_varlen(case):
        return case  # varlen is its own feature, declared through varlen_fn
    q, k = case.tensors["q"], case.tensors["k"]
    m, n, d = q.shape[2], k.shape[2], q.shape[3]
    kw = case.kwargs
    causal = bool(kw.get("causal"))
    if not spec.supports(q.dtype, n) or not spec.supports_head_dim(d):
        return None
    if (spec.square_only and m != n) or (causal and not spec.causal):
        return None
    if (causal or kw.get("window") is not None) and kw.get("causal_align", "top_left") not in spec.causal_align:
        return None
    if ("kv_lens" in case.tensors and not spec.kv_lens) or (kw.get("scale") is not None and not spec.custom_scale):
        return None
    if any(not spec.has(f) for f in _features_used(case)) or not within_declared_numel(spec, case.tensors):
        return None
    if not spec.contiguous_only:
        return case
    tensors = {name: (t.contiguous() if name in ("q", "k", "v") else t) for name, t in case.tensors.items()}
    return Case(tensors=tensors, kwargs=dict(kw), label=case.label + "/contiguous")


# ---- what the engine asks a family (limits, declarations, the run's header) ----------------------

def limit_sizes(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Sizes a limit names besides the key count and element count: the head dim."""
    q = tensors.get("q")
    return {"d": int(q.shape[-1])} if isinstance(q, torch.Tensor) and q.dim() else {}


def resource_declaration(size: dict[str, int], resource: str, declare: Any) -> str | None:
    """Past shared memory or registers, the head dim is what a kernel declares away."""
    if not size.get("d"):
        return None
    return (f"{declare('max_head_dim', size['d'] - 1)}, or `head_dims=` the ones it takes; a tile "
            f"config with less {resource} (fewer stages, smaller blocks) lifts the limit")


def feature_hint(spec: KernelSpec, tensors: dict[str, torch.Tensor], size: dict[str, int], flag: Any) -> str | None:
    """For an input that raised: the shape features it used that no signature shows (grouped heads,
    a v head dim of its own, M != N), each with the declaration that leaves it out."""
    q, k, v = (tensors.get(n) for n in ("q", "k", "v"))
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return None
    used = []
    if q.shape[1] != k.shape[1]:
        used.append((f"grouped heads (Hq={q.shape[1]}, Hkv={k.shape[1]})", "gqa", False))
    if v.shape[-1] != q.shape[-1]:
        used.append((f"a v head dim of its own (D={q.shape[-1]}, Dv={v.shape[-1]})", "dv", False))
    if q.shape[-2] != k.shape[-2]:
        used.append((f"M != N (M={q.shape[-2]}, N={k.shape[-2]})", "square_only", True))
    if not used:
        return None
    return ("it raised on an input with " + " and ".join(u for u, _, _ in used) + "; if it does not take that, "
            + " and ".join(f"declare `{key}={val}` ({flag(key, val)})" for _, key, val in used))


def capability_notes(spec: KernelSpec) -> tuple[list[str], list[str]]:
    """(declared limits, tests not run) for the run's header, beyond those every family has."""
    parts, skipped = [], []
    if spec.head_dims is not None:
        parts.append(spec.head_dims.__doc__ or "head dims by predicate")
    for flag, what in (("causal", "causal"), ("kv_lens", "kv_lens"), ("custom_scale", "custom scale")):
        if not getattr(spec, flag):
            skipped.append(what)
    if spec.square_only:
        skipped.append("M != N")
    parts.append(f"causal align {'/'.join(spec.causal_align)}, row sum {spec.row_sum}")
    return parts, skipped
