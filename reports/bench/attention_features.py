"""`python -m flashcheck.reports.bench.attention_features`: speed of the attention features on the GPU.

Five sections, each a Markdown table put into reports/records/attention_bench.md between its own
`<!-- bench:NAME -->` markers (attention.write_sections: the main table and the other
sections stay as they are), all timed in one run with triton.testing.do_bench (median, L2 flushed
before each call; 100 ms per measurement, 50 ms for decode):

- gqa: causal prefill with grouped query heads, B 2, Hq 32, Hkv 32/8/4, S 4096, D 128; ours
  against SDPA (enable_gqa=True) with its flash, cuDNN and efficient backends forced.
- decode: one query token against a KV cache of N keys, B 4, Hq 32, Hkv 32/8/4, D 128; ours with
  the automatic split-KV (num_splits=0, the count it picks is shown) and fixed split counts,
  SDPA, and the K/V read rate as a fraction of a device-to-device copy of as many bytes.
- varlen: attention_varlen on 8 packed sequences of mixed lengths (16384 tokens, H 16, D 128)
  against ours on each sequence alone (times summed) and on one padded batch.
- window: sliding window (L, 0) and softcap c tanh(s / c), causal, B 4, H 16, S 4096/8192, D 128;
  ours against FlexAttention (torch.compile, block mask / score_mod) and SDPA with a boolean mask.
- launch: a short decode call's host time (Python, checks, launch) against its GPU time (a CUDA
  graph replay), ours and SDPA (reports/bench/launch.py).

Every row has max |ours - reference| (the reference is named in its table). `--sections` picks
sections, `--quick` runs fewer cases, `--budget S` starts no new case after S seconds (and no
FlexAttention compile in the last 75 s of it): what was measured is written, the rest is left out
and said so. Each section is written as soon as it is done (and, with $OUT set, the raw rows to
$OUT/attention_features.json).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .launch import bench_launch, graph_us, md_launch
from .common import (
    DTYPES, HEAD, OUT, bench_ms, command_line, flops, max_diff, no_gpu, run_info, sdpa_backend, sdpa_call, time_sdpa,
    write_sections,
)

PROG = "python -m flashcheck.reports.bench.attention_features"
DEV = "cuda"
SECTIONS = ("gqa", "decode", "varlen", "window", "launch")
REP, DECODE_REP = 100, 50  # ms of timed calls per measurement
SDPA_ALL = ("flash", "cudnn", "efficient")
GQA = (2, 32, 4096, 128)  # B, Hq, S, D
KV_HEADS = (32, 8, 4)  # groups 1, 4, 8 of the 32 query heads
DECODE = (4, 32, 128)  # B, Hq, D
CACHE = (1024, 4096, 16384, 65536, 131072)
SPLITS = (1, 2, 4, 8, 16, 32)
VARLEN_LENS = (512, 1024, 4096, 2048, 256, 3072, 1536, 3840)  # 16384 tokens
VARLEN_H, VARLEN_D = 16, 128
WINDOW = (4, 16, 128)  # B, H, D
WINDOW_S = (4096, 8192)
CAP = 30.0
WINDOW_CASES = (("window", 256), ("window", 1024), ("softcap", CAP))
CASE_MIN_S, FLEX_MIN_S = 20.0, 75.0  # budget a case / a FlexAttention compile needs left to start


def log(*a) -> None:
    print(*a, flush=True)


class Budget:
    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds
        self.skipped: dict[str, int] = {}

    def left(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def case(self, section: str) -> bool:
        """Whether a case of `section` may start; counts those that may not."""
        if self.left() >= CASE_MIN_S:
            return True
        self.skipped[section] = self.skipped.get(section, 0) + 1
        return False


def _rand(g, *shape, dtype) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=g)


def _dn(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _f(x, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def _x(t_other, t_ours) -> str:
    """Speed of ours relative to another: its time over ours (> 1: ours faster)."""
    return "-" if t_other is None or t_ours is None else f"{t_other / t_ours:.2f}x"


def _tf(fl: float, ms) -> float | None:
    return None if ms is None else fl / (ms * 1e-3) / 1e12


def _best(times: dict):
    ok = [t for t in times.values() if t is not None]
    return min(ok) if ok else None


def _math_ref(q, k, v, causal, **kw) -> torch.Tensor:
    from torch.nn.attention import SDPBackend

    return sdpa_call(SDPBackend.MATH, q, k, v, causal, **kw)()


def _table(title: str, command: str, intro: str, head: list[str], rows: list[list[str]], skipped: int) -> str:
    lines = [f"## {title}", "", f"{run_info(command)}. {intro}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if skipped:
        lines += ["", f"{skipped} more case(s) not measured: the run's --budget was spent."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# GQA prefill
# --------------------------------------------------------------------------------------------

def bench_gqa(dtypes, quick: bool, budget: Budget) -> list[dict]:
    from flashcheck.kernels.attention import attention

    b, hq, s, d = GQA
    rows = []
    for dtype in dtypes:
        for hkv in KV_HEADS[:2] if quick else KV_HEADS:
            if not budget.case("gqa"):
                continue
            g = torch.Generator(device=DEV).manual_seed(0)
            q, k, v = _rand(g, b, hq, s, d, dtype=dtype), _rand(g, b, hkv, s, d, dtype=dtype), \
                _rand(g, b, hkv, s, d, dtype=dtype)
            times, ref = time_sdpa(q, k, v, True, SDPA_ALL, rep=REP, log=log, enable_gqa=True)
            ref = _math_ref(q, k, v, True, enable_gqa=True) if ref is None else ref
            diff = max_diff(attention(q, k, v, causal=True), ref)
            t = bench_ms(lambda: attention(q, k, v, causal=True), REP)
            rows.append({"dtype": _dn(dtype), "hq": hq, "hkv": hkv, "ours_ms": t, "sdpa_ms": times, "max_diff": diff,
                         "flops": flops(b, hq, s, d, True)})
            log(f"gqa {_dn(dtype)} Hq {hq} Hkv {hkv}: ours {t:.3f} ms, SDPA {times}, max diff {diff:.3g}")
    return rows


def md_gqa(rows: list[dict], command: str, skipped: int) -> str:
    b, hq, s, d = GQA
    intro = (f"Causal prefill, B {b}, Hq {hq}, S {s}, D {d}, K/V with Hkv heads (query head h reads K/V "
             "head h // (Hq / Hkv)). TFLOP/s = 4 B Hq S^2 D / 2 / time. SDPA: "
             "`scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)` with the backend forced "
             "('-': it refuses the input). `ours / best SDPA`: the fastest SDPA backend's time over ours "
             "(> 1: ours faster). max abs diff: ours against the first SDPA backend that ran.")
    head = ["dtype", "Hq / Hkv (group)", "ours", "SDPA flash", "SDPA cuDNN", "SDPA efficient", "ours / best SDPA",
            "max abs diff"]
    out = [[r["dtype"], f"{r['hq']} / {r['hkv']} ({r['hq'] // r['hkv']})", _f(_tf(r["flops"], r["ours_ms"])),
            *(_f(_tf(r["flops"], r["sdpa_ms"][n])) for n in SDPA_ALL), _x(_best(r["sdpa_ms"]), r["ours_ms"]),
            f"{r['max_diff']:.2g}"] for r in rows]
    return _table("GQA prefill", command, intro, head, out, skipped)


# --------------------------------------------------------------------------------------------
# Decode (split-KV)
# --------------------------------------------------------------------------------------------

@contextmanager
def _chosen_splits():
    """The split counts the launcher's automatic choice returns while inside (num_splits=0)."""
    mod = importlib.import_module("flashcheck.kernels.attention_plan")
    mod.launch_plan.cache_clear()  # a cached plan would not ask auto_splits again
    seen: list[int] = []
    orig = mod.auto_splits

    def record(*a, **kw):
        seen.append(orig(*a, **kw))
        return seen[-1]
    mod.auto_splits = record
    try:
        yield seen
    finally:
        mod.auto_splits = orig


