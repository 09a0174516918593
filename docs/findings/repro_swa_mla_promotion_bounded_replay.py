"""Repro: promoting a SlidingWindowMLASpec for --disable-hybrid-kv-cache-manager raises TypeError (vLLM 0.33.0).

unify_hybrid_kv_cache_specs (vllm/v1/core/kv_cache_planning.py) rebuilds every sliding-window MLA spec as an
MLAAttentionSpec with replace_as(..., drop=("extra_retained_tokens",)). replace_as passes every other field of
the source, and SlidingWindowMLASpec's bounded_replay (vllm-project/vllm#56227) is not a field of
MLAAttentionSpec: the promotion raises instead of allocating the window as full attention. DeepSeek V4's
DeepseekV4SWACache is the user (a SlidingWindowMLASpec beside MLA full specs); a KV connector without HMA
support turns the hybrid manager off by default.

CPU only: vllm + torch. Exits 1 while the bug is present, 0 once the promotion succeeds.
"""

import sys

import torch
from vllm.v1.core.kv_cache_planning import unify_hybrid_kv_cache_specs
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec

specs = {
    "model.layers.0.attn": MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16),
    "model.layers.0.attn.swa_cache": SlidingWindowMLASpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, sliding_window=128),
}
try:
    unify_hybrid_kv_cache_specs(specs)
except TypeError as exc:
    print(f"unify_hybrid_kv_cache_specs raised TypeError: {exc}")
    sys.exit(1)
print("promoted:", {name: type(spec).__name__ for name, spec in specs.items()})
