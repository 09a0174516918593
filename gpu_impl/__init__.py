"""Drivers of the real implementations kvconform diffs against the reference model.

Nothing here imports vLLM, torch or flashinfer at import time: each driver is a
subpackage (``gpu_impl.vllm_cpu``: the target release on a CPU-only machine) whose heavy
imports happen on first use, so importing the project stays fast and works
where vLLM is not installed.
"""

__all__ = ["vllm_cpu"]