def bench_decode(dtypes, quick: bool, budget: Budget) -> list[dict]:
    from flashcheck.kernels.attention import attention

    b, hq, d = DECODE
    copy_ms: dict[int, float] = {}  # by byte count: the copy is the same for fp16 and bf16
    rows = []
    for dtype, n, hkv in itertools.product(dtypes, (4096, 65536) if quick else CACHE, (32, 4) if quick else KV_HEADS):
        if not budget.case("decode"):
            continue
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = _rand(g, b, hq, 1, d, dtype=dtype), _rand(g, b, hkv, n, d, dtype=dtype), \
            _rand(g, b, hkv, n, d, dtype=dtype)
        nbytes = 2 * k.numel() * k.element_size()
        if nbytes not in copy_ms:
            src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
            dst = torch.empty_like(src)
            copy_ms[nbytes] = bench_ms(lambda: dst.copy_(src), DECODE_REP)
            del src, dst
        times, ref = time_sdpa(q, k, v, False, SDPA_ALL, rep=DECODE_REP, log=log, enable_gqa=True)
        ref = _math_ref(q, k, v, False, enable_gqa=True) if ref is None else ref
        with _chosen_splits() as chosen:
            diff = max_diff(attention(q, k, v, num_splits=0), ref)
        ours = {"auto": bench_ms(lambda: attention(q, k, v, num_splits=0), DECODE_REP)}
        for sp in SPLITS:
            diff = max(diff, max_diff(attention(q, k, v, num_splits=sp), ref))
            ours[sp] = bench_ms(lambda: attention(q, k, v, num_splits=sp), DECODE_REP)  # noqa: B023  (called here)
        gpu_us = graph_us(lambda: attention(q, k, v, num_splits=0))  # noqa: B023  (called here)
        # The vendors on the GPU alone too: the short caches' do_bench times are the host's.
        sdpa_gpu = {name: graph_us(sdpa_call(sdpa_backend(name), q, k, v, False, enable_gqa=True))
                    for name, t in times.items() if t is not None}
        rows.append({"dtype": _dn(dtype), "n": n, "hq": hq, "hkv": hkv, "bytes": nbytes, "copy_ms": copy_ms[nbytes],
                     "auto_splits": chosen[0] if chosen else None, "ours_ms": ours, "sdpa_ms": times, "max_diff": diff,
                     "auto_graph_us": gpu_us, "sdpa_graph_us": sdpa_gpu})
        log(f"decode {_dn(dtype)} N {n} Hkv {hkv}: ours {({s: round(t * 1e3, 1) for s, t in ours.items()})} us "
            f"(auto: {chosen[0] if chosen else '?'} splits), SDPA {times}, copy {copy_ms[nbytes] * 1e3:.1f} us, "
            f"max diff {diff:.3g}")
    return rows


