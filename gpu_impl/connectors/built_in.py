"""The connectors vLLM ships, as ``kvconform check --all`` sees them: the ones a built-in
adapter drives (and which adapter), and the ones it lists without driving, with why.
"""

BUILT_IN: dict[str, str] = {
    "NixlConnector": "gpu_impl.connectors.nixl:NixlAdapter",
    "MooncakeConnector": "gpu_impl.connectors.mooncake:MooncakeAdapter",
    "MooncakeStoreConnector": "gpu_impl.connectors.mooncake_store:MooncakeStoreAdapter",
    "OffloadingConnector": "gpu_impl.connectors.offloading:OffloadingAdapter",
    "SimpleCPUOffloadConnector": "gpu_impl.connectors.simple_cpu_offload:SimpleCPUOffloadAdapter",
    "UMBPStoreConnector": "gpu_impl.connectors.umbp:UMBPAdapter",
    "HF3FSKVConnector": "gpu_impl.connectors.hf3fs:HF3FSAdapter",
    "MoRIIOConnector": "gpu_impl.connectors.moriio:MoRIIOAdapter",
    "DecodeBenchConnector": "gpu_impl.connectors.decode_bench:DecodeBenchAdapter",
    "LMCacheMPConnector": "gpu_impl.connectors.lmcache_mp:LMCacheMPAdapter",
}
"""vLLM connector class -> the adapter that drives it (``kvconform check --all``)."""

NOT_DRIVEN: dict[str, str] = {
    "MultiConnector": "passes the same kv_caches dict to every child connector (multi_connector.py register_kv_caches); "
                      "each child is checked on its own",
    "FlexKVConnectorV1": "register_kv_caches hands the tensors to the external flexkv package (flexkv_connector.py), "
                         "which is not served for this machine; nothing in vLLM interprets them",
    "LMCacheConnectorV1": "register_kv_caches forwards to the LMCache engine (lmcache_connector.py); the layout is read "
                          "by the external lmcache package, checked through LMCacheMPConnector where lmcache is installed",
    "HiSparseConnector": "ignores the kv_caches dict: it takes HiSparseCacheHandles from the forward context "
                         "(hisparse/worker.py), which need HiSparse attention layers",
    "ExampleConnector": "does not use register_kv_caches: it reads the layers' bound kv_cache from the forward "
                        "context (example_connector.py); an example, not a shipped transfer path",
    "NixlPushConnector": "the push variant of NIXL (nixl/push_worker.py) shares NixlConnector's registration "
                         "(base_worker.py register_kv_caches), which is checked",
    "ExampleHiddenStatesConnector": "caches hidden states of a CacheOnlyAttentionLayer, not the KV cache of the case's layers",
}
"""Connectors vLLM ships that ``kvconform check --all`` lists without driving, and why."""


__all__ = ["BUILT_IN", "NOT_DRIVEN"]
