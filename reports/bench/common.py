"""What the GPU benchmarks share: timing (`bench_ms`, SDPA's backends), the stamp every table's
first line carries (`run_info`), the reproducing command line, and the sectioned record files
(`write_sections`) that several benchmarks write into."""
from __future__ import annotations

import datetime as dt
import re
import shlex
import sys
from pathlib import Path

import torch

from flashcheck import atomic, kernels  # noqa: F401  (kernels: runtime switch first)
from flashcheck.kernels._runtime import INTERPRET
from flashcheck.reports import RECORDS
from flashcheck.reports.quality.records import sectioned_header, stamp

OUT = RECORDS / "attention_bench.md"
DTYPES = [torch.float16, torch.bfloat16]


def flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def bench_ms(fn, rep: int = 400) -> float:
    """Median time of fn in ms (L2 flushed before each call), warm-up a quarter of rep."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=min(100, rep // 4), rep=rep, return_mode="median")


def sdpa_call(backend, q, k, v, causal, **kw):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
    return run


def sdpa_backend(name: str):
    """The SDPA backend a table names: flash, cudnn or efficient."""
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def time_sdpa(q, k, v, causal: bool, names, *, rep: int = 400, log=print, **kw) -> tuple[dict, torch.Tensor | None]:
    """Time SDPA with each backend of `names` (flash, cudnn, efficient) forced: ({name: ms or None
    when the backend refuses the input}, the first backend's output or None)."""
    times, ref = {}, None
    for name in names:
        try:
            fn = sdpa_call(sdpa_backend(name), q, k, v, causal, **kw)
            out = fn()
            ref = out if ref is None else ref
            times[name] = bench_ms(fn, rep)
        except Exception as e:  # noqa: BLE001  (a backend that refuses this input)
            times[name] = None
            log(f"  {name} unavailable: {type(e).__name__}: {str(e)[:120]}")
    return times, ref


def run_info(command: str) -> str:
    """What every table's first line states: device, date, versions, commit, kernels digest and the
    command that made it (records.STAMP reads it back for the record's header)."""
    import triton

    return (f"{torch.cuda.get_device_name()}, {dt.date.today().isoformat()}; torch {torch.__version__}, "
            f"triton {triton.__version__}; {stamp()}; `{command}`")


def command_line(prog: str, argv: list[str] | None) -> str:
    """The command that reproduces this run (`--out` left out: it names this machine's file)."""
    args = list(sys.argv[1:] if argv is None else argv)
    keep, skip = [], False
    for a in args:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        keep.append(a)
    return " ".join([prog, *map(shlex.quote, keep)])


_SECTION = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.S)


#: The record's header: (title, what it measures, the one command that regenerates it).
HEAD = ("Attention forward speed",
        "forward attention speed on the GPU: ours (kernels/attention.py) against torch SDPA's backends, and the "
        "features (GQA, split-KV decode, varlen, window and softcap, launch cost)",
        "python -m flashcheck.reports.bench.attention --all")


def write_sections(path: Path, sections: dict[str, str], head: tuple[str, str, str] | None = None) -> None:
    """Put each section's Markdown into `path` between `<!-- bench:NAME -->` and `<!-- /bench:NAME
    -->`, replacing that section where the file has it and appending it otherwise; the rest of the
    file stays as it was. A file without any marker is taken whole as the `main` section. `head`
    (HEAD's shape): the text above the first marker becomes the record's header, rebuilt from the
    sections' stamps (run_info)."""
    text = path.read_text() if path.exists() else ""
    if text.strip() and not _SECTION.search(text):
        text = f"<!-- bench:main -->\n{text.rstrip()}\n<!-- /bench:main -->\n"
    for name, md in sections.items():
        block = f"<!-- bench:{name} -->\n{md.rstrip()}\n<!-- /bench:{name} -->\n"
        found = [m for m in _SECTION.finditer(text) if m["name"] == name]
        if found:
            text = text[:found[0].start()] + block + text[found[0].end():]
        else:
            text = (text.rstrip() + "\n\n" if text.strip() else "") + block
    if head:
        text = sectioned_header(text, *head)
    atomic.write_text(path, text)  # the other sections' tables are in this file too: never half-written


def no_gpu(prog: str) -> bool:
    """True (after one line on stderr) when there is no GPU to time on."""
    if INTERPRET or not torch.cuda.is_available():
        print(f"{prog} needs a GPU (the interpreter is far too slow to time)", file=sys.stderr)
        return True
    return False
