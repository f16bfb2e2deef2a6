"""Triton's interpreter made exact and GPU-like: the bf16 patch (`exact`), the helpers every patch
shares (`patching`), autotuned kernels (`autotune`), out-of-bounds accesses (`bounds`), the GPU's
behaviour where the two differ (`gpu`) and speed (`speed`). docs/interpreter.md says why each exists."""
