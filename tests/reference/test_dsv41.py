"""DeepSeek V4.1's caches in the reference (``models/deepseek_v41``): family ``deepseek_v41`` on DeepSeek V4's kinds,
each decoder layer's caches as its ``DeepseekV4Attention`` registers them on FlashMLA.

What the classes build is checked against vLLM in ``tests/vllm`` (the named cases, the sampler's ``dsv41`` family and
the mutation ``dsv41-swa-v4-block``); here, without vLLM: the case's validation, the specs, pages and block strides
the reference predicts per capability and runner, and its refusals.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import DSV41_ATTENTION_BACKEND, CaseConfig
from reference.derive import derive, dsv41_compressor_ring
from reference.errors import ConfigError, StartupError
from reference.specs import SpecKind
from suites.named_cases import CASES, deepseek_v41_caches

SOURCE = "model.layers.0.attn"


def _case(decoder_layers=((2, True), (0, False)), **options) -> CaseConfig:
    options.setdefault("attention_backend", DSV41_ATTENTION_BACKEND)
    return CaseConfig("dsv41-test", deepseek_v41_caches(decoder_layers), block_size=options.pop("block_size", 64),
                      num_blocks=8, **options)


@pytest.mark.parametrize(("capability", "block_size", "record", "alignment"), [((9, 0), 64, 584, 576),
                                                                              ((10, 0), 128, 528, 512)])
def test_the_record_and_its_pages_follow_the_capability(capability, block_size, record, alignment) -> None:
    d = derive(_case(capability=capability, block_size=block_size), "mrv2")
    attention, indexer, swa, ring = (d.specs[SOURCE + suffix] for suffix in
                                     ("", ".indexer.k_cache", ".swa_cache", ".compressor.state_cache"))
    # One record per 2 tokens (ratio 2), each page rounded up to the record's alignment.
    assert (attention.kind, attention.tokens_per_state, attention.state_content_size_bytes) == (SpecKind.MLA, 2, record)
    assert attention.page_size_bytes == -(-block_size // 2 * record // alignment) * alignment
    assert indexer.page_size_bytes == -(-block_size // 2 * 132 // alignment) * alignment
    # The SWA cache keeps 32-token blocks of its own; on SM10x its block stride holds whole records.
    assert (swa.block_size, swa.state_content_size_bytes, swa.max_tp_shards) == (32, record, 1)
    assert swa.get_block_stride_alignment() == (record if capability[0] == 10 else 1)
    # The ratio-2 compressor's ring: 8 fp32 rows of [kv, score] (no drafts counted), no slot mapping.
    assert ring.kind is SpecKind.CIRCULAR_BUFFER and not ring.uses_slot_mapping
    assert (ring.block_size, ring.page_size_bytes) == (8, 8 * 1024 * 4)
    # Every block stride of the packed pool is a multiple of every alignment its specs declare.
    for tensor in d.plan.tensors:
        assert tensor.block_stride % swa.get_block_stride_alignment() == 0


def test_bounded_replay_keeps_the_window_out_of_prefix_caching_on_mrv2_only() -> None:
    mrv1, mrv2 = (derive(_case(), runner) for runner in ("mrv1", "mrv2"))
    assert not mrv1.specs[SOURCE + ".swa_cache"].bounded_replay and mrv1.specs[SOURCE + ".swa_cache"].prefix_cacheable
    assert mrv2.specs[SOURCE + ".swa_cache"].bounded_replay and not mrv2.specs[SOURCE + ".swa_cache"].prefix_cacheable
    # So MRv2 caches prefixes in the compressed caches' 64-token blocks, MRv1 in the SWA's 32.
    assert (mrv1.cache_block_size, mrv2.cache_block_size) == (32, 64)


def test_the_ring_grows_with_the_drafts_as_a_power_of_two() -> None:
    assert [dsv41_compressor_ring(k) for k in (0, 3, 6, 7, 14, 15)] == [8, 8, 8, 16, 16, 32]


def test_a_layer_owning_only_its_swa_cache_registers_nothing_else() -> None:
    d = derive(_case(((1, True), (0, False))), "mrv2")
    assert [name for name in d.specs if name.startswith("model.layers.1.")] == ["model.layers.1.attn.swa_cache"]


@pytest.mark.parametrize(("options", "message"), [
    ({"block_size": 128}, "FLASHMLA_SPARSE_DSV41 needs 64-token kernel blocks"),
    ({"block_size": 32}, "No common block size for 32"),
    ({"layout": "LBHNC"}, "VLLM_KV_CACHE_LAYOUT=LBHNC does not satisfy every supported set"),
    ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2},
     "DCP with sparse indexer KV compression (compress_ratio=2)"),
])
def test_what_vllm_refuses(options, message) -> None:
    with pytest.raises(StartupError) as refused:
        derive(_case(**options), "mrv2")
    assert message in str(refused.value)


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: replace(c, attention_backend=None), "attention_backend None must be 'FLASHMLA_SPARSE_DSV41'"),
    (lambda c: replace(c, layers=c.layers[1:]), "belong to a kv source; list its compressed cache"),
    (lambda c: replace(c, layers=c.layers[:3] + c.layers[4:]), "a DeepSeek V4.1 decoder layer of compress ratio 2 registers"),
    (lambda c: replace(c, layers=c.layers[4:] + c.layers[:4]), "builds its decoder layers in order"),
    (lambda c: replace(c, layers=(replace(c.layers[0], index_kpool=4),) + c.layers[1:]), "one of 1, 2; got 4"),
    (lambda c: replace(c, layers=(replace(c.layers[0], cache_dtype="fp8"),) + c.layers[1:]), "modeled in the fp8_ds_mla"),
    (lambda c: replace(c, layers=(replace(c.layers[0], name="model.layers.0.self_attn"),) + c.layers[1:]),
     "'{...}.layers.{i}.attn' (one layer index in the name)"),
    (lambda c: replace(c, layers=tuple(l for l in c.layers if l.kind != "dsv4_indexer")),
     "reads the index of the latest index source at or below it"),
    (lambda c: replace(c, layers=c.layers + CASES["dsv4-caches-b256"].layers[:1]), "lists only its decoder layers' caches"),
])
def test_what_a_v41_case_must_describe(change, message) -> None:
    with pytest.raises(ConfigError) as invalid:
        change(_case())
    assert message in str(invalid.value)


def test_the_named_cases_start_where_vllm_does() -> None:
    for name, started in (("dsv41-caches-b64", True), ("dsv41-mxfp8-sm100-b128", True), ("dsv41-b128-sm90-refused", False)):
        for runner in ("mrv1", "mrv2"):
            if started:
                derive(CASES[name], runner)
            else:
                with pytest.raises(StartupError):
                    derive(CASES[name], runner)


def test_a_packed_compressed_cache_mapped_to_kernel_blocks_is_not_modeled_yet() -> None:
    """One ratio-2 kv source at --block-size 256 on SM100: its group holds only compressed caches, whose 256-token
    blocks vLLM 0.33 maps onto FlashMLA's 128-token kernel blocks through a strided view
    (``AttentionGroup.map_kv_cache_to_kernel_blocks``); the reference says so rather than guessing. Beside a ratio-1
    layer (a cache of one state per token) the same block size is refused, as vLLM refuses it."""
    from reference.errors import NotModeledError

    with pytest.raises(NotModeledError, match="map_kv_cache_to_kernel_blocks"):
        derive(_case(((2, True),), capability=(10, 0), block_size=256), "mrv2")
    with pytest.raises(StartupError, match="needs 128-token kernel blocks"):
        derive(_case(((1, True), (2, True)), capability=(10, 0), block_size=256), "mrv2")
