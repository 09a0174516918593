"""Mutation meta-tests: the diff engine catches each kind of layout bug in vLLM's own code.

Each test runs the real vLLM 0.33.0 pipeline (``gpu_impl.vllm_cpu.planning.observe``)
with ONE vLLM function replaced by a plausible wrong variant (pytest ``monkeypatch``,
restored after), and asserts that ``conformance.diff`` reports exactly the documented
set of divergence kinds: the intended kind plus the consequences a real bug of that
shape would have (e.g. no kernel split also changes the registered shape). The same
case unpatched must compare clean, before and after, so a mutation test can only pass
because of the mutation.

Patches go where the driver looks the function up: ``planning.py`` imports
``vllm.v1.worker.utils`` / ``vllm.v1.attention.backends.utils`` names inside ``_run`` at
call time and calls ``kv_cache_planning`` functions as module attributes, and vLLM's own
callers resolve module globals at call time, so replacing the module attribute reaches
every caller. ``create_kv_cache_views`` is from-imported into ``vllm.v1.worker.utils``
(``allocate_kv_cache`` calls that binding) and ``compute_layout_strides`` is called by
``create_kv_cache_views`` through ``vllm.v1.kv_cache_interface``; each is patched there.

Slot-mapping and block-table mutations live elsewhere.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from conformance.diff import KINDS, SCHEDULE_ONLY_KINDS, Comparison, compare, compare_runners, kinds_of
from conformance.expectations import RUN_KINDS, Environment, case_facts, classify, load
from gpu_impl.vllm_cpu.planning import observe
from reference.backends import VLLM_VERSION
from reference.config import CaseConfig
from suites.named_cases import CASES as NAMED_CASES
from vllm_cases import CASES as VLLM_CASES

_ALL_CASES: dict[str, CaseConfig] = {**{c.name: c for c in VLLM_CASES}, **NAMED_CASES}


def _case(name: str) -> CaseConfig:
    return _ALL_CASES[name]


def _explain(comparison: Comparison) -> str:
    lines = [f"{comparison.case.name} [{comparison.runner}] {comparison.status} {comparison.detail}".rstrip()]
    lines += [f"  - {d.message}" for d in comparison.divergences]
    return "\n".join(lines)


# --- the wrong variants ------------------------------------------------------------------------
# Each factory takes the original function and returns the replacement.


def _no_kernel_split(original: Callable) -> Callable:
    """``select_common_block_size`` that never splits: the manager block size for everyone."""

    def select_common_block_size(kv_manager_block_size, backends, kv_cache_specs=None):
        return kv_manager_block_size

    return select_common_block_size


def _builder_ignores_kernel_size(drafts_only: bool) -> Callable[[Callable], Callable]:
    """``create_metadata_builders``' per-backend select that ignores the split it is given.

    The builder pass calls ``select_common_block_size(kernel_block_size, [backend], [spec])``
    with an already split size (below ``spec.block_size``); ``prepare_kernel_block_sizes``
    calls it with the manager size. Only the former is broken, for draft specs only when
    ``drafts_only`` (the drafter builds its own attention groups).
    """

    def factory(original: Callable) -> Callable:
        def select_common_block_size(kv_manager_block_size, backends, kv_cache_specs=None):
            specs = list(kv_cache_specs or [])
            builder_pass = len(specs) == 1 and specs[0] is not None and kv_manager_block_size < specs[0].block_size
            if builder_pass and (not drafts_only or specs[0].is_draft):
                return specs[0].block_size
            return original(kv_manager_block_size, backends, kv_cache_specs)

        return select_common_block_size

    return factory


def _strides_with_h_and_n_swapped(original: Callable) -> Callable:
    """``compute_layout_strides`` reading the layout with H and N swapped (an NHD/HND mix-up)."""

    def compute_layout_strides(spec, num_blocks, num_layers, layout, kernel_block_size=None, fixed_strides=(None,) * 5):
        swapped = tuple({2: 3, 3: 2}.get(axis, axis) for axis in layout.stride_order)
        wrong = SimpleNamespace(stride_order=swapped, name=layout.name)
        return original(spec, num_blocks, num_layers, wrong, kernel_block_size, fixed_strides)

    return compute_layout_strides


def _views_off_by_one(original: Callable) -> Callable:
    """``create_kv_cache_views`` whose views start one element past the tensor offset."""

    def create_kv_cache_views(*args, **kwargs):
        return [v.as_strided(v.shape, v.stride(), v.storage_offset() + 1) for v in original(*args, **kwargs)]

    return create_kv_cache_views


def _views_as_float16(original: Callable) -> Callable:
    """``create_kv_cache_views`` viewing a bf16 cache as fp16 (torch's default half dtype)."""
    import torch

    def create_kv_cache_views(*args, **kwargs):
        views = original(*args, **kwargs)
        return [v.view(torch.float16) if v.dtype == torch.bfloat16 else v for v in views]

    return create_kv_cache_views


def _views_half_content(original: Callable) -> Callable:
    """``create_kv_cache_views`` whose views keep only the first half of each token's content
    (a head size taken from the wrong spec): the pages hold more than the views show."""

    def create_kv_cache_views(*args, **kwargs):
        out = []
        for v in original(*args, **kwargs):
            shape = (*v.shape[:-1], max(1, v.shape[-1] // 2))
            out.append(v.as_strided(shape, v.stride(), v.storage_offset()))
        return out

    return create_kv_cache_views


def _bound_to_transposed_views(original: Callable) -> Callable:
    """``map_kv_caches_to_kernel_blocks`` binding each layer to its cache with heads and tokens
    swapped in the strides: the same bytes and shape, another token at each index."""

    def map_kv_caches_to_kernel_blocks(kv_caches, attn_groups):
        out = {}
        for name, cache in original(kv_caches, attn_groups).items():
            if cache.dim() == 4 and cache.shape[1] == cache.shape[2] == 1:
                out[name] = cache
                continue
            stride = list(cache.stride())
            if cache.dim() == 4:
                stride[1], stride[2] = stride[2], stride[1]
            out[name] = cache.as_strided(cache.shape, stride, cache.storage_offset())
        return out

    return map_kv_caches_to_kernel_blocks


def _pool_bytes_summed_over_groups(original: Callable) -> Callable:
    """``_pool_bytes_per_block`` summing every group's bytes (the groups alias: it is the max)."""

    def _pool_bytes_per_block(vllm_config, kv_cache_groups):
        return sum(original(vllm_config, [group]) for group in kv_cache_groups)

    return _pool_bytes_per_block


def _layer_outer_offsets_by_page(original: Callable) -> Callable:
    """``get_kv_cache_config_from_groups`` advancing a layer-outer tensor's offset by pages.

    The right advance is ``len(layers) * layer_stride`` (each layer owns a region of
    ``num_blocks`` pages); this variant uses the block-outer rule, ``len(layers) * page``,
    so the next tensor of the group starts inside the previous one's region.
    """
    from vllm.v1.core.kv_cache_planning import _get_per_layer_spec

    def get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory):
        config = original(vllm_config, kv_cache_groups, available_memory)
        next_offset: dict[int, int] = {}
        tensors = []
        for tensor in config.kv_cache_tensors:
            gid = next(i for i, g in enumerate(kv_cache_groups) if tensor.layers[0] in g.layer_names)
            spec = _get_per_layer_spec(kv_cache_groups[gid], tensor.layers[0])
            offset = next_offset.get(gid, 0)
            tensors.append(dataclasses.replace(tensor, offset=offset))
            next_offset[gid] = offset + len(tensor.layers) * spec.page_size_bytes
        config.kv_cache_tensors = tensors
        return config

    return get_kv_cache_config_from_groups


def _backing_one_block_larger(original: Callable) -> Callable:
    """``get_kv_cache_config_from_groups`` sizing the backing allocation one block too large."""
    from vllm.v1.core.kv_cache_planning import _get_kv_cache_bytes_per_block

    def get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory):
        config = original(vllm_config, kv_cache_groups, available_memory)
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        extra = _get_kv_cache_bytes_per_block(kv_cache_groups, layout)
        config.kv_cache_tensors = [dataclasses.replace(t, size=t.size + extra) for t in config.kv_cache_tensors]
        return config

    return get_kv_cache_config_from_groups


def _override_minus_one(original: Callable) -> Callable:
    """``may_override_num_blocks`` taking the null block out of ``num_gpu_blocks_override``."""

    def may_override_num_blocks(vllm_config, num_blocks):
        override = vllm_config.cache_config.num_gpu_blocks_override
        return num_blocks if override is None else override - 1

    return may_override_num_blocks


def _groups_reversed(original: Callable) -> Callable:
    """``get_kv_cache_groups_from_builder`` returning the groups in reverse order."""

    def get_kv_cache_groups_from_builder(builder, vllm_config, kv_cache_spec):
        return list(reversed(original(builder, vllm_config, kv_cache_spec)))

    return get_kv_cache_groups_from_builder


def _resolve_lbnhc_as_lbhnc(original: Callable) -> Callable:
    """``resolve_kv_cache_layout`` answering LBHNC where LBNHC resolves (and recording it)."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    def resolve_kv_cache_layout(vllm_config, supported_layouts, kv_cache_specs=None):
        layout = original(vllm_config, supported_layouts, kv_cache_specs)
        if layout is KVCacheLayout.LBNHC:
            layout = KVCacheLayout.LBHNC
            # Consistently wrong: planning reads the recorded layout, like the real one.
            vllm_config.cache_config.kv_cache_layout = layout.name
        return layout

    return resolve_kv_cache_layout


def _validate_without_uniform_shortcut(original: Callable) -> Callable:
    """``validate_kv_cache_layout`` demanding a block-compact layout even for uniform pages."""

    def validate_kv_cache_layout(layout, kv_cache_groups):
        if not layout.is_block_compact:
            raise ValueError(f"KV cache layout {layout.name} cannot express this model's pages")
        return original(layout, kv_cache_groups)

    return validate_kv_cache_layout


def _no_null_block_check(original: Callable) -> Callable:
    """``_check_enough_kv_cache_memory`` that never refuses (null-block reservation forgotten)."""

    def _check_enough_kv_cache_memory(*args, **kwargs):
        return None

    return _check_enough_kv_cache_memory


def _drafts_not_allocated(original: Callable) -> Callable:
    """``allocate_kv_cache`` leaving the draft layers out of the registered tensors."""

    def allocate_kv_cache(*args, **kwargs):
        return {name: t for name, t in original(*args, **kwargs).items() if not name.startswith("draft.")}

    return allocate_kv_cache


def _bound_to_copies(original: Callable) -> Callable:
    """``map_kv_caches_to_kernel_blocks`` binding each layer to a private copy of its cache:
    the shapes agree, but the kernels write where no connector reads."""

    def map_kv_caches_to_kernel_blocks(kv_caches, attn_groups):
        return {name: cache.clone() for name, cache in original(kv_caches, attn_groups).items()}

    return map_kv_caches_to_kernel_blocks


def _scheduler_uses_largest_block(original: Callable) -> Callable:
    """``generate_scheduler_kv_cache_config`` giving every group the largest block size."""

    def generate_scheduler_kv_cache_config(kv_cache_configs):
        config = original(kv_cache_configs)
        largest = max(g.kv_cache_spec.block_size for g in config.kv_cache_groups)
        for group in config.kv_cache_groups:
            group.kv_cache_spec = group.kv_cache_spec.copy_with_new_block_size(largest)
        return config

    return generate_scheduler_kv_cache_config


def _scheduler_ignores_dcp(original: Callable) -> Callable:
    """``resolve_kv_cache_block_sizes`` computing spans as if DCP were 1."""

    def resolve_kv_cache_block_sizes(kv_cache_config, vllm_config):
        parallel = vllm_config.parallel_config
        saved, parallel.decode_context_parallel_size = parallel.decode_context_parallel_size, 1
        try:
            return original(kv_cache_config, vllm_config)
        finally:
            parallel.decode_context_parallel_size = saved

    return resolve_kv_cache_block_sizes


@dataclass(frozen=True)
class Mutation:
    """One vLLM function replaced by a wrong variant, and what the diff must report."""

    id: str
    case: str
    module: str
    attr: str
    variant: Callable[[Callable], Callable]
    intended: str
    kinds: frozenset[str]
    """Exactly what ``compare`` reports by the facts: the intended kind and its inherent consequences."""
    runner: str = "mrv1"
    contract: frozenset[str] = frozenset()
    """Exactly what the contract alone reports (``compare(..., basis="contract")``): what a
    vLLM the reference has no facts for would still be caught by."""


def _layer_spec_replaced(**changes: Any) -> Callable[[type], type]:
    """A layer class whose ``get_kv_cache_spec`` reports its spec with ``changes``: a
    model-specific layer computing its own page wrong (issue 24: one per new kind)."""

    def variant(layer_cls: type) -> type:
        class Mutated(layer_cls):  # type: ignore[misc, valid-type]
            def get_kv_cache_spec(self, vllm_config):
                spec = super().get_kv_cache_spec(vllm_config)
                return dataclasses.replace(spec, **{k: v(spec) for k, v in changes.items()})

        Mutated.__name__ = layer_cls.__name__
        return Mutated

    return variant


def _encoder_only_with_a_kv_cache(layer_cls: type) -> type:
    """``EncoderOnlyAttention`` answering ``get_kv_cache_spec`` as its base ``Attention`` does (a full-attention
    page per layer) instead of None."""

    class Mutated(layer_cls):  # type: ignore[misc, valid-type]
        def get_kv_cache_spec(self, vllm_config):
            from vllm.v1.kv_cache_interface import FullAttentionSpec

            return FullAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=self.num_kv_heads,
                                     head_size=self.head_size, dtype=self.kv_cache_torch_dtype)

    Mutated.__name__ = layer_cls.__name__
    return Mutated


def _calculator_replaced(method: str, wrong: Callable[..., Any]) -> Callable[[type], type]:
    """A mixer module's ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` whose
    ``method`` is ``wrong(original_method, *args, **kwargs)``: a state layer computing its own state
    wrong (issue 24: one per mixer kind). Patched where the mixer's module looks the class up."""

    def variant(calculator: type) -> type:
        original = getattr(calculator, method)

        class Mutated(calculator):  # type: ignore[misc, valid-type]
            pass

        setattr(Mutated, method, classmethod(lambda cls, *args, **kwargs: wrong(original, *args, **kwargs)))
        Mutated.__name__ = calculator.__name__
        return Mutated

    return variant


def _gdn_conv_without_key_channels(original: Callable, tp_world_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                                   conv_kernel_size, num_spec=0):
    """GDN's conv state sized for the queries and values only: the keys' channels dropped."""
    conv, recurrent = original(tp_world_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size, num_spec)
    return (conv[0], conv[1] - head_k_dim * num_k_heads // tp_world_size), recurrent


def _ple_conv_without_dilation(original: Callable, tp_world_size, intermediate_size, conv_kernel, num_spec=0):
    """The PLE short conv's state keeping kernel - 1 inputs, not (kernel - 1) x ngram_size: the dilation (the
    named case's n-gram size, 3) forgotten."""
    return original(tp_world_size, intermediate_size, (conv_kernel - 1) // 3 + 1, num_spec)


def _rswa_reported_as_full(layer_cls: type) -> type:
    """``RSWAAttention.get_kv_cache_spec`` falling back to ``Attention``'s: a plain
    ``FullAttentionSpec``, so the scheduler never gives the layers an ``RSWAManager``."""
    from vllm.model_executor.layers.attention.attention import Attention

    class Mutated(layer_cls):  # type: ignore[misc, valid-type]
        def get_kv_cache_spec(self, vllm_config):
            return Attention.get_kv_cache_spec(self, vllm_config)

    Mutated.__name__ = layer_cls.__name__
    return Mutated


MUTATIONS = (
    Mutation(
        "no-kernel-split", "mla-gqa-draft-b128-k64", "vllm.v1.worker.utils", "select_common_block_size",
        _no_kernel_split, "kernel_block_size",
        # The builders (the drafter's too) get the manager size, and the views keep
        # 128-token blocks: (4, 1, 128, 576) instead of (8, 1, 64, 576).
        frozenset({"kernel_block_size", "builder_kernel_block_size", "draft_kernel_block_size", "registered_shape"}),
        contract=frozenset({"kernel_blocks"}),
    ),
    Mutation(
        "no-kernel-split-flashinfer", "flashinfer-b128-k64", "vllm.v1.worker.utils", "select_common_block_size",
        # FlashInfer's own metadata builder refuses the unsplit 128-token page
        # ("Unexpected FlashInfer page size 128 without trtllm-gen GQA").
        _no_kernel_split, "startup_error", frozenset({"startup_error"}),
    ),
    Mutation(
        "strides-h-n-swapped", "dense-fa-b128-lbnhc", "vllm.v1.kv_cache_interface", "compute_layout_strides",
        _strides_with_h_and_n_swapped, "registered_stride", frozenset({"registered_stride"}),
        contract=frozenset({"view_order"}),
    ),
    Mutation(
        "view-offset-off-by-one", "dense-fa-b128-lbnhc", "vllm.v1.worker.utils", "create_kv_cache_views",
        _views_off_by_one, "registered_offset", frozenset({"registered_offset"}),
        contract=frozenset({"view_bounds"}),
    ),
    Mutation(
        "view-dtype-float16", "dense-fa-b128-lbnhc", "vllm.v1.worker.utils", "create_kv_cache_views",
        _views_as_float16, "registered_dtype", frozenset({"registered_dtype"}),
        contract=frozenset({"view_dtype"}),
    ),
    Mutation(
        "pool-bytes-summed", "swa-hybrid-padded", "vllm.v1.core.kv_cache_planning", "_pool_bytes_per_block",
        _pool_bytes_summed_over_groups, "bytes_per_block", frozenset({"bytes_per_block"}),
        contract=frozenset({"pool_bytes"}),
    ),
    Mutation(
        "layer-outer-offset-by-page", "mla-gqa-draft-b128-k64", "vllm.v1.core.kv_cache_planning",
        "get_kv_cache_config_from_groups", _layer_outer_offsets_by_page, "tensor_placement",
        # The draft tensor moves, so its registered view starts elsewhere.
        frozenset({"tensor_placement", "registered_offset"}),
        contract=frozenset({"block_overlap"}),
    ),
    Mutation(
        "backing-one-block-larger", "flashinfer-b16", "vllm.v1.core.kv_cache_planning",
        "get_kv_cache_config_from_groups", _backing_one_block_larger, "tensor_placement",
        # Every view lives in the larger allocation.
        frozenset({"tensor_placement", "registered_storage"}),
        contract=frozenset({"allocation_size", "pool_bytes"}),
    ),
    Mutation(
        "override-minus-one", "flashinfer-b16", "vllm.v1.core.kv_cache_planning", "may_override_num_blocks",
        _override_minus_one, "num_blocks",
        # Fewer blocks: smaller allocation and layer regions, shorter views.
        frozenset({"num_blocks", "tensor_placement", "registered_shape", "registered_offset", "registered_storage"}),
    ),
    Mutation(
        "groups-reversed", "swa-hybrid-padded", "vllm.v1.core.kv_cache_planning", "get_kv_cache_groups_from_builder",
        _groups_reversed, "groups", frozenset({"groups"}),
    ),
    Mutation(
        "lbnhc-resolved-as-lbhnc", "dense-fa-b128-lbnhc", "vllm.v1.attention.backends.utils", "resolve_kv_cache_layout",
        _resolve_lbnhc_as_lbhnc, "layout",
        # The views follow the wrong layout: H and N strides trade places.
        frozenset({"layout", "registered_stride"}),
    ),
    Mutation(
        "refuses-uniform-lhbnc", "dense-fa-b128-lhbnc", "vllm.v1.core.kv_cache_planning", "validate_kv_cache_layout",
        _validate_without_uniform_shortcut, "startup_error", frozenset({"startup_error"}),
    ),
    Mutation(
        "accepts-one-block-pool", "flash_attn-one-block", "vllm.v1.core.kv_cache_planning", "_check_enough_kv_cache_memory",
        _no_null_block_check, "startup_error", frozenset({"startup_error"}),
    ),
    Mutation(
        # GPUModelRunner imports allocate_kv_cache by name: that binding is MRv1's.
        "drafts-not-registered", "mla-gqa-draft-b128-k64", "vllm.v1.worker.gpu_model_runner", "allocate_kv_cache",
        _drafts_not_allocated, "registered_names", frozenset({"registered_names"}),
        contract=frozenset({"allocation_size"}),
    ),
    Mutation(
        "layers-bound-to-copies", "flashinfer-b128-k64", "vllm.v1.worker.gpu_model_runner",
        "map_kv_caches_to_kernel_blocks", _bound_to_copies, "bound_storage", frozenset(),
        contract=frozenset({"bound_storage"}),
    ),
    Mutation(
        "builder-ignores-split", "mla-gqa-draft-b128-k64", "vllm.v1.worker.utils", "select_common_block_size",
        _builder_ignores_kernel_size(drafts_only=False), "builder_kernel_block_size",
        frozenset({"builder_kernel_block_size", "draft_kernel_block_size"}),
        contract=frozenset({"kernel_blocks"}),
    ),
    Mutation(
        "drafter-ignores-split", "mla-gqa-draft-b128-k64", "vllm.v1.worker.utils", "select_common_block_size",
        _builder_ignores_kernel_size(drafts_only=True), "draft_kernel_block_size",
        frozenset({"draft_kernel_block_size"}),
        contract=frozenset({"kernel_blocks"}),
    ),
    Mutation(
        "views-half-content", "dense-fa-b128-lbnhc", "vllm.v1.worker.utils", "create_kv_cache_views",
        _views_half_content, "registered_shape", frozenset({"registered_shape"}),
        contract=frozenset({"page_bytes"}),
    ),
    Mutation(
        "layers-bound-to-transposed-views", "flashinfer-b128-k64", "vllm.v1.worker.gpu_model_runner",
        "map_kv_caches_to_kernel_blocks", _bound_to_transposed_views, "bound_view", frozenset(),
        contract=frozenset({"bound_view"}),
    ),
    Mutation(
        "rswa-reported-as-full", "rswa-flashinfer-b128-k64", "vllm.model_executor.layers.attention.rswa_attention",
        "RSWAAttention", _rswa_reported_as_full, "group_spec", frozenset({"group_spec"}),
    ),
    Mutation(
        "rswa-page-half-heads", "rswa-flashinfer-b128-k64", "vllm.model_executor.layers.attention.rswa_attention",
        "RSWAAttention", _layer_spec_replaced(num_kv_heads=lambda spec: spec.num_kv_heads // 2), "registered_shape",
        # Half the page: smaller pool and tensors, so every view moves and shrinks. The spec
        # object itself says half, so the contract (views against vLLM's own spec) holds.
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage"}),
    ),
    Mutation(
        "prefix-lm-page-half-v", "prefix-lm-fa-b16", "vllm.model_executor.layers.attention.prefill_prefix_lm_attention",
        "PrefillPrefixLMAttention", _layer_spec_replaced(head_size_v=lambda spec: spec.head_size_v // 2), "registered_shape",
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage"}),
    ),
    Mutation(
        # DeepSeek V3.2's indexer K cache sized without its per-128 fp32 scale (128 bytes, not 132).
        "indexer-cache-without-scales", "dsv32-indexer-b64", "vllm.model_executor.models.deepseek_v2",
        "DeepseekV32IndexerCache", _layer_spec_replaced(head_size=lambda spec: spec.head_size - 4), "registered_shape",
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage"}),
    ),
    Mutation(
        # GLM-5-next's pooled indexer cache storing a state per half kpool: twice the states per block.
        "pooled-indexer-half-kpool", "glm5next-caches-b128", "vllm.models.glm5next.common.attention",
        "Glm5NextIndexerCache", _layer_spec_replaced(tokens_per_state=lambda spec: spec.tokens_per_state // 2),
        "registered_shape",
        # Twice the indexer's states per block: its views, the packed block and so every view's
        # stride and the pool grow. The spec itself says so, so the contract holds.
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage",
                   "registered_stride"}),
    ),
    Mutation(
        # MiniMax M3's indexer side cache sized for half its index-key vector.
        "minimax-indexer-half-head", "minimax-m3-indexer-b128", "vllm.models.minimax_m3.common.indexer",
        "MiniMaxM3IndexerCache", _layer_spec_replaced(head_size=lambda spec: spec.head_size // 2), "registered_shape",
        # A smaller indexer page in the uniform-type block: the block, the pool and the later views move.
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage"}),
    ),
    Mutation(
        # The hidden-state cache sized for half the captured layers.
        "hidden-state-cache-half-layers", "hidden-states-swa-hybrid", "vllm.model_executor.models.extract_hidden_states",
        "CacheOnlyAttentionLayer", _layer_spec_replaced(num_kv_heads=lambda spec: max(spec.num_kv_heads // 2, 1)),
        # Half the per-token width: the common page scales 3x instead of 6x, so every group's block
        # size, the kernel and scheduler blocks and the pool move with it.
        "registered_shape", frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_storage",
                                       "groups", "kernel_block_size", "builder_kernel_block_size",
                                       "scheduler_block_size"}),
    ),
    Mutation(
        # GLM-5-next's kpool tail ring twice as long as Glm5NextTailCache computes it (its block-table
        # width stays one block: the ring's page doubles).
        "kpool-tail-ring-doubled", "kpool-tail-b64", "vllm.models.glm5next.common.attention",
        "Glm5NextTailCache", _layer_spec_replaced(block_size=lambda spec: spec.block_size * 2), "groups",
        # The ring's group, kernel and builder blocks, its page (views, strides, offsets) all double.
        frozenset({"groups", "tensor_placement", "kernel_block_size", "builder_kernel_block_size", "registered_shape",
                   "registered_offset"}),
    ),
    Mutation(
        # Qwen4-exp's compressed QSA keys stored one per token instead of one per compress_ratio tokens.
        "qsa-compressed-key-per-token", "qwen4-qsa-caches-b64", "vllm.models.qwen4_exp.common.qsa_cache",
        "QSACompressedKeyCache", _layer_spec_replaced(tokens_per_state=lambda spec: 1), "registered_shape",
        # Four times the compressed-key page in the block-outermost block: the block stride, the pool and the
        # later views move.
        frozenset({"registered_shape", "bytes_per_block", "tensor_placement", "registered_offset", "registered_storage",
                   "registered_stride"}),
    ),
    Mutation(
        # Qwen4-exp's QSA compressor ring twice as long as QSAKeyStateCache computes it.
        "qsa-key-state-ring-doubled", "qwen4-qsa-caches-b64", "vllm.models.qwen4_exp.common.qsa_cache",
        "QSAKeyStateCache", _layer_spec_replaced(block_size=lambda spec: spec.block_size * 2), "groups",
        # The ring's page doubles inside the attention page's block (packed, no larger block).
        frozenset({"groups", "tensor_placement", "kernel_block_size", "builder_kernel_block_size", "registered_shape",
                   "registered_offset"}),
    ),
    Mutation(
        # DeepSeek V4's compressed record without its 8 bytes of UE8M0 scales (576 = 448 NoPE + 128 RoPE): the
        # page keeps its 576-byte-aligned size, the records inside it are read 8 bytes apart.
        "dsv4-record-without-scales", "dsv4-caches-b256", "vllm.models.deepseek_v4.nvidia.flashmla",
        "DeepseekV4FlashMLAAttention", _layer_spec_replaced(state_content_bytes=lambda spec: 576), "registered_shape",
        frozenset({"registered_shape"}),
    ),
    Mutation(
        # DeepSeek V4's SWA cache in 128-token blocks instead of the 64 its attention layer asks for.
        "dsv4-swa-block-doubled", "dsv4-caches-b256", "vllm.v1.attention.backends.mla.sparse_swa",
        "DeepseekV4SWACache", _layer_spec_replaced(block_size=lambda spec: spec.block_size * 2), "groups",
        # Twice the SWA page: the widest group grows, and with it the packed block, the pool and every view's stride;
        # the group's kernel and builder blocks double.
        frozenset({"groups", "builder_kernel_block_size", "bytes_per_block", "kernel_block_size", "registered_shape",
                   "registered_storage", "registered_stride", "tensor_placement"}),
    ),
    Mutation(
        # DeepSeek V4's index keys without their fp32 scales (128 bytes a state instead of 132).
        "dsv4-indexer-without-scales", "dsv4-caches-b256", "vllm.models.deepseek_v4.attention",
        "DeepseekV4IndexerCache", _layer_spec_replaced(head_size=lambda spec: spec.head_size - 4), "registered_shape",
        frozenset({"registered_shape"}),
    ),
    Mutation(
        # DeepSeek V4's compressor states kept in bf16 instead of the fp32 DeepseekCompressor asserts.
        "dsv4-compressor-state-in-bf16", "dsv4-caches-b256", "vllm.models.deepseek_v4.compressor",
        "CompressorStateCache", _layer_spec_replaced(dtype=lambda spec: __import__("torch").bfloat16), "registered_dtype",
        # Half the state page inside the group's aligned page: the views change dtype and strides, the later
        # states of the group move.
        frozenset({"registered_dtype", "registered_offset", "registered_stride", "tensor_placement"}),
    ),
    Mutation(
        # DeepSeek V4.1 choosing its MXFP8 record (528 bytes, 512-byte pages) on SM90, whose FlashMLA decodes only
        # V4's 584-byte record: the capability check of _use_v41_mxfp8_kv_record answering True everywhere.
        "dsv41-mxfp8-record-on-sm90", "dsv41-caches-b64", "vllm.models.deepseek_v41.attention",
        "_use_v41_mxfp8_kv_record", lambda original: (lambda: True), "registered_shape",
        # Every record and page shrinks: the packed block, the pool and every view after the first move.
        frozenset({"bytes_per_block", "registered_offset", "registered_shape", "registered_storage", "registered_stride",
                   "tensor_placement"}), runner="mrv2",
    ),
    Mutation(
        # DeepSeek V4.1's SWA cache in V4's 64-token blocks instead of the 32 its attention asks for.
        "dsv41-swa-v4-block", "dsv41-caches-b64", "vllm.models.deepseek_v41.attention",
        "DeepseekV4SWACache", _layer_spec_replaced(block_size=lambda spec: spec.block_size * 2), "groups",
        # Twice the SWA page inside the packed block (the compressed caches' group stays the widest): the SWA
        # group's kernel and builder blocks double and its later pages move.
        frozenset({"builder_kernel_block_size", "groups", "kernel_block_size", "registered_offset", "registered_shape",
                   "tensor_placement"}), runner="mrv2",
    ),
    Mutation(
        # DeepSeek V4.1's index keys without their fp32 scales (128 bytes a state instead of 132).
        "dsv41-indexer-without-scales", "dsv41-caches-b64", "vllm.models.deepseek_v41.attention",
        "DeepseekV4IndexerCache", _layer_spec_replaced(head_size=lambda spec: spec.head_size - 4), "registered_shape",
        # The page keeps its 576-byte-aligned size; the keys inside it are read 4 bytes apart.
        frozenset({"registered_shape"}), runner="mrv2",
    ),
    Mutation(
        # DeepSeek V4.1's compressor ring of 4 rows, without room for the previous row and the bonus token's.
        "dsv41-compressor-ring-halved", "dsv41-caches-b64", "vllm.models.deepseek_v41.compressor",
        "CompressorStateCache", _layer_spec_replaced(block_size=lambda spec: spec.block_size // 2), "groups",
        # Half the ring inside the packed block: the ring group's kernel and builder blocks halve, its second ring
        # moves.
        frozenset({"builder_kernel_block_size", "groups", "kernel_block_size", "registered_offset", "registered_shape",
                   "tensor_placement"}), runner="mrv2",
    ),
    Mutation(
        # Kimi K3's own MLA class reporting half its latent width.
        "kimi-k3-mla-half-latent", "kimi-k3-mla-own-class-b64", "vllm.models.kimi_k3.nvidia.mla",
        "MultiHeadLatentAttention", _layer_spec_replaced(head_size=lambda spec: spec.head_size // 2), "registered_shape",
        # Half the page: the block, the pool and the second layer's offset move.
        frozenset({"registered_shape", "bytes_per_block", "registered_offset", "registered_storage", "tensor_placement"}),
    ),
    Mutation(
        # MiniMax M3's own sparse attention layer reporting a cache of half its KV heads.
        "minimax-m3-sparse-half-heads", "minimax-m3-sparse-own-class-b128", "vllm.models.minimax_m3.nvidia.model",
        "MiniMaxM3SparseAttention", _layer_spec_replaced(num_kv_heads=lambda spec: spec.num_kv_heads // 2),
        # Half the GQA page beside the index cache's: the block, the pool and the later layers' offsets move.
        "registered_shape", frozenset({"registered_shape", "bytes_per_block", "registered_offset", "registered_storage",
                                       "tensor_placement"}),
    ),
    Mutation(
        # Qwen4-exp's own QSA attention reporting a cache of half its KV heads.
        "qwen4-qsa-attention-half-heads", "qwen4-qsa-own-class-b64", "vllm.models.qwen4_exp.nvidia.qsa",
        "Qwen4ExpQSAAttention", _layer_spec_replaced(num_kv_heads=lambda spec: spec.num_kv_heads // 2),
        # Half the GQA page in the block-outermost block: its stride, the pool and every later page move.
        "registered_shape", frozenset({"registered_shape", "bytes_per_block", "registered_offset", "registered_storage",
                                       "registered_stride", "tensor_placement"}),
    ),
    Mutation(
        # Inkling's short-conv state packing K and V only (its two hidden-chunk streams dropped): a quarter of its
        # page, which the page unifier then scales to four times the tokens a block (16, not 4): the groups, their
        # kernel and builder blocks and the scheduler's and hash block sizes move with it.
        "inkling-conv-state-without-hidden-streams", "inkling-sconv-b16", "vllm.models.inkling.nvidia.sconv_swa_attn",
        "InklingConvState", _layer_spec_replaced(head_size=lambda spec: spec.head_size // 4), "registered_shape",
        frozenset({"registered_shape", "groups", "kernel_block_size", "builder_kernel_block_size", "scheduler_block_size",
                   "cache_block_size"}),
    ),
    Mutation(
        # An encoder-only layer reporting the decoder's spec: the model would allocate a KV cache it never uses.
        "encoder-only-allocates-kv", "bert-encoder-only-b16",
        "vllm.model_executor.layers.attention.encoder_only_attention", "EncoderOnlyAttention",
        _encoder_only_with_a_kv_cache, "groups",
        # A group, a pool sized for it, its tensors and registered views where there should be none.
        frozenset({"groups", "bytes_per_block", "kernel_block_size", "num_blocks", "registered_names", "tensor_placement"}),
    ),
    # State layers built as vLLM's own mixer classes: each computes its state wrong once.
    Mutation(
        "mamba2-no-extra-groups-for-head-shards", "mamba2-mixer-tp2-one-group",
        "vllm.model_executor.layers.mamba.mamba_mixer2", "MambaStateShapeCalculator",
        _calculator_replaced("extra_groups_for_head_shards", lambda original, ngroups, tp_size: 0),
        "registered_shape", frozenset({"registered_shape", "state_view"}),
    ),
    Mutation(
        "gdn-conv-state-without-keys", "qwen3-next-gdn-hybrid", "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        "MambaStateShapeCalculator", _calculator_replaced("gated_delta_net_state_shape", _gdn_conv_without_key_channels),
        "registered_shape", frozenset({"registered_shape", "state_view"}),
    ),
    Mutation(
        "kda-recurrent-state-in-model-dtype", "kimi-k3-kda-hybrid", "vllm.models.kimi_k3.nvidia.kda",
        "MambaStateDtypeCalculator",
        _calculator_replaced("kda_state_dtype", lambda original, model_dtype, *args, **kwargs:
                             (original(model_dtype, *args, **kwargs)[0],) * 2),
        "registered_shape", frozenset({"registered_shape", "state_view"}),
    ),
    Mutation(
        "glm5next-kda-square-state-halved", "glm5next-kda-hybrid", "vllm.models.glm5next.common.kda",
        "MambaStateShapeCalculator",
        _calculator_replaced("kda_state_shape", lambda original, tp, num_heads, head_dim, **kwargs:
                             (original(tp, num_heads, head_dim, **kwargs)[0], (num_heads // tp, head_dim, head_dim // 2))),
        "registered_shape", frozenset({"registered_shape", "state_view"}),
    ),
    Mutation(
        # Qwen4-exp's PLE layer sizing its state without the n-gram dilation (patched where ple_layer.py looks the
        # calculator up; the model class, which answers the negotiation, still reports the dilated state).
        "ple-conv-state-without-dilation", "qwen4-exp-gdn-ple-b64", "vllm.models.qwen4_exp.nvidia.ple_layer",
        "MambaStateShapeCalculator", _calculator_replaced("short_conv_state_shape", _ple_conv_without_dilation),
        "registered_shape", frozenset({"registered_shape", "state_view"}),
    ),
    Mutation(
        # Step5's tail ring reporting half its DSA layer's page (48 rows where the class keeps 96).
        "step5-ring-half-page", "step5-dsa-b64", "vllm.models.step5.nvidia.csa_tail_ring", "Step5CSATailRing",
        _layer_spec_replaced(head_size=lambda spec: spec.head_size // 2), "registered_shape",
        # The rings' own group: its second ring starts half a page earlier in the block (the widest group, the DSA
        # layers', keeps the block stride).
        frozenset({"registered_shape", "registered_offset", "tensor_placement"}), runner="mrv2",
    ),
    Mutation(
        # Step5's region summaries kept one per 4 tokens instead of 8: twice the page beside each DSA layer's KV.
        "step5-summary-per-four-tokens", "step5-dsa-b64", "vllm.models.step5.nvidia.sparse_summary_cache",
        "Step5SparseSummaryCacheLayer", _layer_spec_replaced(tokens_per_state=lambda spec: 4), "registered_shape",
        # The next DSA layer's pages move by the larger summary; the block stride, rounded up to 12288 bytes, does not.
        frozenset({"registered_shape", "registered_offset", "tensor_placement"}), runner="mrv2",
    ),
    Mutation(
        # Every conv state stored (dim, state_len) while the rest of vLLM reads (state_len, dim): the same
        # bytes, so only the bound states show it (VLLM_SSM_CONV_STATE_LAYOUT=DS taken as the default).
        "conv-state-dim-first", "qwen3-next-gdn-hybrid", "vllm.model_executor.layers.mamba.mamba_utils",
        "is_conv_state_dim_first", lambda original: (lambda: True), "state_view", frozenset({"state_view"}),
    ),
    Mutation(
        "scheduler-largest-block", "swa-hybrid-scaled", "vllm.v1.core.kv_cache_utils", "generate_scheduler_kv_cache_config",
        # The hash block is the GCD of the (now equal) group sizes: it moves too.
        _scheduler_uses_largest_block, "cache_block_size", frozenset({"cache_block_size", "scheduler_block_size"}),
    ),
    Mutation(
        "scheduler-ignores-dcp", "gqa-tp8-dcp4-flashinfer-b128", "vllm.v1.core.kv_cache_utils",
        "resolve_kv_cache_block_sizes", _scheduler_ignores_dcp, "scheduler_block_size",
        frozenset({"scheduler_block_size"}),
    ),
)


def _compare(case: CaseConfig, runner: str) -> Comparison:
    return compare(case, runner, observe(case, runner))


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_mutation_is_caught(mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> None:
    case, runner = _case(mutation.case), mutation.runner
    clean = _compare(case, runner)
    assert clean.status == "pass" and not clean.divergences, "unpatched vLLM must compare clean:\n" + _explain(clean)

    module = importlib.import_module(mutation.module)
    original = getattr(module, mutation.attr)
    monkeypatch.setattr(module, mutation.attr, mutation.variant(original))
    mutated = _compare(case, runner)
    monkeypatch.undo()

    assert getattr(module, mutation.attr) is original
    found = kinds_of(mutated.divergences)
    assert mutation.intended in found, f"{mutation.id}: {mutation.intended} not reported\n" + _explain(mutated)
    assert found == mutation.kinds | mutation.contract, (
        f"{mutation.id}: expected exactly {sorted(mutation.kinds | mutation.contract)}, got {sorted(found)}\n" + _explain(mutated)
    )
    assert all(d.case == case.name and d.runner == runner and "\n" not in d.message for d in mutated.divergences)
    again = _compare(case, runner)
    assert again.status == "pass", "the restored vLLM must compare clean again:\n" + _explain(again)


def _mutated_observation(mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> Any:
    module = importlib.import_module(mutation.module)
    original = getattr(module, mutation.attr)
    monkeypatch.setattr(module, mutation.attr, mutation.variant(original))
    try:
        return observe(_case(mutation.case), mutation.runner)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_what_the_contract_alone_catches(mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same mutations judged with no release facts at all (``--contract-only``): each
    reports exactly its documented contract kinds, so the contract's reach is a tested figure."""
    case = _case(mutation.case)
    clean = compare(case, mutation.runner, observe(case, mutation.runner), basis="contract")
    assert clean.status in ("pass", "refused") and not clean.divergences, _explain(clean)
    judged = compare(case, mutation.runner, _mutated_observation(mutation, monkeypatch), basis="contract")
    assert kinds_of(judged.divergences) == mutation.contract, _explain(judged)
    assert all(d.basis == "contract" for d in judged.divergences)
    if mutation.contract:
        assert judged.status == "fail"
    else:
        assert judged.status in ("pass", "refused"), _explain(judged)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_an_unreleased_build_still_catches_every_mutation(mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged as an unreleased build (the newest facts, their divergences drift): every
    mutation is caught, each divergence a contract or a drift one."""
    judged = compare(_case(mutation.case), mutation.runner, _mutated_observation(mutation, monkeypatch), basis="drift")
    assert judged.status == "fail" and judged.divergences, _explain(judged)
    assert {d.basis for d in judged.divergences} <= {"contract", "drift"}
    assert {d.kind for d in judged.divergences if d.basis == "contract"} == mutation.contract
    assert any(d.message.endswith("(drift)") for d in judged.divergences if d.basis == "drift") or not mutation.kinds


def test_the_contract_catches_most_mutations() -> None:
    """The figure the README states: mutations caught by the contract alone."""
    caught = [m.id for m in MUTATIONS if m.contract]
    assert len(caught) == 13 and len(MUTATIONS) == 52, (len(caught), len(MUTATIONS))


# --- MRv1 vs MRv2 ----------------------------------------------------------------------------------


def _manager_block_sizes(original: Callable) -> Callable:
    """``prepare_kernel_block_sizes`` without expansion (MRv2 as in vLLM 0.21)."""

    def prepare_kernel_block_sizes(kv_cache_config, attn_groups):
        return [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]

    return prepare_kernel_block_sizes


def _smallest_kernel_block_sizes(original: Callable) -> Callable:
    """``prepare_kernel_block_sizes`` splitting into the smallest common size, not the largest."""
    from vllm.v1.worker.utils import _block_size_is_supported

    def prepare_kernel_block_sizes(kv_cache_config, attn_groups):
        sizes = original(kv_cache_config, attn_groups)
        out = []
        for gid, (size, group) in enumerate(zip(sizes, kv_cache_config.kv_cache_groups)):
            if size == group.kv_cache_spec.block_size:
                out.append(size)
                continue
            backends = [g.backend for g in attn_groups[gid]]
            specs = [g.kv_cache_spec for g in attn_groups[gid]]
            candidates = {s for b, sp in zip(backends, specs) for s in b.get_supported_kernel_block_sizes(sp) if isinstance(s, int)}
            out.append(min(s for s in candidates if size % s == 0 and _block_size_is_supported(backends, s, specs)))
        return out

    return prepare_kernel_block_sizes


def _observe_mrv2_patched(case: CaseConfig, variant: Callable[[Callable], Callable], monkeypatch: pytest.MonkeyPatch):
    """MRv1 observed as shipped; MRv2 with its own ``prepare_kernel_block_sizes`` binding
    (``vllm/v1/worker/gpu/attn_utils.py``, called by its ``init_attn_backend``) replaced."""
    import vllm.v1.worker.gpu.attn_utils as mrv2_attn_utils

    mrv1 = observe(case, "mrv1")
    assert mrv1.fidelity == "runner", mrv1.fidelity_reason
    with monkeypatch.context() as patch:
        patch.setattr(mrv2_attn_utils, "prepare_kernel_block_sizes", variant(mrv2_attn_utils.prepare_kernel_block_sizes))
        mrv2 = observe(case, "mrv2")
    assert mrv2.fidelity == "runner", mrv2.fidelity_reason
    return mrv1, mrv2


def test_unpatched_runners_agree() -> None:
    case = _case("flashinfer-b128-k64")
    assert compare_runners(case, observe(case, "mrv1"), observe(case, "mrv2")) == ()
    # With an MLA target and a FlashAttention draft the runners differ in one place only:
    # MRv2's speculator picks the draft's kernel block over the draft's backend alone.
    case = _case("mla-gqa-draft-b128-k64")
    (only,) = compare_runners(case, observe(case, "mrv1"), observe(case, "mrv2"))
    assert (only.field, only.expected, only.observed) == (
        "draft_builder_kernel_block_sizes", {"draft.layers.2.attn": 64}, {"draft.layers.2.attn": 128}
    )


def test_mrv2_without_kernel_expansion_is_a_runner_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM #42846's shape: MRv2 keeps 128-token blocks where MRv1 splits to 64.

    In 0.33.0 MRv2's metadata builders still split for FlashInfer (their own
    select_common_block_size), so binding the unsplit 128-token views refuses and MRv2
    fails to start before registering anything; the kernel block sizes it chose differ.
    """
    case = _case("flashinfer-b128-k64")
    mrv1, mrv2 = _observe_mrv2_patched(case, _manager_block_sizes, monkeypatch)
    assert compare(case, "mrv1", mrv1).status == "pass"
    assert mrv2.error_stage == "bind" and "needs 64-token kernel blocks" in mrv2.error
    mismatches = compare_runners(case, mrv1, mrv2)
    assert kinds_of(mismatches) == {"mrv1_mrv2_mismatch"}
    fields = {d.field for d in mismatches}
    assert {"error", "kernel_block_sizes"} <= fields, fields
    kernel = next(d for d in mismatches if d.field == "kernel_block_sizes")
    assert (kernel.expected, kernel.observed) == ([64], [128])
    assert all(d.runner == "mrv1/mrv2" and "MRv1" in d.message and "MRv2" in d.message for d in mismatches)


def test_silent_runner_mismatch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """MRv2 splitting into 16-token kernel blocks: both runners start, connectors see
    different shapes. Reported from the observations alone (the runner check needs no reference)."""
    case = _case("flashinfer-b128-k64")
    mrv1, mrv2 = _observe_mrv2_patched(case, _smallest_kernel_block_sizes, monkeypatch)
    assert mrv1.ok and mrv2.ok
    mismatches = compare_runners(case, mrv1, mrv2)
    layers = [layer.name for layer in case.layers]
    assert {d.field for d in mismatches} == {
        "kernel_block_sizes",
        "builder_kernel_block_sizes",
        *(f"{layer}.shape" for layer in layers),
        *(f"{layer}.bound_shape" for layer in layers),
    }
    assert kinds_of(compare(case, "mrv2", mrv2).divergences) == {
        "kernel_block_size",
        "builder_kernel_block_size",
        "registered_shape",
    }


# --- connector ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WithConnector:
    """An observation plus what a connector derived as its block size from the views."""

    observation: Any
    connector_kernel_block_size: int | None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.observation, name)


@pytest.mark.parametrize(("axis", "kinds"), [(-2, set()), (-3, {"connector_kernel_block_size"})])
def test_connector_block_size_from_views(axis: int, kinds: set[str]) -> None:
    """The driver runs no connector, so a stand-in derives the block size from the real
    registered views: ``shape[-2]`` (tokens per kernel block, right) or ``shape[-3]``
    (Mooncake's bug on MLA + Eagle: for [B, H, N, C] views that is the head count)."""
    case = _case("mla-flashinfer-draft-mooncake")
    obs = observe(case, "mrv1")
    first = next(iter(obs.registered.values()))
    result = compare(case, "mrv1", _WithConnector(obs, first.shape[axis]))
    assert kinds_of(result.divergences) == kinds, _explain(result)


# --- the whole case list, unpatched ------------------------------------------------------------


def test_every_kind_has_a_mutation() -> None:
    """Each kind is reported by some mutation test (intended, or as a consequence)."""
    from conformance.diff import ENGINE_ONLY_KINDS
    from test_contract_vs_vllm import CONTRACT_SCHEDULE_MUTATION_KINDS  # the contract's schedule mutations
    from test_runner_schedules import SCHEDULE_MUTATION_KINDS  # the block-table meta-tests

    covered = set().union(*(m.kinds | m.contract for m in MUTATIONS)) | {"mrv1_mrv2_mismatch", "connector_kernel_block_size"}
    covered |= {"connector_copy_plan"}  # a connector's planning: tests/connectors/test_mooncake_gen1.py
    covered |= SCHEDULE_MUTATION_KINDS | CONTRACT_SCHEDULE_MUTATION_KINDS
    assert covered == set(KINDS) - set(ENGINE_ONLY_KINDS)


def test_unpatched_vllm_shows_only_expected_divergences() -> None:
    """Every case through both runners and the runner check, classified with the shipped
    expectations: nothing unexpected, and every shipped entry in force for this vLLM is used
    (entries for other releases are used in reports/release-history.*)."""
    divergences = []
    facts = {}
    for case in _ALL_CASES.values():
        observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
        facts[case.name] = case_facts(case, observations.values())
        for runner, obs in observations.items():
            divergences += compare(case, runner, obs).divergences
        divergences += compare_runners(case, observations["mrv1"], observations["mrv2"])
    import vllm

    # The connector checks' copy-plan entries (kvconform check) are not a run's to use, nor
    # are the schedules' (no request schedule runs here: tests/vllm/test_runner_schedules.py).
    kinds = tuple(k for k in RUN_KINDS if k not in SCHEDULE_ONLY_KINDS)
    result = classify(divergences, Environment(vllm.__version__, facts), load(), kinds=kinds)
    assert vllm.__version__ == VLLM_VERSION
    assert not result.unexpected, "\n".join(d.message for d in result.unexpected)
    assert not result.unused, [e.describe() for e in result.unused]
    assert {m.expectation.id for m in result.expected} == {e.id for e in load()
                                                           if e.applies_to(vllm.__version__) and e.kind in kinds}
