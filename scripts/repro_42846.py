"""Reproduce vLLM #42846 with vLLM's own runner code, on CPU, in a release venv.

    "$(bash scripts/release_env.sh 0.21.0 | tail -n 1)/bin/python" scripts/repro_42846.py

FlashInfer at block 128 (kernel blocks of 64), 2 layers of 8 KV heads x 128, bf16, 10
blocks. vLLM's own planning (``kv_cache_utils.get_kv_cache_groups``,
``get_kv_cache_config_from_groups``), kernel block sizes (``prepare_kernel_block_sizes``),
MRv1's ``GPUModelRunner._allocate_kv_cache_tensors`` / ``_reshape_kv_cache_tensors`` (on a
stand-in ``self``) and MRv2's ``gpu/attn_utils._allocate_kv_cache`` / ``_reshape_kv_cache``,
on meta tensors. The specs are built here from the configuration, not by the layers.

Seen (2026-12-01): on 0.21.0 MRv1 registers (20, 2, 64, 8, 128) and MRv2 (10, 2, 128, 8, 128)
(the bug); on 0.22.0 both register (20, 2, 64, 8, 128). A probe for the generation-1
drivers of issue 12, not a driver: kvconform's drivers do not run this.
"""
import inspect
from types import SimpleNamespace
from gpu_impl.vllm_cpu import shims
shims.prepare_env()
import torch, vllm
try:
    shims.apply()
except Exception as exc:
    print("shims:", type(exc).__name__, exc)
from vllm.config import VllmConfig, CacheConfig, DeviceConfig, set_current_vllm_config
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.core import kv_cache_utils as kcu
from vllm.v1.worker.utils import AttentionGroup, prepare_kernel_block_sizes
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu import attn_utils
from vllm.v1.attention.backends.registry import AttentionBackendEnum

B, H, D, N = 128, 8, 128, 10
vc = VllmConfig(device_config=DeviceConfig(device="cpu"), cache_config=CacheConfig(block_size=B))
ctx = set_current_vllm_config(vc)
ctx.__enter__()  # 0.22 reads the current config while reshaping
names = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
spec = FullAttentionSpec(block_size=B, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
specs = {n: spec for n in names}
groups = kcu.get_kv_cache_groups(vc, specs)
kcc = kcu.get_kv_cache_config_from_groups(vc, groups, N * spec.page_size_bytes * len(names))
print("num_blocks", kcc.num_blocks, [ (t.size, t.shared_by) for t in kcc.kv_cache_tensors])
backend = AttentionBackendEnum["FLASHINFER"].get_class()
attn_groups = [[AttentionGroup(backend, list(g.layer_names), g.kv_cache_spec, gid)] for gid, g in enumerate(kcc.kv_cache_groups)]
kbs = prepare_kernel_block_sizes(kcc, attn_groups)
print("kernel_block_sizes", kbs)
me = SimpleNamespace(device=torch.device("meta"), runner_only_attn_layers=set(), attn_groups=attn_groups,
                     kv_cache_config=kcc, cache_config=SimpleNamespace(cache_dtype="auto"))
me._kv_cache_spec_attn_group_iterator = lambda: GPUModelRunner._kv_cache_spec_attn_group_iterator(me)
me._update_hybrid_attention_mamba_layout = lambda *a: GPUModelRunner._update_hybrid_attention_mamba_layout(me, *a)
raw = GPUModelRunner._allocate_kv_cache_tensors(me, kcc)
v1 = GPUModelRunner._reshape_kv_cache_tensors(me, raw, kbs)
for n, t in v1.items():
    print("MRv1", n, tuple(t.shape), t.stride()); break
sig = inspect.signature(attn_utils._reshape_kv_cache)
params = list(inspect.signature(attn_utils._allocate_kv_cache).parameters)
raw2 = attn_utils._allocate_kv_cache(kcc, torch.device("meta")) if len(params) == 2 else attn_utils._allocate_kv_cache(kcc, {}, torch.device("meta"))
args = dict(kv_cache_config=kcc, kv_cache_raw_tensors=raw2, attn_backends={n: backend for n in names}, cache_dtype="auto")
if "kernel_block_sizes" in sig.parameters: args["kernel_block_sizes"] = kbs
if "shared_kv_cache_layers" in sig.parameters: args["shared_kv_cache_layers"] = {}
v2 = attn_utils._reshape_kv_cache(**{k: v for k, v in args.items() if k in sig.parameters})
for n, t in v2.items():
    print("MRv2", n, tuple(t.shape), t.stride()); break
