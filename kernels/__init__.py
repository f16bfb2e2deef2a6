"""Production Triton kernels and the kernel registry."""
from ._runtime import DEVICE, INTERPRET  # first: switches on the interpreter when there is no GPU
from .registry import REGISTRY, SPEC_TYPES, KernelSpec, get, kernels, register
from .softmax_spec import SoftmaxSpec
from .attention_spec import AttentionSpec
from .row_spec import LogSoftmaxBackwardSpec, LogSoftmaxSpec, SoftmaxBackwardSpec
from .cross_entropy_spec import CrossEntropySpec
from .attention import attention
from .attention_backward import attention_backward, attention_varlen_backward
from .softmax import softmax, softmax_online, softmax_row, softmax_split
from . import specs  # noqa: F401  (registers the production kernels)
from ._runtime import settle_cache_keys
import sys as _sys

# Before any kernel is launched or another module's kernel hashes a shared helper (`settle_cache_keys`);
# by module, not by package attribute: `attention` and `softmax` here are the functions.
settle_cache_keys(*(_sys.modules[f"{__name__}.{m}"] for m in ("_common", "softmax", "attention_merge", "attention",
                                                                  "attention_backward_kernels")))

__all__ = ["DEVICE", "INTERPRET", "REGISTRY", "SPEC_TYPES", "KernelSpec", "SoftmaxSpec", "AttentionSpec", "SoftmaxBackwardSpec",
           "LogSoftmaxSpec", "LogSoftmaxBackwardSpec", "CrossEntropySpec", "get", "kernels", "register", "attention",
           "attention_backward", "attention_varlen_backward", "softmax", "softmax_row", "softmax_online", "softmax_split"]
