"""The full GPU path: the REAL vLLM engine on a CUDA GPU, recorded and checked byte by byte.

``python -m gpu_impl.cuda`` (or ``bash scripts/gpu_check.sh``) runs every scenario
(``scenarios.SCENARIOS``) under both model runners (``VLLM_USE_V2_MODEL_RUNNER=0/1``),
each in its own process: ``vllm.LLM`` on a tiny dummy-weight model with the
``CheckingConnector`` (``connector``), which records what ``register_kv_caches`` got and,
in ``save_kv_layer``, reads written K/V back through the registered view and as raw
pool bytes at the reference's addresses (``datacheck``, ``addresses``). ``summary``
diffs each recording against ``reference.derive.derive(case, runner)`` and the two
runners against each other.

Modules that need neither vLLM nor torch: ``addresses``, ``models``, ``scenarios``,
``summary``, ``cli`` (torch only once a GPU was found). ``datacheck`` needs torch;
``connector`` and ``run_one`` need vLLM. Importing this package imports none of them.
"""