def _copy_share(t_copy: float, t_ours: float | None) -> str:
    """`% copy`: t_copy / (2 t_ours), the rate ours reads K/V at as a share of what a copy moves
    (both times in one unit); '-' without a time of ours."""
    return "-" if not t_ours else f"{100 * t_copy / (2 * t_ours):.0f}%"


def _best_gpu(graph_us: dict, ours_us) -> tuple[str, str]:
    """(the fastest captured SDPA backend's time with its name, its time over ours), '-' without one."""
    best = _best(graph_us)
    if best is None:
        return "-", "-"
    name = next(n for n, t in graph_us.items() if t == best)
    return f"{best:.1f} ({name})", _x(best, ours_us)


def md_decode(rows: list[dict], command: str, skipped: int) -> str:
    b, hq, d = DECODE
    intro = (f"One query token against a cache of N keys, B {b}, Hq {hq}, D {d}, not causal; times in us. "
             "`auto`: ours with num_splits=0 (the launcher picks the split-KV count, in brackets); "
             f"`split s`: num_splits=s (1: no split, the default of `attention`), the fastest in bold. "
             "K/V bytes = 2 B Hkv N D itemsize (K and V each read once). copy GB/s = 2 bytes / time of "
             "`dst.copy_(src)` on buffers of that many bytes, timed in this run (a copy reads and writes "
             "them). `% copy` = (bytes / time of ours) / copy GB/s = t_copy / (2 t_ours): the rate ours reads "
             "K/V at as a share of what a copy moves. `auto GPU`: ours-auto's time per call replayed from a "
             "CUDA graph (the GPU alone: no host time, which bounds the short caches' do_bench times), and "
             "`GPU % copy` the same share of the same copy ('-': no capture). The copy is not timed from a "
             "graph: captured, `copy_` becomes a memcpy node, which on an H200 ran 1.5x slower than the eager "
             "copy from 512 MB up. Caches of a few tens of MB fit in L2, where the graph's back-to-back "
             "replays find them: there `GPU % copy` overstates. "
             "SDPA: `enable_gqa=True`, backend forced ('-': refused). "
             "`auto / best SDPA`: the fastest SDPA time over ours-auto's (> 1: ours faster). `best SDPA GPU`: "
             "the fastest SDPA backend's time from a CUDA graph, as `auto GPU` (the backend in brackets), and "
             "`GPU: best SDPA / auto` its time over ours-auto's there ('-': no capture). max abs diff: "
             "the largest over every ours column, against the first SDPA backend that ran.")
    head = ["dtype", "N", "Hq / Hkv", "copy GB/s", "auto (splits)", "auto % copy", "auto GPU", "GPU % copy",
            *(f"split {s}" for s in SPLITS), "best % copy", "SDPA flash", "SDPA cuDNN", "SDPA efficient",
            "auto / best SDPA", "best SDPA GPU", "GPU: best SDPA / auto", "max abs diff"]
    out = []
    for r in rows:
        fixed = {s: r["ours_ms"][s] for s in SPLITS}
        fastest = min(fixed, key=fixed.get)
        us = lambda ms: _f(None if ms is None else ms * 1e3, ".1f")  # noqa: E731
        out.append([r["dtype"], str(r["n"]), f"{r['hq']} / {r['hkv']}", f"{2 * r['bytes'] / (r['copy_ms'] * 1e6):.0f}",
                    f"{us(r['ours_ms']['auto'])} ({r['auto_splits']})",
                    _copy_share(r["copy_ms"], r["ours_ms"]["auto"]),
                    _f(r.get("auto_graph_us"), ".1f"), _copy_share(r["copy_ms"] * 1e3, r.get("auto_graph_us")),
                    *(f"**{us(t)}**" if s == fastest else us(t) for s, t in fixed.items()),
                    _copy_share(r["copy_ms"], fixed[fastest]),
                    *(us(r["sdpa_ms"][n]) for n in SDPA_ALL), _x(_best(r["sdpa_ms"]), r["ours_ms"]["auto"]),
                    *_best_gpu(r.get("sdpa_graph_us") or {}, r.get("auto_graph_us")), f"{r['max_diff']:.2g}"])
    return _table("Decode (split-KV)", command, intro, head, out, skipped)


