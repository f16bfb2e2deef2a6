"""The `launch` section of `python -m flashcheck.reports.bench.attention_features`: where a
call's time goes, the host (Python and the launch) or the GPU, for decode and two prefill shapes.

A decode step moves a few MB; its kernel runs for tens of microseconds, about as long as the host
takes to validate the arguments and launch it. `triton.testing.do_bench` times a call from an event
recorded before it to one after it, and the L2 flush before each call gives the host only the
flush's time as a head start, so when the host is slower the GPU waits inside that window and the
host's time shows up in the tables, for short prefill kernels too. This section times three
things per callable, in one run:

- host: wall time per call of 500 calls issued back to back, measured before synchronising (the
  GPU queue does not fill at this length, so the host never waits on the GPU);
- GPU: time per call of a CUDA graph holding 10 calls, replayed (no host work at all);
- do_bench: the decode table's measure (L2 flushed before each call).
"""
from __future__ import annotations

import time

import torch

from .common import bench_ms, sdpa_call

DEV = "cuda"
LAUNCH = (4, 32, 128, 1024)  # B, Hq, D, N: a short cache, where the host matters most
LAUNCH_KV = (32, 8)
PREFILL = ((4, 16, 4096, 64, False), (4, 16, 4096, 128, True))  # B, H, S, D, causal: main-table shapes
HOST_CALLS, GRAPH_CALLS, GRAPH_REPLAYS = 500, 10, 20


def host_us(fn, *, calls: int = HOST_CALLS, warmup: int = 20) -> float:
    """Host microseconds per call: `calls` calls queued back to back, timed before synchronising
    (the GPU's speed does not enter while the launch queue has room; keep calls x launches a call
    well under its ~1000 entries)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def graph_of(fn, *, calls: int = 1) -> torch.cuda.CUDAGraph:
    """`calls` calls of fn captured in one CUDA graph, after a warm-up on a side stream as torch
    asks: a replay launches them without any host work, so its time is the GPU's alone. Raises
    when fn cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graph_us(fn) -> float | None:
    """GPU time per call from a replayed CUDA graph; None when fn cannot be captured."""
    try:
        graph = graph_of(fn, calls=GRAPH_CALLS)
    except Exception:  # noqa: BLE001  (a backend that refuses capture: reported as '-')
        return None
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GRAPH_REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (GRAPH_REPLAYS * GRAPH_CALLS)


def tritons_launch(fn):
    """fn with the compiled-kernel replay off (`kernels/_runtime.py:launch`): every launch through
    Triton's `JITFunction.run`, to time the replay against in the same run."""
    from flashcheck.kernels import _runtime

    def call():
        was, _runtime.REPLAY = _runtime.REPLAY, False
        try:
            return fn()
        finally:
            _runtime.REPLAY = was

    return call


def bench_launch(dtypes, quick: bool, budget, *, rep: int, log) -> list[dict]:
    from torch.nn.attention import SDPBackend

    from flashcheck.kernels.attention import attention

    b, hq, d, n = LAUNCH
    rows = []
    for hkv in LAUNCH_KV[:1] if quick else LAUNCH_KV:
        if not budget.case("launch"):
            continue
        g = torch.Generator(device=DEV).manual_seed(0)
        q = torch.randn(b, hq, 1, d, device=DEV, dtype=dtypes[0], generator=g)
        k, v = (torch.randn(b, hkv, n, d, device=DEV, dtype=dtypes[0], generator=g) for _ in range(2))
        fns = {"ours, split 1": lambda: attention(q, k, v),  # noqa: B023  (called in this iteration)
               "ours, auto": lambda: attention(q, k, v, num_splits=0)}  # noqa: B023
        fns.update({f"{name}, Triton's launch": tritons_launch(fn) for name, fn in list(fns.items())})
        for name, be in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
            fns[name] = sdpa_call(be, q, k, v, False, enable_gqa=True)
        rows += _time_all(fns, f"decode B {b}, N {n}, Hq / Hkv {hq} / {hkv}", str(dtypes[0]).removeprefix("torch."), rep, log)
    for pb, ph, ps, pd, causal in PREFILL[:1] if quick else PREFILL:
        if not budget.case("launch"):
            continue
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = (torch.randn(pb, ph, ps, pd, device=DEV, dtype=dtypes[0], generator=g) for _ in range(3))
        fns = {"ours": lambda: attention(q, k, v, causal=causal)}  # noqa: B023  (called in this iteration)
        for name, be in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
            fns[name] = sdpa_call(be, q, k, v, causal)
        rows += _time_all(fns, f"prefill {pb}, {ph}, {ps}, {pd}{' causal' if causal else ''}",
                          str(dtypes[0]).removeprefix("torch."), rep, log)
    return rows


def _time_all(fns: dict, case: str, dtype: str, rep: int, log) -> list[dict]:
    rows = []
    for name, fn in fns.items():
        try:
            fn()
        except RuntimeError:  # a backend that refuses the input
            continue
        row = {"dtype": dtype, "case": case, "name": name, "host_us": host_us(fn), "graph_us": graph_us(fn),
               "do_bench_us": bench_ms(fn, rep) * 1e3}
        rows.append(row)
        log(f"launch {case} {name}: {row}")
    return rows


def md_launch(rows: list[dict], command: str, skipped: int, table) -> str:
    intro = ("Decode (B, Hq, D 128, one query, N keys) and two prefill shapes of the main table (B, H, S, D), "
             "times in us per call. `host`: wall time per call of "
             f"{HOST_CALLS} calls issued back to back (before synchronising); `GPU`: a CUDA graph of "
             f"{GRAPH_CALLS} calls replayed ('-': the call cannot be captured); `do_bench`: the decode table's "
             "measure. Where host > GPU the call is bound by the host (argument checks, Python, the launch), "
             "and do_bench shows part of the host's time. `Triton's launch`: the same call with every launch "
             "through Triton's `JITFunction.run` instead of replaying the compiled kernel "
             "(`kernels/_runtime.py:launch`).")
    head = ["dtype", "case", "call", "host", "GPU", "do_bench", "host / GPU"]
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    out = [[r["dtype"], r["case"], r["name"], fmt(r["host_us"]), fmt(r["graph_us"]), fmt(r["do_bench_us"]),
            "-" if not r["graph_us"] else f"{r['host_us'] / r['graph_us']:.1f}"] for r in rows]
    return table("Launch: host time against GPU time", command, intro, head, out, skipped)
