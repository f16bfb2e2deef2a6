"""One GPU per pytest-xdist worker.

With G GPUs visible, worker `gwN` runs on GPU `N mod G`. The choice is made through
`CUDA_VISIBLE_DEVICES` before CUDA is initialised: CUDA reads that variable once, when the driver
starts (any `torch.cuda.is_available()` starts it), so the plugin calls `assign_worker_gpu()`
first thing, before anything imports the kernels.

The worker's GPU is put first rather than alone (`CUDA_VISIBLE_DEVICES=1,0` for gw1 of two): its
kernels land on `cuda:0` (the default device) while the other GPUs stay visible, so the
two-device properties (`tests/test_devices.py`) still run under `-n auto`.

Should CUDA already be initialised when this is called (something imported torch and asked for a
GPU first), the variable no longer has any effect; the fallback is `torch.cuda.set_device`, which
moves the default device instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import sys
from collections.abc import Callable, MutableMapping, Sequence

VISIBLE = "CUDA_VISIBLE_DEVICES"
#: Set in a worker once its GPU is chosen (the physical id or UUID it was given), for its log.
ASSIGNED = "FLASHCHECK_WORKER_GPU"

_done = False


def worker_index(worker_id: str | None) -> int | None:
    """N of an xdist worker id `gwN`; None outside xdist (no id, or the controller's `master`)."""
    m = re.fullmatch(r"gw(\d+)", (worker_id or "").strip())
    return int(m.group(1)) if m else None


def rotated(devices: Sequence[str], index: int) -> list[str]:
    """The visible devices with worker `index`'s own (`index mod len`) first, the others after."""
    if not devices:
        return []
    k = index % len(devices)
    return [*devices[k:], *devices[:k]]


def visible_devices(environ: MutableMapping[str, str], count: Callable[[], int | None]) -> list[str] | None:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries; None when unknown.

    An explicit CUDA_VISIBLE_DEVICES is taken as given (ids, UUIDs or MIG names alike; empty means
    no GPU). Otherwise `count()` asks the driver without initialising CUDA.
    """
    raw = environ.get(VISIBLE)
    if raw is not None:
        return [d.strip() for d in raw.split(",") if d.strip()]
    n = count()
    return None if n is None else [str(i) for i in range(n)]


def _nvml_count() -> int | None:
    """GPUs the NVIDIA driver reports, via NVML (does not initialise CUDA); None without it."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        n = ctypes.c_uint(0)
        ok = nvml.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
        nvml.nvmlShutdown()
        return int(n.value) if ok else None
    except AttributeError:
        return None


def _smi_count() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len(out.stdout.split()) if out.returncode == 0 else None


def gpu_count() -> int | None:
    """How many GPUs the machine has, asked without initialising CUDA (NVML, else nvidia-smi)."""
    n = _nvml_count()
    return n if n is not None else _smi_count()


def _cuda_started() -> bool:
    """Whether CUDA has read CUDA_VISIBLE_DEVICES already: torch initialised it, or the kernels
    module was imported (it asks `torch.cuda.is_available()`, which starts the driver)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return torch.cuda.is_initialized() or "flashcheck.kernels._runtime" in sys.modules


def assign_worker_gpu(environ: MutableMapping[str, str] | None = None,
                      count: Callable[[], int | None] = gpu_count) -> str | None:
    """Give this xdist worker its GPU (see the module docstring); returns the device it got.

    Does nothing outside xdist, on a machine without GPUs, or when called a second time in the
    process. `environ` and `count` are for tests (a fake environment and GPU count).
    """
    global _done
    env = os.environ if environ is None else environ
    index = worker_index(env.get("PYTEST_XDIST_WORKER"))
    if index is None or (_done and environ is None):
        return None
    devices = visible_devices(env, count)
    if not devices:
        return None
    order = rotated(devices, index)
    if environ is None:
        _done = True
        if _cuda_started():  # too late for the variable: move the default device instead
            import torch

            if not torch.cuda.is_available():
                return None
            dev = index % torch.cuda.device_count()
            torch.cuda.set_device(dev)
            env[ASSIGNED] = f"cuda:{dev}"
            return env[ASSIGNED]
    env[VISIBLE] = ",".join(order)
    env[ASSIGNED] = order[0]
    return order[0]


@contextlib.contextmanager
def exclusive_memory(what: str = "a test"):
    """Hold this GPU's large-allocation gate while `what` runs: one holder at a time across every
    process on the machine (xdist workers and the pytest runs they start), so tests that each
    allocate a large share of the GPU (inputs past 2^31 elements: 8 GB and more) run one after
    another instead of exhausting it together; on leaving, this process's cached blocks go back
    to the GPU. A file lock (fcntl), released by the kernel if the holder dies."""
    import fcntl
    import gc
    import tempfile

    import torch

    dev = torch.cuda.current_device() if torch.cuda.is_available() else -1
    ids = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    name = ids[dev] if 0 <= dev < len(ids) and ids[dev].strip() else str(dev)
    path = os.path.join(tempfile.gettempdir(), f"flashcheck-gpu-{re.sub(r'[^0-9A-Za-z-]', '_', name)}-memory.lock")
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            fcntl.flock(fh, fcntl.LOCK_UN)


def interpreter_off_without_gpu(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The one line for TRITON_INTERPRET switched off on a machine with no GPU (None: fine).
    Without it every suite module failed to collect on "Torch not compiled with CUDA enabled"."""
    env = os.environ if environ is None else environ
    raw = env.get("TRITON_INTERPRET")
    if raw is None or raw.strip() not in ("", "0"):  # the kernels' own reading (kernels/_runtime.py)
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return (f"TRITON_INTERPRET={raw!r} switches Triton's interpreter off, but this machine has no GPU "
            "(torch.cuda.is_available() is False): unset it to run the kernels in the interpreter on the CPU")