# --------------------------------------------------------------------------------------------
# Varlen
# --------------------------------------------------------------------------------------------

def bench_varlen(dtypes, quick: bool, budget: Budget) -> list[dict]:
    from flashcheck.kernels.attention import attention, attention_varlen

    h, d, lens = VARLEN_H, VARLEN_D, VARLEN_LENS
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEV)
    total, smax = sum(lens), max(lens)
    rows = []
    for dtype, causal in itertools.product(dtypes, (False, True)):
        if not budget.case("varlen"):
            continue
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = (_rand(g, total, h, d, dtype=dtype) for _ in range(3))
        # the same tokens as dense (1, H, s, D) batches, one per sequence; and a padded (8, H, max, D) batch
        dense = [[t[a:e].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v)]
                 for a, e in itertools.pairwise(cu.tolist())]
        padded = [_rand(g, len(lens), h, smax, d, dtype=dtype) for _ in range(3)]
        packed = lambda outs: torch.cat([o[0].transpose(0, 1) for o in outs])  # noqa: E731  (back to (total, H, D))

        def run_varlen():
            return attention_varlen(q, k, v, cu, cu, max_seqlen_q=smax, max_seqlen_k=smax, causal=causal)
        o = run_varlen()
        ref = packed([torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal) for qkv in dense])
        ours_dense = packed([attention(*qkv, causal=causal) for qkv in dense])
        t_var = bench_ms(run_varlen, REP)
        t_seq = [bench_ms(lambda: attention(*qkv, causal=causal), REP) for qkv in dense]  # noqa: B023  (called here)
        t_pad = bench_ms(lambda: attention(*padded, causal=causal), REP)
        rows.append({"dtype": _dn(dtype), "causal": causal, "varlen_ms": t_var, "dense_ms": t_seq, "padded_ms": t_pad,
                     "flops": sum(flops(1, h, s, d, causal) for s in lens), "max_diff": max_diff(o, ref),
                     "diff_dense": max_diff(o, ours_dense)})
        log(f"varlen {_dn(dtype)} causal={causal}: varlen {t_var:.3f} ms, dense sum {sum(t_seq):.3f} ms "
            f"(ratio {t_var / sum(t_seq):.3f}), padded {t_pad:.3f} ms")
    return rows


