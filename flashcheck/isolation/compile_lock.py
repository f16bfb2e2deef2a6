"""One compilation per kernel binary on a machine: xdist workers that need the same binary wait
for the first to build it and then load it from Triton's on-disk cache.

Cold, the GPU suite is compile-bound (one H200, 16 workers: 3232 of 4317 worker-seconds were
Triton compiling, `git show 2d0dacc:reports/gpu_run.md`, part p), and the workers start on tests that need the same
launch variants at the same moment. Triton's cache is shared by the workers but says nothing about
a compilation in progress, so each of them builds the binary itself. `install()` wraps
`JITFunction._do_compile` (a worker's first launch of a specialisation: a compilation or a cache
load) in an exclusive `flock` per binary, keyed by the kernel's source hash, its specialisation and
its launch options; inside the lock Triton's own cache check runs as before. Nothing changes for
a single process, and the lock is released when the call returns or raises (a kernel that does not
compile fails every worker that needs it, one after another, as before).

Measured on one H200 each (a fresh machine per call, cold cache, gpu profile, 16 workers): without
it 224 of 634 tests were done at 300 s (call E); with it 591 (call H), whose finished tests built
1943 binaries while the cache held 2097 (no binary built twice that the count can show).

`FLASHCHECK_COMPILE_LOCK=0` turns it off. The locks live in `<Triton cache dir>/flashcheck-locks/`.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

ENV = "FLASHCHECK_COMPILE_LOCK"


def lock_dir() -> Path:
    from triton import knobs

    return Path(knobs.cache.dir) / "flashcheck-locks"


def binary_key(fn: Any, key: Any, options: Any) -> str:
    """What names one binary among the calls of `_do_compile`: the kernel's source hash (its
    dependencies included), the specialisation key and the launch options."""
    opts = getattr(options, "__dict__", options)
    text = repr((getattr(fn, "cache_key", repr(fn)), str(key), sorted((k, repr(v)) for k, v in dict(opts).items())))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@contextlib.contextmanager
def held(name: str, directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory/name.lock` for the duration (POSIX flock; a no-op without
    fcntl). A process that dies holding it releases it with its file descriptors."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover (not POSIX)
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / f"{name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


def locked(do_compile: Callable, directory: Callable[[], Path] = lock_dir) -> Callable:
    """`do_compile` (JITFunction._do_compile's signature) run under the lock of its binary."""
    def wrapper(self, key, signature, device, constexprs, options, attrs, warmup):
        with held(binary_key(self, key, options), directory()):
            return do_compile(self, key, signature, device, constexprs, options, attrs, warmup)

    wrapper._flashcheck_compile_lock = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = do_compile  # type: ignore[attr-defined]
    return wrapper


def install() -> bool:
    """Wrap Triton's JITFunction._do_compile (once per process) unless turned off or under the
    interpreter, which compiles nothing. Returns whether the lock is in place."""
    from flashcheck.kernels import INTERPRET

    if INTERPRET or os.environ.get(ENV, "1") == "0":
        return False
    from triton.runtime import jit

    if not getattr(jit.JITFunction._do_compile, "_flashcheck_compile_lock", False):
        jit.JITFunction._do_compile = locked(jit.JITFunction._do_compile)
    return True


__all__ = ["ENV", "binary_key", "held", "install", "lock_dir", "locked"]
