"""kvconform's reference model: an independent, pure-Python model of vLLM's KV-cache layout.

Never imports vLLM, torch or flashinfer: everything here is plain Python so the
reference starts fast and can be diffed against the real implementation.
"""

from reference.errors import ConfigError, NotModeledError, ReferenceError_, StartupError

__all__ = ["ConfigError", "NotModeledError", "ReferenceError_", "StartupError"]
