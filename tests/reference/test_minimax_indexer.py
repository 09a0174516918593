"""MiniMax M3's lightning-indexer side cache (``MiniMaxM3IndexerCache``): kind ``minimax_indexer``,
an indexer ``MLAAttentionSpec`` of one key-only vector per token, bf16 or fp8 e4m3, on its own
``MINIMAX_M3_SPARSE_INDEXER`` backend (128-token kernel pages)."""

from __future__ import annotations

import pytest

from reference import backends as bk
from reference.config import LAYER_OWN_BACKENDS, LayerConfig
from reference.derive import derive, raw_spec
from reference.errors import ConfigError, StartupError
from suites.named_cases import CASES

INDEX_CACHE = "model.layers.0.self_attn.attn.index_cache"


def _spec(case_name: str):
    case = CASES[case_name]
    layer = next(l for l in case.layers if l.name == INDEX_CACHE)
    return raw_spec(case, layer, bk.get_backend(layer.backend))


@pytest.mark.parametrize(("case_name", "dtype", "page"), [
    ("minimax-m3-indexer-b128", "bfloat16", 128 * 128 * 2),
    ("minimax-m3-indexer-fp8-b256", "float8_e4m3fn", 256 * 128),
])
def test_one_key_vector_per_token_in_its_own_dtype(case_name: str, dtype: str, page: int) -> None:
    spec = _spec(case_name)
    assert (spec.num_kv_heads, spec.head_size_v, spec.dtype, spec.cache_role) == (1, 0, dtype, "indexer")
    assert spec.page_size_bytes == page


def test_its_pages_share_the_attention_block() -> None:
    """An MLAAttentionSpec is a FullAttentionSpec: one uniform-type group holds both pages."""
    d = derive(CASES["minimax-m3-indexer-b128"])
    (group,) = d.groups
    assert group.spec.page_size_bytes == 2 * (128 * 4 * 128 * 2 * 2) + 2 * (128 * 128 * 2)
    assert d.registered[INDEX_CACHE].shape[-2:] == (128, 128)


@pytest.mark.parametrize(("case_name", "message"), [
    ("minimax-m3-indexer-b64-refused", "No common block size for 64"),
    ("minimax-m3-indexer-flashinfer-refused", "No common block size for 128"),
])
def test_its_128_token_kernel_pages_refuse_what_cannot_hold_them(case_name: str, message: str) -> None:
    with pytest.raises(StartupError, match=message):
        derive(CASES[case_name])


def test_an_index_cache_dtype_it_does_not_store_is_invalid() -> None:
    with pytest.raises(ConfigError, match="kind 'minimax_indexer' cache_dtype 'fp8_e5m2' must be one of auto, fp8, fp8_e4m3"):
        LayerConfig("x", kind="minimax_indexer", backend=LAYER_OWN_BACKENDS["minimax_indexer"][0], head_size=128,
                    cache_dtype="fp8_e5m2")
