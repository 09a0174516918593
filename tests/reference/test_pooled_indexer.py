"""GLM-5-next's pooled indexer cache (``Glm5NextIndexerCache``): kind ``mla_indexer`` with
``index_kpool``, an indexer ``MLAAttentionSpec`` storing one state per kpool tokens
(``tokens_per_state``), on a backend whose kernel pages are counted in states."""

from __future__ import annotations

import dataclasses

import pytest

from reference import backends as bk
from reference.config import LAYER_OWN_BACKENDS, LayerConfig, indexer_k_cache_bytes
from reference.derive import derive, raw_spec
from reference.errors import ConfigError, StartupError
from suites.named_cases import CASES

INDEXER = "model.layers.0.self_attn.indexer.k_cache"


def _indexer_spec(kpool: int | None):
    case = CASES["glm5next-caches-b128"]
    layer = dataclasses.replace(next(l for l in case.layers if l.name == INDEXER), index_kpool=kpool)
    return raw_spec(case, layer, bk.get_backend(layer.backend))


@pytest.mark.parametrize(("kpool", "states", "page"), [(None, 128, 128 * 132), (4, 32, 32 * 132), (8, 16, 16 * 132)])
def test_a_block_holds_one_state_per_kpool_tokens(kpool: int | None, states: int, page: int) -> None:
    spec = _indexer_spec(kpool)
    assert (spec.tokens_per_state, spec.num_states, spec.page_size_bytes) == (kpool or 1, states, page)


@pytest.mark.parametrize(("kpool", "capability", "sizes"), [
    (None, (9, 0), (64,)),  # DeepSeek V3.2's own: 64 tokens
    (4, (9, 0), (128, 256)),  # 32 or 64 states of 4 tokens
    (8, (10, 0), (256, 512)),
    (4, (12, 0), (256,)),  # SM120: 64-state pages only
])
def test_kernel_pages_are_counted_in_states(kpool: int | None, capability: tuple[int, int], sizes: tuple[int, ...]) -> None:
    backend = bk.get_backend(LAYER_OWN_BACKENDS["mla_indexer"][0])
    assert backend.supported_kernel_block_sizes(_indexer_spec(kpool), capability) == sizes


def test_the_indexer_view_holds_states_not_tokens() -> None:
    view = derive(CASES["glm5next-caches-b128"]).registered[INDEXER]
    assert view.shape[-2:] == (32, 132)


def test_a_block_smaller_than_the_smallest_kernel_page_is_refused() -> None:
    with pytest.raises(StartupError, match="No common block size for 64"):
        derive(CASES["glm5next-caches-b64-refused"])


@pytest.mark.parametrize(("kind", "kpool", "message"), [
    ("mla_indexer", 1, "needs index_kpool >= 2"),
    ("full", 4, "index_kpool 4 is only for kinds 'circular_buffer', 'mla_indexer', 'qsa_compressed_key', 'qsa_key_state', "
              "'dsv4_attention', 'dsv4_indexer', 'dsv4_compressor_state', not 'full'"),
])
def test_index_kpool_is_validated(kind: str, kpool: int, message: str) -> None:
    backend = LAYER_OWN_BACKENDS["mla_indexer"][0] if kind == "mla_indexer" else "FLASH_ATTN"
    with pytest.raises(ConfigError, match=message):
        LayerConfig("x", kind=kind, backend=backend, head_size=indexer_k_cache_bytes(128), index_kpool=kpool)
