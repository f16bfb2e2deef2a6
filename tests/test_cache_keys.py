"""The production kernels' Triton cache keys do not depend on which kernel a process hashes first.

Triton 3.6 folds a callee's constexpr globals into a caller's key only when the callee was hashed
first, so without `kernels._runtime.settle_cache_keys` the online and split softmax kernels got
one key in some xdist workers and another in the rest, and a warm on-disk cache rebuilt their
binaries (`git show 2d0dacc:reports/gpu_run.md`, part M; fixed upstream after 3.6 by triton-lang/triton#10494, "Make JIT
dependency cache keys deterministic"). The keys are computed the JIT's way, without a GPU: each
order runs in a process of its own with `TRITON_INTERPRET=0`, where `@triton.jit` builds real
`JITFunction`s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = r"""
import json, sys
import flashcheck.kernels  # noqa: F401  (settles the keys at import)
from triton.runtime.jit import JITFunction
fns = []  # every kernel module imported with the package, not a list of them kept here as well
for mod in sorted(name for name in sys.modules if name.startswith("flashcheck.kernels.")):
    fns += [(mod[len("flashcheck.kernels."):] + "." + n, v) for n, v in vars(sys.modules[mod]).items()
            if isinstance(v, JITFunction)]
if sys.argv[1] == "reversed":
    fns.reverse()
print(json.dumps({name: fn.cache_key for name, fn in fns}))
"""


def _keys(order: str) -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", _PROBE, order], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cache_keys_do_not_depend_on_hashing_order() -> None:
    first, last = _keys("defined"), _keys("reversed")
    assert any(n.endswith("._softmax_online_kernel") for n in first), sorted(first)
    differ = sorted(n for n in first if first[n] != last[n])
    assert not differ, f"cache keys that depend on which kernel was hashed first: {differ}"
