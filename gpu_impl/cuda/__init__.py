"""The full GPU path's drivers: the REAL vLLM engine on a CUDA GPU, observed.

``python -m conformance.gpu_check`` (or ``bash scripts/gpu_check.sh``) runs every scenario
(``scenarios.SCENARIOS``) under both model runners (``VLLM_USE_V2_MODEL_RUNNER=0/1``),
each in its own process (``run_one``): ``vllm.LLM`` on a tiny dummy-weight model with the
``CheckingConnector`` (``connector``), which records what ``register_kv_caches`` got and,
in ``save_kv_layer``, where vLLM's registered and bound views put each written token and
whether it was written (``datacheck``). The verdicts (``conformance.gpu_verdict``) compare
the recordings with the reference; nothing here predicts anything.

Modules that need neither vLLM nor torch: ``models``, ``scenarios``. ``datacheck`` needs
torch; ``connector`` and ``run_one`` need vLLM. Importing this package imports none of them.
"""