def md_varlen(rows: list[dict], command: str, skipped: int) -> str:
    lens = VARLEN_LENS
    intro = (f"{len(lens)} sequences of lengths {', '.join(map(str, lens))} ({sum(lens)} tokens), H {VARLEN_H} "
             f"(Hq = Hkv), D {VARLEN_D}; times in ms. `varlen`: one `attention_varlen` call on the packed "
             "(total, H, D) tensors. `dense sum`: ours on each sequence as its own (1, H, s, D) batch, the "
             "times (each measured alone) summed. `varlen / dense sum`: time ratio (target <= 1.10). "
             f"`padded`: one dense (B {len(lens)}, H, S {max(lens)}, D) batch, padding computed as work (for "
             "reference). TFLOP/s = sum over sequences of 4 H s^2 D (halved when causal) / time. max abs "
             "diff: varlen against SDPA run on each dense sequence; `vs dense ours`: varlen against ours per "
             "sequence.")
    head = ["dtype", "causal", "varlen", "varlen TFLOP/s", "dense sum", "dense TFLOP/s", "varlen / dense sum",
            "padded", "max abs diff", "vs dense ours"]
    out = [[r["dtype"], str(r["causal"]), f"{r['varlen_ms']:.3f}", _f(_tf(r["flops"], r["varlen_ms"])),
            f"{sum(r['dense_ms']):.3f}", _f(_tf(r["flops"], sum(r["dense_ms"]))),
            f"{r['varlen_ms'] / sum(r['dense_ms']):.2f}", f"{r['padded_ms']:.3f}", f"{r['max_diff']:.2g}",
            f"{r['diff_dense']:.2g}"] for r in rows]
    return _table("Varlen (packed sequences)", command, intro, head, out, skipped)


# --------------------------------------------------------------------------------------------
# Sliding window and softcap
# --------------------------------------------------------------------------------------------

_LEFT: torch.Tensor | None = None  # the window's left edge, a GPU tensor FlexAttention captures:
# one compiled kernel serves every width (a Python int would be a constant, one compile per width)


