"""Drive the real vLLM KV-cache layout code (the target release) on a CPU-only machine.

- ``shims``: the process-global CPU shim set (env vars before ``import vllm``,
  platform patches, backend import shims); ``applied_shims()`` lists them.
- ``planning``: ``observe(case, runner)``, which runs vLLM's own spec, layout,
  grouping, placement, kernel-block and allocation code for a reference
  ``CaseConfig`` and returns plain data comparable with ``reference.derive``.

Importing this package does not import vLLM; ``planning.observe`` does, lazily.
"""

__all__ = ["planning", "shims"]
