"""Data types by name, without torch.

Mirrors ``vllm/utils/torch_utils.py`` ``STR_DTYPE_TO_TORCH_DTYPE`` and
``vllm/v1/kv_cache_interface.py`` ``get_kv_quant_mode`` (the target release).
"""

from __future__ import annotations

from reference.errors import ConfigError

DTYPE_SIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}

MODEL_DTYPES = ("float16", "bfloat16", "float32")

_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16"}
MODEL_DTYPE_NAMES = MODEL_DTYPES + tuple(_ALIASES)
"""Every model dtype a case may name (the aliases included)."""

# Cache dtype name -> storage dtype (None: the model dtype).
_CACHE_STORAGE: dict[str, str | None] = {
    "auto": None,
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "fp8": "uint8",
    "fp8_e4m3": "uint8",
    "fp8_e5m2": "uint8",
    "fp8_inc": "float8_e4m3fn",
    "fp8_ds_mla": "uint8",
    "nvfp4": "uint8",
    "nvfp4_4over6": "uint8",
    "nvfp4_ds_mla": "uint8",
    "int8_per_token_head": "int8",
    "fp8_per_token_head": "uint8",
    "int4_per_token_head": "uint8",
}

CACHE_DTYPES = tuple(_CACHE_STORAGE)


def canonical_model_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; raises ConfigError for anything not a model dtype."""
    name = _ALIASES.get(name, name)
    if name not in MODEL_DTYPES:
        raise ConfigError(f"model dtype {name!r} is not one of {', '.join(MODEL_DTYPES)}")
    return name


def storage_dtype(cache_dtype: str, model_dtype: str) -> str:
    """The dtype vLLM allocates the KV cache in (fp8 caches are stored as uint8)."""
    if cache_dtype not in _CACHE_STORAGE:
        raise ConfigError(
            f"cache dtype {cache_dtype!r} is not one of {', '.join(CACHE_DTYPES)}"
        )
    return _CACHE_STORAGE[cache_dtype] or canonical_model_dtype(model_dtype)


def quant_mode(cache_dtype: str) -> str:
    """vLLM's ``KVQuantMode`` name for a cache dtype string (order of checks as upstream)."""
    if cache_dtype.endswith("_per_token_head"):
        return cache_dtype.upper()
    if cache_dtype == "nvfp4_ds_mla":
        return "NVFP4_DS_MLA"
    if cache_dtype.startswith("nvfp4"):
        return "NVFP4"
    if cache_dtype.startswith("fp8"):
        return "FP8_PER_TENSOR"
    return "NONE"


def dtype_size(dtype: str) -> int:
    try:
        return DTYPE_SIZE[dtype]
    except KeyError:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_SIZE)}") from None