def _window_mask(b, h, qi, ki):
    return (ki <= qi) & (qi - ki <= _LEFT)


def _causal_mask(b, h, qi, ki):
    return ki <= qi


def _softcap_score(score, b, h, qi, ki):
    return CAP * torch.tanh(score / CAP)


def visible_pairs(s: int, left: int | None) -> int:
    """(query, key) pairs a causal row set sees: keys i - left .. i of query i (all of 0 .. i when
    left is None)."""
    if left is None or left >= s - 1:
        return s * (s + 1) // 2
    return s * (left + 1) - left * (left + 1) // 2


def _slice_ref(q, k, v, keep, softcap: float) -> torch.Tensor:
    """fp32 attention of batch 0, heads 0-1 (scores, softcap, mask, softmax, P V in torch)."""
    qs, ks, vs = (t[0, :2].float() for t in (q, k, v))
    s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vs


class _Flex:
    """FlexAttention compiled once per input shape and dtype and mask/score function; `None`
    after it failed once (not installed, or it does not compile here)."""

    def __init__(self) -> None:
        self.fn = None
        self.broken = False

    def __call__(self, q, k, v, kind: str, left: int | None):
        global _LEFT
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if self.fn is None:
            import torch._dynamo

            for name in ("recompile_limit", "cache_size_limit"):  # one compile per (S, dtype, kind)
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 64)
            self.fn = torch.compile(flex_attention, dynamic=False)
        s = q.shape[2]
        if kind == "window":
            if _LEFT is None:
                _LEFT = torch.zeros((), dtype=torch.int32, device=DEV)
            _LEFT.fill_(left)
            mask = create_block_mask(_window_mask, None, None, s, s, device=DEV)
            return lambda: self.fn(q, k, v, block_mask=mask)
        mask = create_block_mask(_causal_mask, None, None, s, s, device=DEV)
        return lambda: self.fn(q, k, v, score_mod=_softcap_score, block_mask=mask)


def bench_window(dtypes, quick: bool, budget: Budget) -> list[dict]:
    from flashcheck.kernels.attention import attention

    b, h, d = WINDOW
    flex = _Flex()
    rows = []
    cases = WINDOW_CASES[::2] if quick else WINDOW_CASES
    for s, dtype, (kind, param) in itertools.product(WINDOW_S[:1] if quick else WINDOW_S, dtypes, cases):
        if not budget.case("window"):
            continue
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = (_rand(g, b, h, s, d, dtype=dtype) for _ in range(3))
        left = param if kind == "window" else None
        cap = param if kind == "softcap" else 0.0
        i = torch.arange(s, device=DEV)
        keep = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] <= left) if left is not None else True)
        opts = dict(causal=True, window=(left, 0)) if left is not None else dict(causal=True, softcap=cap)
        o = attention(q, k, v, **opts)
        row = {"dtype": _dn(dtype), "s": s, "kind": kind, "param": param,
               "flops": 4.0 * b * h * d * visible_pairs(s, left),
               "max_diff": max_diff(o[0, :2], _slice_ref(q, k, v, keep, cap)),
               "ours_ms": bench_ms(lambda: attention(q, k, v, **opts), REP)}  # noqa: B023  (called here)
        row["flex_ms"] = None
        if flex.broken or budget.left() < FLEX_MIN_S:
            log(f"  flex skipped ({'it failed before' if flex.broken else 'budget'})")
        else:
            try:
                fn = flex(q, k, v, kind, left)
                row["flex_diff"] = max_diff(fn(), o)
                row["flex_ms"] = bench_ms(fn, REP)
            except Exception as e:  # noqa: BLE001  (no FlexAttention here, or it does not compile)
                flex.broken = True
                log(f"  flex unavailable: {type(e).__name__}: {str(e)[:200]}")
        times = {}
        if kind == "window":  # SDPA has no softcap
            times, _ = time_sdpa(q, k, v, False, ("efficient", "cudnn"), rep=REP, log=log, attn_mask=keep)
        row["sdpa_ms"] = times
        rows.append(row)
        log(f"window {_dn(dtype)} S {s} {kind} {param}: ours {row['ours_ms']:.3f} ms, flex {row['flex_ms']} "
            f"(max |flex - ours| {row.get('flex_diff')}), SDPA {times}, max diff {row['max_diff']:.3g}")
    return rows


