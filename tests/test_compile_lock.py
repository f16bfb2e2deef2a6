"""flashcheck.isolation.compile_lock: workers needing one binary compile it once (issue 19). The lock is
checked here with threads and a stand-in for Triton's `_do_compile` (nothing compiles on the CPU)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from flashcheck.isolation import compile_lock

KERNEL = SimpleNamespace(cache_key="abc")


def _calls(tmp_path, keys, *, fail: bool = False):
    spans: dict[str, tuple[float, float]] = {}

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        t0 = time.monotonic()
        time.sleep(0.2)
        spans[f"{key}-{threading.current_thread().name}"] = (t0, time.monotonic())
        if fail:
            raise RuntimeError("does not compile")
        return key

    wrapped = compile_lock.locked(do_compile, directory=lambda: tmp_path)
    errors = []

    def call(key):
        try:
            wrapped(KERNEL, key, None, 0, {}, {"num_warps": 4}, None, False)
        except RuntimeError as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(k,), name=f"t{i}") for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return sorted(spans.values()), errors


def _overlap(spans) -> bool:
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def test_one_binary_is_built_by_one_worker_at_a_time(tmp_path) -> None:
    spans, _ = _calls(tmp_path, ["k", "k", "k"])
    assert len(spans) == 3 and not _overlap(spans)


def test_different_binaries_build_side_by_side(tmp_path) -> None:
    spans, _ = _calls(tmp_path, ["k1", "k2", "k3"])
    assert _overlap(spans)


def test_a_compile_error_releases_the_lock(tmp_path) -> None:
    spans, errors = _calls(tmp_path, ["k", "k"], fail=True)
    assert len(spans) == 2 and len(errors) == 2 and not _overlap(spans)


def test_the_key_names_source_specialisation_and_options() -> None:
    k = compile_lock.binary_key(KERNEL, ("fp16", 16), {"num_warps": 4})
    assert k == compile_lock.binary_key(SimpleNamespace(cache_key="abc"), ("fp16", 16), {"num_warps": 4})
    assert k != compile_lock.binary_key(SimpleNamespace(cache_key="abd"), ("fp16", 16), {"num_warps": 4})
    assert k != compile_lock.binary_key(KERNEL, ("fp16", 32), {"num_warps": 4})
    assert k != compile_lock.binary_key(KERNEL, ("fp16", 16), {"num_warps": 8})


def test_nothing_is_installed_under_the_interpreter_or_when_turned_off(monkeypatch) -> None:
    from triton.runtime import jit

    from flashcheck.kernels import INTERPRET

    before = jit.JITFunction._do_compile
    monkeypatch.setenv(compile_lock.ENV, "0")
    assert compile_lock.install() is False
    if not INTERPRET:
        pytest.skip("on a GPU the suite's conftest has installed it")
    monkeypatch.delenv(compile_lock.ENV)
    assert compile_lock.install() is False and jit.JITFunction._do_compile is before
