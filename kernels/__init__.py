"""Production Triton kernels and the kernel registry."""
from ._runtime import DEVICE, INTERPRET  # first: switches on the interpreter when there is no GPU
from .registry import REGISTRY, KernelSpec, get, kernels, register
from .attention import attention
from .softmax import softmax, softmax_online, softmax_row, softmax_split
from . import specs  # noqa: F401  (registers the production kernels)

__all__ = ["DEVICE", "INTERPRET", "REGISTRY", "KernelSpec", "get", "kernels", "register",
           "attention", "softmax", "softmax_row", "softmax_online", "softmax_split"]