def md_window(rows: list[dict], command: str, skipped: int) -> str:
    b, h, d = WINDOW
    intro = (f"Causal, B {b}, H {h}, D {d}. `window L`: ours with window=(L, 0) (query i sees keys i - L .. i); "
             f"`softcap c`: scores c tanh(s / c) after the scale, causal. TFLOP/s count only the visible work: "
             "4 B H D x (visible (query, key) pairs) / time, pairs = S (L + 1) - L (L + 1) / 2 for a window, "
             "S (S + 1) / 2 for causal; masked entries of the blocks a kernel visits are not counted. Flex: "
             "`torch.compile(flex_attention)` with a block mask of the same visibility (softcap as score_mod), "
             "compile time excluded. SDPA + mask: an explicit (S, S) boolean mask, efficient and cuDNN "
             "backends forced, the faster shown ('-': refused, or no softcap in SDPA). `Flex / ours`, "
             "`SDPA / ours`: time ratios (> 1: ours faster). max abs diff: ours against fp32 torch on "
             "batch 0, heads 0-1.")
    head = ["dtype", "S", "feature", "ours", "Flex", "SDPA + mask", "Flex / ours", "SDPA / ours", "max abs diff"]
    out = [[r["dtype"], str(r["s"]), f"{r['kind']} {r['param']:g}", _f(_tf(r["flops"], r["ours_ms"])),
            _f(_tf(r["flops"], r["flex_ms"])), _f(_tf(r["flops"], _best(r["sdpa_ms"]))),
            _x(r["flex_ms"], r["ours_ms"]), _x(_best(r["sdpa_ms"]), r["ours_ms"]), f"{r['max_diff']:.2g}"]
           for r in rows]
    return _table("Sliding window and softcap", command, intro, head, out, skipped)


BENCH = {"gqa": (bench_gqa, md_gqa), "decode": (bench_decode, md_decode), "varlen": (bench_varlen, md_varlen),
         "window": (bench_window, md_window),
         "launch": (lambda dtypes, quick, budget: bench_launch(dtypes, quick, budget, rep=DECODE_REP, log=log),
                    lambda rows, command, skipped: md_launch(rows, command, skipped, _table))}


def run_sections(sections, *, quick: bool, out: Path, command: str, budget: float | None = None) -> dict:
    """Measure each section in turn and write its table into `out` as soon as it is done (a section
    with no measured case leaves the file's earlier table). Returns the rows per section."""
    clock = Budget(budget)
    dtypes = DTYPES[:1] if quick else DTYPES
    results = {}
    for name in sections:
        bench, md = BENCH[name]
        t0 = time.monotonic()
        log(f"== {name} ({clock.left():.0f} s of budget left)")
        rows = bench(dtypes, quick, clock)
        results[name] = rows
        log(f"== {name}: {len(rows)} case(s) in {time.monotonic() - t0:.0f} s")
        if rows:
            text = md(rows, command, clock.skipped.get(name, 0))
            print(text, flush=True)
            write_sections(out, {name: text}, HEAD)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "attention_features.json").write_text(json.dumps(results, indent=1, default=str))
    log(f"wrote {out}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, from {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="fewer cases (fp16 only, fewer shapes)")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="start no new case after S seconds (default: no limit)")
    p.add_argument("--out", type=Path, default=OUT, help="Markdown file, only its measured sections rewritten")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    if no_gpu(PROG):
        return 2
    run_sections(sections, quick=args.quick, out=args.out, command=command_line(PROG, argv), budget=args.budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
