"""Repro: DeepSeek V4 at --block-size 48 crashes KV cache planning with ZeroDivisionError (vLLM 0.33.0).

DeepseekV4Attention's compressed cache of an HCA layer stores one 584-byte record per 128 tokens
(MLAAttentionSpec tokens_per_state=128, alignment 576). The runners' customize_attention_spec gives it
block_stride_alignment = MultipleOf(256) (FlashMLA's only kernel block), and get_block_stride_alignment is then
the page of gcd(256, block_size) tokens: 16 tokens at --block-size 48, which hold no 128-token state, so the
alignment is a page of 0 bytes. _get_kv_cache_bytes_per_block rounds the block up to the lcm of every layer's
alignment, 0: ZeroDivisionError instead of a refusal naming the block size (vLLM's own kernel-block check
would refuse 48 a step later: "No common block size for 48").

CPU only: vllm + torch. Exits 1 while the crash is present, 0 once planning gets past it.
"""

import sys

import torch
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.kv_cache_interface import MLAAttentionSpec

spec = MLAAttentionSpec(
    block_size=48, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=torch.uint8, tokens_per_state=128,
    cache_dtype_str="fp8_ds_mla", alignment=576, model_version="deepseek_v4", state_content_bytes=584,
    block_stride_alignment=MultipleOf(256),  # what customize_attention_spec sets for FLASHMLA_SPARSE_DSV4's [256]
)
print(f"page {spec.page_size_bytes} bytes; block-stride alignment {spec.get_block_stride_alignment()} bytes")
from vllm.v1.attention.backends.utils import KVCacheLayout
from vllm.v1.core.kv_cache_planning import _get_kv_cache_bytes_per_block
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowMLASpec

# The HCA layer's compressed cache beside its 64-token SWA cache (another page size: a packed BLHNC block).
swa = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=torch.uint8,
                           sliding_window=128, cache_dtype_str="fp8_ds_mla", alignment=576,
                           model_version="deepseek_v4", state_content_bytes=584)
groups = [KVCacheGroupSpec(["model.layers.0.self_attn.swa_cache"], swa),
          KVCacheGroupSpec(["model.layers.0.self_attn"], spec)]
try:
    print("bytes per block:", _get_kv_cache_bytes_per_block(groups, KVCacheLayout.BLHNC))
except ZeroDivisionError as exc:
    print(f"_get_kv_cache_bytes_per_block raised ZeroDivisionError: {exc}")
    sys.exit(1)
