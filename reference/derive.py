"""The whole reference pipeline for one case and one runner (generation 2, vLLM >= 0.29).

Case -> per-layer specs (``Attention.get_kv_cache_spec`` + ``customize_attention_spec``)
-> layout (``resolve_kv_cache_layout``) -> groups and placement (``kv_cache_planning``)
-> kernel block sizes (``prepare_kernel_block_sizes``) -> views (``allocate_kv_cache``)
-> the metadata-builder pass (``map_kv_caches_to_kernel_blocks``) -> what
``register_kv_caches`` receives, and where every (layer, logical block) lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from reference import backends as bk
from reference.backends import Packing
from reference.config import (DSV4_KINDS, FAMILY_BACKENDS, QSA_KINDS, STEP5_SIDE_CACHES, CaseConfig, LayerConfig,
                              LAYER_OWN_BACKENDS, step5_owner_name)
from reference.dtypes import canonical_model_dtype, dtype_size, quant_mode, storage_dtype
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.parallel import prefill_context_parallel_refusal, scheduler_block_sizes
from reference.kernel_blocks import select_common_block_size
from reference.layout import KVCacheLayout, resolve_layout, supported_layouts
from reference.planning import KVCachePlan, get_kv_cache_groups, plan
from reference.releases import (DSV4_INDEXER_REFUSES_DCP, ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK, FLASHINFER_SM90_REFUSES_SLIDING_WINDOW, HIDDEN_STATE_PAGE_GROWS,
                                MRV1_REFUSES_STEP5,
                                PACKED_GROUPS_KEEP_MANAGER_BLOCKS, SLIDING_WINDOW_BLOCK_FROM_PRIMARY,
                                SLIDING_WINDOW_PACKED_AS_STATE,
                                STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, holds)
from reference.specs import AttentionSpec, LayerSpec, MambaSpec, MultipleOf, SpecKind, first_layer_spec, layer_spec_of
from reference.state_mixers import construction_refusal, layer_state, state_is_tp_replicated
from reference.views import BlockBytes, LayerBytes, TensorView, create_views, effective_packing, layer_bytes

_KIND = {
    "full": SpecKind.FULL,
    "sliding_window": SpecKind.SLIDING_WINDOW,
    "chunked_local": SpecKind.CHUNKED_LOCAL,
    "sink_full": SpecKind.SINK_FULL,
    "mla": SpecKind.MLA,
    "sliding_window_mla": SpecKind.SLIDING_WINDOW_MLA,
    "cross": SpecKind.CROSS,
    "rswa": SpecKind.RSWA,
    "prefix_lm": SpecKind.FULL,
    "mla_indexer": SpecKind.MLA,
    "hidden_state": SpecKind.HIDDEN_STATE,
    "circular_buffer": SpecKind.CIRCULAR_BUFFER,
    "minimax_indexer": SpecKind.MLA,
    "qsa_compressed_key": SpecKind.MLA,
    "qsa_key_state": SpecKind.CIRCULAR_BUFFER,
    "dsv4_attention": SpecKind.MLA,
    "dsv4_swa": SpecKind.SLIDING_WINDOW_MLA,
    "dsv4_indexer": SpecKind.MLA,
    "dsv4_compressor_state": SpecKind.SLIDING_WINDOW_MLA,
    "inkling_conv_state": SpecKind.SLIDING_WINDOW,
    "step5_summary": SpecKind.FULL,
    "step5_csa_ring": SpecKind.CIRCULAR_BUFFER,
}
# MLAAttention.get_kv_cache_spec hard-codes the content bytes of the DeepSeek formats.
_MLA_CONTENT_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
_CONNECTOR_LAYOUT = {"nixl": KVCacheLayout.LBHNC, "mooncake": KVCacheLayout.LBHNC, "offloading": KVCacheLayout.LBHNC}


@dataclass(frozen=True)
class LayerBlocks:
    """One registered layer's blocks as a connector must address them (``Derivation.layer_blocks``)."""

    layer: str
    kernel_blocks_per_block: int
    """Kernel blocks per logical (scheduler) block: ``shape[0] // num_blocks`` of the registered view."""
    kernel_block_tokens: int
    """Tokens per registered (kernel) block: ``shape[2]``, times the spec's tokens per state for a compressed cache
    (DeepSeek V4's, QSA's compressed keys, a pooled indexer: ``shape[2]`` counts states)."""
    block_tokens: int
    """Tokens per logical block (the KV cache group's block size)."""
    page_bytes: int
    """Bytes of one logical block's page of this layer (the spec's page size)."""
    kernel_page_bytes: int
    """Bytes of one kernel block's share of that page."""
    kernel_content_bytes: int
    """Bytes of K/V content in one kernel block (a page without its padding)."""
    kernel_block_stride_bytes: int
    """Bytes from one registered block to the next: ``stride(0) * element_size``."""
    heads: int
    """KV heads in the registered view: ``shape[1]``."""


@dataclass(frozen=True)
class Derivation:
    """Everything the reference predicts for one (case, runner)."""

    case: CaseConfig
    runner: str
    layer_backends: dict[str, str]
    specs: dict[str, LayerSpec]
    """Per-layer specs as grouped: after ``customize_spec`` and page-size unification."""
    layout: KVCacheLayout
    plan: KVCachePlan
    kernel_block_sizes: tuple[int, ...]
    """Per KV cache group, as ``prepare_kernel_block_sizes`` returns them."""
    cache_block_size: int
    """``cache_config.block_size`` after planning: min over prefix-cacheable groups."""
    scheduler_block_size: int
    """The token span the scheduler aligns to: DCP-scaled, LCM over groups."""
    hash_block_size: int
    """The prefix-cache hash granularity in tokens (GCD over groups' DCP-scaled spans)."""
    connector_kernel_block_size: int | None
    """What NIXL/Mooncake derive (``_sync_block_size_with_kernel``); None if it fails."""
    registered: dict[str, TensorView]
    builder_kernel_block_sizes: dict[str, int]
    """Per attention layer: the kernel block size its metadata builder and block table use."""
    _geometry_inputs: dict[str, tuple] = field(repr=False, compare=False)
    _geometry: dict[str, LayerBytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def groups(self):
        return self.plan.groups

    @property
    def num_blocks(self) -> int:
        return self.plan.num_blocks

    def block_ratio(self, group_id: int) -> int:
        return self.plan.groups[group_id].spec.block_size // self.kernel_block_sizes[group_id]

    def block_bytes(self, layer: str, block_id: int) -> BlockBytes:
        """Where logical block ``block_id`` of ``layer`` lives in the shared pool."""
        if not 0 <= block_id < self.plan.num_blocks:
            raise ConfigError(f"block id {block_id} is outside [0, {self.plan.num_blocks})")
        geometry = self._geometry.get(layer)
        if geometry is None:
            # Built on first use: most derivations are compared, never queried byte by byte.
            try:
                inputs = self._geometry_inputs[layer]
            except KeyError:
                raise ConfigError(f"layer {layer!r} is not one of the case's layers") from None
            geometry = self._geometry[layer] = layer_bytes(*inputs)
        return geometry.block(block_id)

    def kv_packing(self, layer: str) -> Packing:
        """How K and V sit in ``layer``'s page (``reference.backends.Packing``): K then V in
        the last dim for most backends, but two head slots (ROCM_ATTN, B12X, nvfp4), K/V
        planes per head (CPU_ATTN), one MLA latent, or raw state."""
        try:
            _view, _strides, spec, packing, _ratio = self._geometry_inputs[layer]
        except KeyError:
            raise ConfigError(f"layer {layer!r} is not one of the case's layers") from None
        return effective_packing(spec, packing)

    def layer_blocks(self, layer: str) -> "LayerBlocks":
        """The block arithmetic of one registered layer, in a connector's terms."""
        view = self._registered_view(layer)
        ratio = view.shape[0] // self.plan.num_blocks
        page = self.specs[layer].page_size_bytes
        return LayerBlocks(
            layer=layer,
            kernel_blocks_per_block=ratio,
            kernel_block_tokens=view.shape[2] * getattr(self.specs[layer], "tokens_per_state", 1),
            block_tokens=self.specs[layer].block_size,
            page_bytes=page,
            kernel_page_bytes=page // ratio,
            kernel_content_bytes=self.block_bytes(layer, 0).page.nbytes // ratio,
            kernel_block_stride_bytes=view.stride[0] * view.element_size,
            heads=view.shape[1],
        )

    def head_slice(self, layer: str, block: int, first_head: int, end_head: int) -> list[tuple[int, int]]:
        """Pool bytes of heads ``[first_head, end_head)`` of logical block ``block`` of
        ``layer`` (all its kernel blocks), as ``(start, stop)`` runs from the pool's first
        byte, in address order of (kernel block, head, token)."""
        view = self._registered_view(layer)
        if not 0 <= block < self.plan.num_blocks:
            raise ConfigError(f"block id {block} is outside [0, {self.plan.num_blocks})")
        if not 0 <= first_head <= end_head <= view.shape[1]:
            raise ConfigError(f"heads [{first_head}, {end_head}) are not within the view's {view.shape[1]} heads")
        es = view.element_size
        s_block, s_head, s_token, _ = (st * es for st in view.stride)
        tokens, content = view.shape[2], view.shape[3] * es
        ratio = view.shape[0] // self.plan.num_blocks
        out: list[tuple[int, int]] = []
        for k in range(block * ratio, (block + 1) * ratio):
            for h in range(first_head, end_head):
                at = view.byte_offset + k * s_block + h * s_head
                if s_token == content:  # the head's tokens are contiguous: one run
                    out.append((at, at + tokens * content))
                else:
                    out.extend((at + n * s_token, at + n * s_token + content) for n in range(tokens))
        return out

    def _registered_view(self, layer: str) -> TensorView:
        view = self.registered.get(layer)
        if view is None:
            raise ConfigError(f"layer {layer!r} is not one of the registered layers {sorted(self.registered)}")
        if len(view.shape) != 4:
            raise NotModeledError(f"layer {layer!r} is not registered as a [blocks, heads, tokens, content] view (shape {view.shape})")
        return view

    @property
    def draft_kernel_block_sizes(self) -> dict[str, int]:
        """Kernel block size of each draft (Eagle/MTP) layer's own attention group."""
        # From the case: a draft whose spec equals the target's is merged into the target's
        # spec, which does not carry is_draft.
        drafts = {layer.name for layer in self.case.layers if layer.is_draft}
        return {n: k for n, k in self.builder_kernel_block_sizes.items() if n in drafts}

    @cached_property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(self.registered)

    def shared_bytes(self) -> list[tuple[str, ...]]:
        """Layers (of different groups) whose views start at the same pool byte.

        vLLM shares them by design: a block id belongs to one group at a time.
        """
        by_offset: dict[int, list[str]] = {}
        for name, view in self.registered.items():
            by_offset.setdefault(view.byte_offset, []).append(name)
        return [tuple(names) for _, names in sorted(by_offset.items()) if len(names) > 1]


def layer_backend(case: CaseConfig, layer: LayerConfig, runner: str) -> str:
    """Which backend a layer runs under in ``runner`` (drafts differ: MRv1 vs MRv2, D1)."""
    if layer.kind == "mamba" or layer.kind in LAYER_OWN_BACKENDS or layer.family in FAMILY_BACKENDS:
        return layer.backend  # the layer's own backend, whatever --attention-backend says
    if not layer.is_draft:
        return case.attention_backend or layer.backend
    if case.speculative_attention_backend:
        return case.speculative_attention_backend
    if runner == "mrv2" and case.attention_backend:
        # MRv2's load_eagle_model keeps the target's --attention-backend for the draft;
        # MRv1's _create_draft_vllm_config auto-selects instead.
        return case.attention_backend
    return layer.backend


def _sliding_window_block_size(backend: bk.BackendInfo, probe: AttentionSpec, block_size: int, capability: tuple[int, int],
                               from_primary: bool = True) -> int:
    """``_largest_kernel_block_within``: SW block size is decoupled from ``--block-size``.
    Without ``from_primary`` (0.29: ``SLIDING_WINDOW_BLOCK_FROM_PRIMARY``) and with no padded
    page, it is the backend's smallest supported block (a ``MultipleOf``'s base)."""
    if not from_primary:
        sizes = list(backend.supported_kernel_block_sizes(probe, capability))
        candidates = [s for s in sizes if isinstance(s, int)] or [s.base for s in sizes if not isinstance(s, int)]
        return min(candidates) if candidates else block_size
    per_token = bk.customize_spec(backend, probe.with_block_size(1)).real_page_size_bytes
    budget = per_token * block_size
    max_bs = budget // per_token
    candidates: list[int] = []
    for s in backend.supported_kernel_block_sizes(probe, capability):
        if isinstance(s, int):
            candidates.append(s)
        else:
            candidates.append(max(s.base, max_bs // s.base * s.base))
    if not candidates:
        return block_size
    fitting = [c for c in candidates if c * per_token <= budget]
    return max(fitting) if fitting else min(candidates)


def raw_spec(case: CaseConfig, layer: LayerConfig, backend: bk.BackendInfo) -> LayerSpec:
    """The layer's spec before customization (``Attention/MLAAttention/MambaBase.get_kv_cache_spec``)."""
    if layer.kind == "mamba":
        refusal = construction_refusal(case, layer)
        if refusal is not None:
            raise StartupError(refusal[0], where=refusal[1])
        shapes, dtypes = layer_state(case, layer)
        return MambaSpec(
            block_size=case.mamba_block_size or case.max_model_len,
            shapes=shapes,
            dtypes=dtypes,
            # The negotiation pads every state page to the attention page (mamba_page_size_padded).
            page_size_padded=hybrid_block_size(case)[1],
            mamba_type=backend.name.removesuffix("_ATTN"),
            is_draft=layer.is_draft,
            mamba_cache_mode=case.mamba_cache_mode,
            tp_replicated=state_is_tp_replicated(layer),
        )
    kind = _KIND[layer.kind]
    dtype = storage_dtype(layer.cache_dtype, case.model_dtype)
    common = dict(
        kind=kind,
        block_size=case.block_size,
        dtype=dtype,
        cache_dtype=layer.cache_dtype,
        kv_quant_mode=quant_mode(layer.cache_dtype),
        cache_dtype_str=layer.cache_dtype if kind.is_mla else None,
        sliding_window=layer.sliding_window,
        attention_chunk_size=layer.attention_chunk_size,
        sink_len=layer.sink_len,
        rswa_window=layer.rswa_window,
        # PrefillPrefixLMAttention.get_kv_cache_spec: the decoder spec with non_causal=True.
        non_causal=layer.kind == "prefix_lm",
        is_draft=layer.is_draft,
    )
    if layer.kind == "mla_indexer":
        # DeepseekV32IndexerCache.get_kv_cache_spec: one head of head_dim bytes, uint8 whatever
        # --kv-cache-dtype, no cache_dtype_str, the indexer role, one TP shard.
        return AttentionSpec(
            kind=kind, block_size=case.block_size, num_kv_heads=1, head_size=layer.head_size, head_size_v=0,
            dtype="uint8", cache_role="indexer", max_tp_shards=1, is_draft=layer.is_draft,
            # Glm5NextIndexerCache.get_kv_cache_spec: replace(spec, tokens_per_state=index_kpool).
            tokens_per_state=layer.index_kpool or 1,
        )
    if layer.kind == "minimax_indexer":
        # MiniMaxM3IndexerCache.get_kv_cache_spec: one key-only vector per token, bf16 or fp8 e4m3
        # (its own dtype, not the cache's storage: no cache_dtype_str), the indexer role, TP-sharded.
        return AttentionSpec(
            kind=kind, block_size=case.block_size, num_kv_heads=1, head_size=layer.head_size, head_size_v=0,
            dtype="bfloat16" if layer.cache_dtype == "auto" else "float8_e4m3fn", cache_role="indexer",
            is_draft=layer.is_draft,
        )
    if layer.kind == "circular_buffer":
        return _kpool_tail_spec(case, layer)
    if layer.kind in QSA_KINDS:
        return _qsa_spec(case, layer)
    if layer.kind in DSV4_KINDS:
        return _deepseek_v41_spec(case, layer) if layer.family == "deepseek_v41" else _deepseek_v4_spec(case, layer)
    if layer.kind == "hidden_state":
        # CacheOnlyAttentionLayer.get_kv_cache_spec: num_heads x head_size in the model dtype
        # (kv_cache_dtype_str_to_dtype of auto/bf16/fp16), no V, no cache_dtype_str.
        return AttentionSpec(
            kind=kind, block_size=case.block_size, num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
            head_size_v=0, dtype=dtype, cache_dtype=layer.cache_dtype, is_draft=layer.is_draft,
        )
    if layer.kind == "inkling_conv_state":
        return _inkling_conv_state_spec(case, layer)
    if layer.kind == "step5_summary":
        return _step5_summary_spec(case, layer)
    if layer.kind == "step5_csa_ring":
        return _step5_ring_spec(case, layer)
    if layer.family == "inkling":
        # InklingAttention.get_kv_cache_spec (models/inkling/nvidia/attention.py): K and V of head_dim at --block-size
        # (a local layer's window is its own block size's: no per-window block of the generic Attention), in the
        # cache dtype, with no quantization mode (its spec sets none: an fp8 cache is plain fp8 pages, no scales) and no
        # backend customization.
        return AttentionSpec(kind=kind, block_size=case.block_size, num_kv_heads=layer.num_kv_heads,
                             head_size=layer.head_size, head_size_v=layer.head_size, dtype=dtype,
                             cache_dtype=layer.cache_dtype, sliding_window=layer.sliding_window)
    if layer.family == "kimi_k3":
        return _kimi_k3_mla_spec(case, layer, common)
    if layer.family == "qwen4_exp":
        _check_qsa_attention(case, layer)
    if layer.family == "step5":
        _check_step5_attention(case, layer)
    if layer.family == "minimax_m3" and tuple(case.capability)[0] == 10:
        raise NotModeledError(
            "MiniMax M3's sparse attention on SM100: the layer picks its MSA backend where current_platform.is_cuda() "
            "(select_main_backend_and_impl_cls), which the CPU drivers' platform is not; SM90's Triton backend is modeled")
    if kind.is_mla:
        spec = AttentionSpec(
            num_kv_heads=1,
            head_size=layer.head_size,
            head_size_v=0,
            state_content_bytes=_MLA_CONTENT_BYTES.get(layer.cache_dtype),
            **common,
        )
    else:
        head_v = layer.head_size_v if layer.head_size_v is not None else layer.head_size
        spec = AttentionSpec(num_kv_heads=layer.num_kv_heads, head_size=layer.head_size, head_size_v=head_v, **common)
    if kind is SpecKind.SLIDING_WINDOW:
        # Attention.get_kv_cache_spec decouples the window's block size from --block-size
        # (no padding unless kv_cache_dtype_skip_layers sets skip_page_size_padded, which
        # cases do not); page-size unification later rescales it to the full pages.
        spec = spec.with_block_size(_sliding_window_block_size(
            backend, spec, case.block_size, case.capability, holds(SLIDING_WINDOW_BLOCK_FROM_PRIMARY, case.vllm_version)))
    return spec


def _check_qsa_attention(case: CaseConfig, layer: LayerConfig) -> None:
    """What ``Qwen4ExpQSAAttention.__init__`` refuses before it builds anything (models/qwen4_exp/nvidia/qsa.py): a
    model dtype other than bf16, a main cache other than bf16 or fp8 e4m3, context parallelism."""
    where = "vllm.models.qwen4_exp.nvidia.qsa.Qwen4ExpQSAAttention.__init__"
    if canonical_model_dtype(case.model_dtype) != "bfloat16":
        raise StartupError("Qwen4Exp QSA currently requires BF16", where=where)
    if layer.cache_dtype not in ("auto", "bfloat16", "fp8", "fp8_e4m3"):
        raise StartupError("Qwen4Exp QSA requires a BF16 or FP8-e4m3 main KV cache", where=where)
    if case.prefill_context_parallel_size > 1 or case.decode_context_parallel_size > 1:
        raise StartupError("Qwen4Exp QSA does not support context parallelism", where=where)


STEP5_DSA_CAPABILITIES = ((9, 0), (10, 0), (10, 3))
"""``Step5DSAAttentionBackend.supports_compute_capability``: SM90, SM100, SM103 exactly."""

STEP5_CONNECTORS = ("nixl",)
"""``_verify_step5_dsa_kv_transfer_compatibility`` (models/step5/nvidia/model.py): the sparse summaries are moved only by
MooncakeStoreConnector or NixlConnector with CUDA buffers (a case's ``nixl``: its default buffer device on a GPU)."""


def _check_step5_attention(case: CaseConfig, layer: LayerConfig) -> None:
    """What a Step5 DSA layer refuses while it is built: ``Step5Attention.__init__`` (models/step5/nvidia/model.py: the
    KV connector, the GPU, the head size), then its impl's constructor (``Step5DSAAttentionImpl.__init__`` in
    sparse_attention.py: DCP, the cache dtype, ``_validate_step5_dsa_attention_contract``'s activations and head size).
    The query heads and the sparse indexer's provider groups are the model's, which the drivers choose to agree with the
    case's KV heads (4 query heads per KV head, one provider group per KV head)."""
    where = "vllm.models.step5.nvidia.model.Step5Attention.__init__"
    if case.connector is not None and case.connector not in STEP5_CONNECTORS:
        raise StartupError("Step5 DSA sparse summaries are only transferred by MooncakeStoreConnector, or by "
                           "NixlConnector with CUDA buffers, directly or under a MultiConnector.", where=where)
    capability = tuple(case.capability)
    if capability not in STEP5_DSA_CAPABILITIES:
        raise StartupError(f"Step5 DSA requires SM90, SM100 or SM103; got "
                           f"DeviceCapability(major={capability[0]}, minor={capability[1]}).", where=where)
    if layer.head_size not in (128, 192):
        raise StartupError(f"Step5 DSA supports attention head dimensions 128 or 192, got {layer.head_size}.", where=where)
    where = "vllm.models.step5.nvidia.sparse_attention.Step5DSAAttentionImpl.__init__"
    if case.decode_context_parallel_size > 1:
        raise StartupError("Step5 does not support decode context parallelism", where=where)
    if quant_mode(layer.cache_dtype) != "NONE" and layer.cache_dtype not in ("fp8", "fp8_e4m3"):
        raise StartupError("Step5 DSA supports E4M3 FP8 KV cache only", where=where)
    if layer.cache_dtype == "float16":
        raise StartupError("Step5 DSA does not support a float16 KV cache", where=where)
    model_dtype = canonical_model_dtype(case.model_dtype)
    if model_dtype != "bfloat16":
        raise StartupError(f"Step5 DSA kernels require bfloat16 activations, got torch.{model_dtype}.", where=where)
    if layer.head_size != 192:
        raise StartupError(f"Step5 DSA kernels require head_size 192, got {layer.head_size}.", where=where)


STEP5_RING_ROW_BYTES = STEP5_SIDE_CACHES["step5_csa_ring"][1] * dtype_size("bfloat16")
"""``Step5CSATailRing``'s row: one bf16 ``[index_k | index_z]`` of 2 x 256 (1 KiB)."""

STEP5_RING_REPLAY_ROWS = 7
"""The rows a region's closing row replays (``required_rows = 7 + num_speculative_tokens``, the drafts counted only for
an MTP speculative config; a case's drafts are Eagle drafts)."""


def _step5_owner(case: CaseConfig, layer: LayerConfig) -> LayerConfig:
    owner = step5_owner_name(layer)
    return next(l for l in case.layers if l.name == owner and l.family == "step5")


def _step5_summary_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """``Step5SparseSummaryCacheLayer.get_kv_cache_spec`` (models/step5/nvidia/sparse_summary_cache.py): a
    ``FullAttentionSpec`` at ``cache_config.block_size`` of one 256-byte uint8 summary per 8 tokens, one head, no V;
    a block size 8 does not divide is refused."""
    if case.block_size % 8:
        raise StartupError("Step5 KV blocks must align to eight-token regions",
                           where="vllm.models.step5.nvidia.sparse_summary_cache.Step5SparseSummaryCacheLayer.get_kv_cache_spec")
    return AttentionSpec(kind=SpecKind.FULL, block_size=case.block_size, num_kv_heads=1, head_size=layer.head_size,
                         head_size_v=0, dtype="uint8", tokens_per_state=8)


def _step5_ring_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """``Step5CSATailRing.get_kv_cache_spec`` (models/step5/nvidia/csa_tail_ring.py): one page of its DSA layer's main
    spec (``Attention.get_kv_cache_spec``, before the backend customizes it) as 1 KiB rows, which must hold the
    replayed rows, as a ``CircularBufferSpec`` at the main block size: one head of page / (block x 2) bf16 elements,
    no V, a 1 KiB block-stride alignment (rows are addressed across blocks)."""
    owner = _step5_owner(case, layer)
    main = raw_spec(case, owner, bk.get_backend(owner.backend))
    page = main.page_size_bytes
    if page % STEP5_RING_ROW_BYTES or page // STEP5_RING_ROW_BYTES < STEP5_RING_REPLAY_ROWS:
        raise StartupError(
            f"Step5 CSA tail ring needs {STEP5_RING_REPLAY_ROWS} rows of {STEP5_RING_ROW_BYTES} bytes in one "
            f"{page}-byte KV page; increase --block-size.",
            where="vllm.models.step5.nvidia.csa_tail_ring.Step5CSATailRing.get_kv_cache_spec")
    return AttentionSpec(kind=SpecKind.CIRCULAR_BUFFER, block_size=main.block_size, num_kv_heads=1,
                         head_size=page // (main.block_size * 2), head_size_v=0, dtype="bfloat16",
                         block_stride_alignment=STEP5_RING_ROW_BYTES)


def _kimi_k3_mla_spec(case: CaseConfig, layer: LayerConfig, common: dict) -> AttentionSpec:
    """Kimi K3's own ``MultiHeadLatentAttention.get_kv_cache_spec`` (models/kimi_k3/nvidia/mla.py): the generic MLA
    page, one TP shard, but only fp8_ds_mla has its custom record (656 bytes; nvfp4_ds_mla keeps the plain page). Its
    constructor asserts no prefill context parallelism."""
    if case.prefill_context_parallel_size > 1:
        raise StartupError("Kimi-K3 MultiHeadLatentAttention does not support prefill context parallelism.",
                           where="vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention.__init__")
    return AttentionSpec(num_kv_heads=1, head_size=layer.head_size, head_size_v=0,
                         state_content_bytes=_MLA_CONTENT_BYTES.get(layer.cache_dtype) if layer.cache_dtype == "fp8_ds_mla" else None,
                         **common)


def _is_hybrid(case: CaseConfig) -> bool:
    return any(l.kind == "mamba" for l in case.layers) and any(l.kind != "mamba" and not l.is_draft for l in case.layers)


def _hybrid_probe(case: CaseConfig, backend: str) -> AttentionSpec:
    """The attention spec the platform reasons with: the model's (its first target attention layer's
    KV heads and head size, as the model config reports them; MLA: one latent head) in the
    model-wide cache dtype, on ``backend``, one token a block. The model's attention is its own, not a side
    cache its layer class registers first (an indexer's keys, a QSA ring: ``LAYER_OWN_BACKENDS`` kinds), unless
    it has nothing else."""
    targets = [l for l in case.layers if l.kind != "mamba" and not l.is_draft]
    first = next((l for l in targets if l.kind not in LAYER_OWN_BACKENDS), targets[0])
    mla = any(l.kind in ("mla", "sliding_window_mla") for l in case.layers if not l.is_draft and l.kind != "mamba")
    probe = LayerConfig("_hybrid_probe", kind="mla" if mla else "full", backend=backend,
                        num_kv_heads=1 if mla else first.num_kv_heads, head_size=first.head_size,
                        cache_dtype=first.cache_dtype)
    spec = raw_spec(replace(case, block_size=1), probe, bk.get_backend(backend))
    assert isinstance(spec, AttentionSpec)
    return spec


def _hybrid_attention_page_per_token(case: CaseConfig, lead_backend: str) -> int:
    """``_align_hybrid_block_size``'s attention page of one token: a ``FullAttentionSpec`` (MLA: an
    ``MLAAttentionSpec``) of the model's KV heads and head size (its first target attention layer's,
    as the model config reports them) in the model-wide cache dtype, customized by the first
    attention layer's backend (``backend_cls.customize_spec``)."""
    return bk.customize_spec(bk.get_backend(lead_backend), _hybrid_probe(case, lead_backend)).page_size_bytes


def hybrid_block_size(case: CaseConfig, runner: str = "mrv1") -> tuple[int, int | None]:
    """``(block size, mamba_page_size_padded)`` after vLLM 0.33's ``Platform.update_block_size_for_backend``
    of a hybrid (attention + state) model (``vllm/platforms/interface.py`` ``_align_hybrid_block_size``,
    run once the layers exist; a case's ``--block-size`` is user-given, so phase 1 does not run);
    ``(case.block_size, None)`` for a model without both.

    The attention block becomes the smallest multiple of the alignment whose page holds the model
    class's state page (the case's largest state; a mixer's own), then a multiple of every attention
    backend's smallest kernel block, if larger than ``--block-size``; the alignment is the first
    attention backend's smallest kernel block (at least ``--block-size``; 128 for an MLA model, whose
    split kernel blocks TRT-LLM/FlashInfer MLA need aligned to 128). The state page is padded to the
    attention page. A raised block size that an attention backend does not accept is refused
    (``_check_aligned_block_size``). Align mode's checkpoint alignment is 1: no driven state layer
    declares one (``get_prefill_checkpoint_alignment`` None)."""
    if not _is_hybrid(case):
        return case.block_size, None
    import math

    for layer in case.layers:  # the layers are built first: what their classes refuse comes first
        refusal = construction_refusal(case, layer)
        if refusal is not None:
            raise StartupError(refusal[0], where=refusal[1])

    attention = [l for l in case.layers if l.kind != "mamba"]
    backends: list[str] = []
    for layer in attention:  # _find_non_ssm_backends: distinct, in layer order, drafts included
        name = layer_backend(case, layer, runner)
        if name not in backends:
            backends.append(name)
    per_token = _hybrid_attention_page_per_token(case, backends[0])
    state_page = max(
        sum(math.prod(shape) * dtype_size(dtype) for shape, dtype in zip(*layer_state(case, layer)))
        for layer in case.layers if layer.kind == "mamba"
    )
    if state_page == 0:
        return case.block_size, None

    def supported(name: str):
        # get_supported_kernel_block_sizes() without a spec, under the model's config: a backend that
        # reads the model's head size then (FlashAttention's FA4 hd256 pages) answers for the model's.
        info = bk.get_backend(name)
        return info.supported_kernel_block_sizes(_hybrid_probe(case, name), case.capability, gqa=not info.is_mla)

    def smallest(name: str) -> int:
        return min(s.base if isinstance(s, MultipleOf) else s for s in supported(name))

    alignment = max(smallest(backends[0]), case.block_size)
    every_backend = math.lcm(*(smallest(name) for name in backends))
    mla = any(l.kind in ("mla", "sliding_window_mla") for l in attention if not l.is_draft)
    if mla:
        alignment = max(alignment, 128)
    needed = alignment * -(-state_page // (alignment * per_token))
    needed = every_backend * -(-needed // every_backend)
    block_size = max(case.block_size, needed)
    if block_size != case.block_size:
        rejecting = []
        for name in backends:
            sizes = supported(name)
            if sizes and not any(block_size % (s.base if isinstance(s, MultipleOf) else s) == 0 for s in sizes):
                rejecting.append(name)
        if rejecting:
            raise StartupError(f"Aligned KV cache block size {block_size} is not supported by attention backend(s): "
                               f"{', '.join(rejecting)}.", where="Platform._check_aligned_block_size")
    attention_page = block_size * per_token
    return block_size, (None if attention_page == state_page else attention_page)


def kpool_tail_ring(index_kpool: int, num_speculative_tokens: int = 0) -> int:
    """``Glm5NextTailCache``'s ring: whole pools covering a pool plus the drafts stashed before
    acceptance, rounded up to a power of two of pools."""
    pools = -(-(index_kpool + num_speculative_tokens) // index_kpool)
    return index_kpool * (1 << (pools - 1).bit_length())


def _kpool_tail_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """``Glm5NextTailCache.get_kv_cache_spec`` (models/glm5next/common/attention.py): a
    ``CircularBufferSpec`` of ``ring`` tokens, two head slots (raw K, gate score) of
    ``head_size`` bf16 each, replicated across DCP ranks. The drivers build the layers under a
    config without a speculative config, so the ring counts no drafts (num_speculative_tokens 0)."""
    assert layer.index_kpool is not None  # LayerConfig validates it for this kind
    ring = kpool_tail_ring(layer.index_kpool)
    if case.block_size % ring:
        raise StartupError(
            f"Glm5NextTailCache: cache_config.block_size ({case.block_size}) must be a multiple of the tail ring ({ring})",
            where="vllm.models.glm5next.common.attention.Glm5NextTailCache.get_kv_cache_spec",
        )
    return AttentionSpec(
        kind=SpecKind.CIRCULAR_BUFFER, block_size=ring, num_kv_heads=2, head_size=layer.head_size, head_size_v=0,
        dtype="bfloat16", dcp_sharded=False, is_draft=layer.is_draft,
    )


def qsa_ring(compress_ratio: int, num_speculative_tokens: int = 0) -> int:
    """``QSAKeyStateCache``'s ring: the open group plus the drafts stored before acceptance, rounded
    up to whole groups."""
    return -(-(compress_ratio + num_speculative_tokens) // compress_ratio) * compress_ratio


def _qsa_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """Qwen4-exp's QSA side caches (models/qwen4_exp/common/qsa_cache.py), bf16 keys of ``head_size``:
    ``QSACompressedKeyCache`` an ``MLAAttentionSpec`` of one key per ``compress_ratio`` tokens,
    ``QSAKeyStateCache`` a ``CircularBufferSpec`` ring (no drafts: the drivers build layers without a
    speculative config). Their constructor refuses a block size the ratio does not divide."""
    ratio = layer.index_kpool
    assert ratio is not None  # LayerConfig validates it for these kinds
    owner_name = layer.name.rsplit(".indexer.", 1)[0] + ".attn"
    owner = next((l for l in case.layers if l.name == owner_name and l.family == "qwen4_exp"), None)
    if owner is not None:
        _check_qsa_attention(case, owner)  # its owner refuses first, before it builds its indexer
    where = f"vllm.models.qwen4_exp.common.qsa_cache.{LAYER_OWN_BACKENDS[layer.kind][1]}"
    if case.block_size % ratio:
        raise StartupError("QSA cache block size must be divisible by the compression ratio", where=where)
    if layer.kind == "qsa_compressed_key":
        return AttentionSpec(kind=SpecKind.MLA, block_size=case.block_size, num_kv_heads=1, head_size=layer.head_size,
                             head_size_v=0, dtype="bfloat16", is_draft=layer.is_draft, tokens_per_state=ratio)
    ring = qsa_ring(ratio)
    if case.block_size % ring:
        raise StartupError(f"QSA ring capacity {ring} must divide the attention block size {case.block_size}",
                           where=where + ".get_kv_cache_spec")
    return AttentionSpec(kind=SpecKind.CIRCULAR_BUFFER, block_size=ring, num_kv_heads=1, head_size=layer.head_size,
                         head_size_v=0, dtype="bfloat16", is_draft=layer.is_draft)


def _inkling_conv_state_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """``InklingConvState.get_kv_cache_spec`` (models/inkling/nvidia/sconv_swa_attn.py): a ``SlidingWindowSpec`` whose
    block and window are the short conv's kernel size (``sliding_window``), ``num_kv_heads`` packed heads of
    ``head_size`` (K, V and two hidden chunks, padded to a power of two), no V, in the model dtype, which its
    constructor asserts is bfloat16."""
    if canonical_model_dtype(case.model_dtype) != "bfloat16":
        raise StartupError(f"sconv SWA cache supports bfloat16 only, got torch.{canonical_model_dtype(case.model_dtype)}",
                           where="vllm.models.inkling.nvidia.sconv_swa_attn.InklingConvState.__init__")
    assert layer.sliding_window is not None  # LayerConfig validates it for this kind
    return AttentionSpec(kind=SpecKind.SLIDING_WINDOW, block_size=layer.sliding_window, num_kv_heads=layer.num_kv_heads,
                         head_size=layer.head_size, head_size_v=0, dtype="bfloat16", sliding_window=layer.sliding_window,
                         is_draft=layer.is_draft)


DSV4_RECORD_BYTES = 584
"""DeepSeek V4's fp8_ds_mla record: 448 bytes of fp8 NoPE, 128 of bf16 RoPE, 8 of UE8M0 scales; its ``head_size``
stays the semantic 512 (``DeepseekV4Attention.get_kv_cache_spec``)."""
DSV4_FP8_DS_MLA_ALIGNMENT = 576
"""Bytes every DeepSeek V4 page is rounded up to in the fp8_ds_mla format (``_apply_alignment_padding``)."""
DSV4_SWA_BLOCK_SIZE = 64
"""``DeepseekV4SWACache(block_size=64)``: the default the attention layer leaves; independent of --block-size."""
DSV4_COMPRESSOR_BLOCK_SIZE = {4: 4, 128: 8}
"""``CompressorStateCache``'s own block size per compress ratio: pages that fit the attention block they share."""


DSV41_SWA_BLOCK_SIZE = 32
"""``DeepseekV4SWACache(block_size=32)`` as DeepSeek V4.1's attention builds it (V4 leaves the class default, 64)."""


def dsv41_writes_mxfp8(capability: tuple[int, int]) -> bool:
    """``_use_v41_mxfp8_kv_record``: on SM10x FlashMLA decodes DeepSeek V4.1's MXFP8 record; elsewhere V4's."""
    return capability[0] == 10


def dsv41_records(capability: tuple[int, int]) -> tuple[int, int]:
    """(bytes per token of a packed fp8_ds_mla record, the page alignment) DeepSeek V4.1 writes on a GPU of this
    capability: the MXFP8 record of 512 fp8 dims and 16 UE8M0 scales, pages already 512-byte multiples; else V4's
    584-byte record and 576-byte pages."""
    return (528, 512) if dsv41_writes_mxfp8(capability) else (DSV4_RECORD_BYTES, DSV4_FP8_DS_MLA_ALIGNMENT)


def dsv41_compressor_ring(num_speculative_tokens: int = 0) -> int:
    """``CompressorStateCache``'s ring (models/deepseek_v41/compressor.py): the drafts, the bonus token and the
    previous row, as a power of two of at least 8. The drivers build layers under a config without a speculative
    config, so the ring counts no drafts."""
    rows = num_speculative_tokens + 2
    return max(8, 1 << (rows - 1).bit_length())


def _deepseek_v41_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """DeepSeek V4.1's caches on FlashMLA in the fp8_ds_mla format (``models/deepseek_v41/attention.py``), one latent
    state per position:

    - ``DeepseekV4Attention`` (a kv source): an ``MLAAttentionSpec`` of one packed record per ``compress_ratio``
      tokens (``state_content_bytes``), uint8, ``--block-size`` tokens, pages aligned to the record's alignment, no TP
      shard count;
    - ``DeepseekV4IndexerCache``: an ``MLAAttentionSpec`` of ``head_size`` uint8 bytes per state at the layer's ratio,
      the same page alignment (it shares a block with the main cache), no block-stride alignment (the sparse-logits
      path that sets one is off by default);
    - ``DeepseekV4SWACache``: a ``SlidingWindowMLASpec`` of packed records, 32-token blocks, one TP shard; on SM10x its
      block stride is a multiple of ``lcm(swa, compressed)`` record bytes (FlashMLA reads the interleaved records as
      rows of the whole cache); ``bounded_replay`` is the runner's (``_customized_specs``);
    - ``CompressorStateCache``: a ``CircularBufferSpec`` ring of fp32 [kv, score] rows (``head_size`` floats)."""
    record, alignment = dsv41_records(case.capability)
    if layer.kind == "dsv4_compressor_state":
        return AttentionSpec(kind=SpecKind.CIRCULAR_BUFFER, block_size=dsv41_compressor_ring(), num_kv_heads=1,
                             head_size=layer.head_size, head_size_v=0, dtype="float32", is_draft=layer.is_draft)
    common = dict(num_kv_heads=1, head_size=layer.head_size, head_size_v=0, dtype="uint8", alignment=alignment,
                  is_draft=layer.is_draft)
    if layer.kind == "dsv4_attention":
        return AttentionSpec(kind=SpecKind.MLA, block_size=case.block_size, cache_dtype=layer.cache_dtype,
                             cache_dtype_str=layer.cache_dtype, kv_quant_mode=quant_mode(layer.cache_dtype),
                             tokens_per_state=layer.index_kpool or 1, state_content_bytes=record, **common)
    if layer.kind == "dsv4_indexer":
        return AttentionSpec(kind=SpecKind.MLA, block_size=case.block_size, tokens_per_state=layer.index_kpool or 1,
                             **common)
    return AttentionSpec(kind=SpecKind.SLIDING_WINDOW_MLA, block_size=DSV41_SWA_BLOCK_SIZE, cache_dtype=layer.cache_dtype,
                         cache_dtype_str=layer.cache_dtype, kv_quant_mode=quant_mode(layer.cache_dtype),
                         sliding_window=layer.sliding_window, state_content_bytes=record, max_tp_shards=1,
                         # lcm(the SWA record, the compressed record): one record in fp8_ds_mla.
                         block_stride_alignment=record if dsv41_writes_mxfp8(case.capability) else None, **common)


def _deepseek_v4_spec(case: CaseConfig, layer: LayerConfig) -> AttentionSpec:
    """DeepSeek V4's caches in the fp8_ds_mla format, one latent head each, one TP shard (``max_tp_shards=1``),
    every page rounded up to 576 bytes (``alignment``, applied by the spec itself, on every copy too):

    - ``DeepseekV4Attention``: an ``MLAAttentionSpec`` of one 584-byte record per ``compress_ratio`` tokens, uint8,
      ``--block-size`` tokens;
    - ``DeepseekV4SWACache``: a ``SlidingWindowMLASpec`` of 584-byte records, 64-token blocks;
    - ``DeepseekV4IndexerCache``: an ``MLAAttentionSpec`` of ``head_size`` uint8 bytes per 4 tokens, no
      cache_dtype_str (in the sparse role, not V3.2's indexer role);
    - ``CompressorStateCache``: a ``SlidingWindowMLASpec`` of fp32 states (``head_size`` floats), 4-token blocks
      and a window of 8 for ratio 4 (overlapping), 8-token blocks and a window of 128 for ratio 128."""
    common = dict(num_kv_heads=1, head_size=layer.head_size, head_size_v=0, max_tp_shards=1, is_draft=layer.is_draft,
                  alignment=DSV4_FP8_DS_MLA_ALIGNMENT)
    if layer.kind == "dsv4_attention":
        spec = AttentionSpec(kind=SpecKind.MLA, block_size=case.block_size, dtype="uint8", cache_dtype=layer.cache_dtype,
                             cache_dtype_str=layer.cache_dtype, kv_quant_mode=quant_mode(layer.cache_dtype),
                             tokens_per_state=layer.index_kpool or 1, state_content_bytes=DSV4_RECORD_BYTES, **common)
    elif layer.kind == "dsv4_swa":
        spec = AttentionSpec(kind=SpecKind.SLIDING_WINDOW_MLA, block_size=DSV4_SWA_BLOCK_SIZE, dtype="uint8",
                             cache_dtype=layer.cache_dtype, cache_dtype_str=layer.cache_dtype,
                             kv_quant_mode=quant_mode(layer.cache_dtype), sliding_window=layer.sliding_window,
                             state_content_bytes=DSV4_RECORD_BYTES, **common)
    elif layer.kind == "dsv4_indexer":
        spec = AttentionSpec(kind=SpecKind.MLA, block_size=case.block_size, dtype="uint8",
                             tokens_per_state=layer.index_kpool or 1, **common)
    else:
        ratio = layer.index_kpool or 4
        spec = AttentionSpec(kind=SpecKind.SLIDING_WINDOW_MLA, block_size=DSV4_COMPRESSOR_BLOCK_SIZE[ratio],
                             dtype="float32", sliding_window=(1 + (ratio == 4)) * ratio, **common)
    return spec


def _customized_spec(case: CaseConfig, layer: LayerConfig, backend_name: str) -> LayerSpec:
    backend = bk.get_backend(backend_name)
    if layer.kind == "mamba":
        if not backend.is_ssm:
            raise ConfigError(f"layer {layer.name!r}: mamba layers need a state-space backend, got {backend_name}")
        return raw_spec(case, layer, backend)
    spec = raw_spec(case, layer, backend)
    if layer.kind not in LAYER_OWN_BACKENDS and layer.family not in FAMILY_BACKENDS:
        bk.check_backend_accepts(backend, spec, layer.name)  # a layer naming its backend is not validated
    if not holds(STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, case.vllm_version):
        return bk.customize_spec(backend, spec)  # the runners' get_kv_cache_spec before 0.32
    return bk.customize_attention_spec(backend, spec, case.capability)


def _customized_specs(case: CaseConfig, runner: str) -> tuple[dict[str, LayerSpec], dict[str, str]]:
    specs: dict[str, LayerSpec] = {}
    backends: dict[str, str] = {}
    # Real models repeat a handful of layer geometries many times: derive each once.
    memo: dict[tuple, LayerSpec] = {}
    for layer in case.layers:
        name = layer_backend(case, layer, runner)
        _check_layer_backend(case, layer, name)
        backends[layer.name] = name
        if layer.kind == "encoder_only":
            continue  # EncoderOnlyAttention.get_kv_cache_spec: None (no KV cache)
        key = (name,) + tuple(getattr(layer, f) for f in _GEOMETRY_FIELDS)
        spec = memo.get(key)
        if spec is None:
            spec = memo[key] = _customized_spec(case, layer, name)
            if layer.family == "deepseek_v41" and layer.kind == "dsv4_swa" and runner == "mrv2":
                # DeepseekV4Attention.__init__ (models/deepseek_v41/attention.py): --swa-bounded-replay (on by default)
                # keeps the window out of prefix caching, on MRv2 only (only it skips replayed tokens' writes).
                spec = memo[key] = replace(spec, bounded_replay=True)
        specs[layer.name] = spec
    return specs, backends


_GEOMETRY_FIELDS = tuple(f.name for f in fields(LayerConfig) if f.name != "name")


def _check_layer_backend(case: CaseConfig, layer: LayerConfig, backend: str) -> None:
    """What refuses a layer while it is built: the impl's constructor (B12X's
    ``--block-size``), and the platform's selection of a backend that does not support
    the layer's attention type (``AttentionBackend.supports_attn_type``, checked by
    ``validate_configuration``: cross-attention and encoder-only layers are restricted) or PCP
    (``supports_pcp``: only MLA impls)."""
    info = bk.get_backend(backend)
    if info.runs_on is not None and case.capability[0] not in info.runs_on[0]:
        raise StartupError(info.runs_on[1], where=f"vllm/{info.source}: the impl's constructor")
    if info.sliding_window_refusal is not None and layer.sliding_window is not None and layer.kind == "sliding_window_mla":
        raise StartupError(info.sliding_window_refusal, where=f"vllm/{info.source}: the impl's constructor")
    if info.required_block_sizes is not None and case.block_size not in info.required_block_sizes:
        raise StartupError(
            f"{backend.lower()} requires --block-size in {info.required_block_sizes}, got {case.block_size}.",
            where=f"vllm/{info.source}: the impl's constructor",
        )
    reasons = []
    if layer.kind == "cross" and not info.supports_cross_attention:
        reasons.append("attention type AttentionType.ENCODER_DECODER not supported")
    if layer.kind == "encoder_only" and not info.supports_encoder_only:
        reasons.append("attention type AttentionType.ENCODER_ONLY not supported")
    if (case.prefill_context_parallel_size > 1 and layer.kind not in LAYER_OWN_BACKENDS and layer.kind != "mamba"
            and not info.supports_pcp):
        # AttentionBackend.validate_configuration(use_pcp=...): under PCP only MLA impls qualify
        # (a state layer picks its backend without the attention selector).
        reasons.append("PCP not supported")
    if not reasons:
        _check_flash_attn_cache_dtype(case, layer, backend)
        return
    explicit = case.speculative_attention_backend if layer.is_draft else case.attention_backend
    if explicit:
        message = f"Selected backend AttentionBackendEnum.{backend} is not valid for this configuration. Reason: {reasons}"
    else:
        message = f"No valid attention backend found: {backend}: {reasons}"
    raise StartupError(message, where="vllm.v1.attention.selector.get_attn_backend (the platform's get_attn_backend_cls)")


def _check_flash_attn_cache_dtype(case: CaseConfig, layer: LayerConfig, backend: str) -> None:
    """``FlashAttentionImpl.__init__`` refuses a quantized cache its FlashAttention version cannot read
    (``fa_utils.flash_attn_supports_kv_cache_dtype``, asked with head_size_v = head_size): never fp8_e5m2; on SM90
    FA3 reads fp8; on SM100 only FA4 does, which runs head sizes up to 128 there (a wider head falls back to FA2, and
    so does FA4's head-256 kernel under a quantized cache); elsewhere FA2, which reads none."""
    if backend != "FLASH_ATTN" or quant_mode(layer.cache_dtype) == "NONE":
        return
    major = case.capability[0]
    if layer.cache_dtype != "fp8_e5m2" and (major == 9 or (major == 10 and layer.head_size <= 128)):
        return
    raise StartupError(f"FlashAttention does not support {layer.cache_dtype} kv-cache on this device.",
                       where="vllm/v1/attention/backends/flash_attn.py: FlashAttentionImpl.__init__")


def _resolve_layout(case: CaseConfig, specs: dict[str, LayerSpec], backends: dict[str, str]) -> KVCacheLayout:
    declared = [(name, bk.get_backend(name).supported_layouts(case.capability)) for name in dict.fromkeys(backends.values())]
    candidates = supported_layouts(declared)
    hnc = {(s.num_heads, s.num_states, s.page_size_bytes) for s in specs.values()}
    # ModelConfig.use_mla: the model's attention, not a spec's class (extract_hidden_states' cache
    # is an MLAAttentionSpec beside a model that is not MLA).
    use_mla = any(s.kind in (SpecKind.MLA, SpecKind.SLIDING_WINDOW_MLA) for s in specs.values() if not s.is_draft)
    connector_layout = None
    if case.connector in _CONNECTOR_LAYOUT and not (use_mla and case.connector in ("nixl", "mooncake")):
        connector_layout = _CONNECTOR_LAYOUT[case.connector]
    return resolve_layout(candidates, mixed_hnc=len(hnc) > 1, env_layout=case.layout, connector_layout=connector_layout)


def _kernel_sizes_of(backend: str, spec: LayerSpec, case: CaseConfig):
    return backend, bk.get_backend(backend).supported_kernel_block_sizes(
        spec if isinstance(spec, AttentionSpec) else None, case.capability, gqa=not spec.kind.is_mla
    )


def prepare_kernel_block_sizes(
    case: CaseConfig, kv_plan: KVCachePlan, backends: dict[str, str], only: frozenset[str] | None = None
) -> tuple[int, ...]:
    """``prepare_kernel_block_sizes``: per group, the size every backend of the group accepts.

    ``only``: the attention groups are built from these layers alone (MRv2's speculator:
    ``init_attn_backend(active_layer_names=...)``); a group left without layers keeps
    its block size (``select_common_block_size`` over no backends).
    """
    sizes = []
    for gid, group in enumerate(kv_plan.groups):
        spec = first_layer_spec(group.spec)
        if isinstance(spec, MambaSpec):
            sizes.append(spec.block_size)
            continue
        members = set(group.layer_names)
        packed = any(t.block_stride > t.layer_stride for t in kv_plan.tensors if t.layers[0] in members)
        if packed and holds(PACKED_GROUPS_KEEP_MANAGER_BLOCKS, case.vllm_version):
            sizes.append(group.spec.block_size)
            continue
        attn_groups = dict.fromkeys(
            (backends[n], layer_spec_of(group.spec, n)) for n in group.layer_names if only is None or n in only
        )
        sizes.append(
            select_common_block_size(
                group.spec.block_size, [_kernel_sizes_of(b, s, case) for b, s in attn_groups]
            )
        )
    return tuple(sizes)


def _check_release_builders(case: CaseConfig, d_plan: KVCachePlan, backends: dict[str, str]) -> None:
    """A release's metadata-builder refusals that come before the views are made (0.29:
    ``FLASHINFER_SM90_REFUSES_SLIDING_WINDOW``, whose builder exists before the KV cache tensors)."""
    if not holds(FLASHINFER_SM90_REFUSES_SLIDING_WINDOW, case.vllm_version) or tuple(case.capability) != (9, 0):
        return
    # The builder reads each layer's own window (get_per_layer_parameters: window_left), whatever
    # spec its group ended with (a window no shorter than the model is promoted to full attention).
    windowed = {layer.name for layer in case.layers if layer.kind == "sliding_window"}
    for group in d_plan.groups:
        for name in group.layer_names:
            if backends[name] == "FLASHINFER" and name in windowed:
                raise StartupError(
                    "FlashInfer backend on SM90 currently crashes with sliding-window attention layers. "
                    "Use the default attention backend.",
                    where="vllm.v1.attention.backends.flashinfer.FlashInferMetadataBuilder.__init__",
                )


def _check_metadata_builders(
    case: CaseConfig,
    d_plan: KVCachePlan,
    backends: dict[str, str],
    kernel_sizes: tuple[int, ...],
    views: dict[str, TensorView],
    draft_kernel_sizes: tuple[int, ...] | None = None,
) -> dict[str, int]:
    """``create_metadata_builders`` + ``map_kv_cache_to_kernel_blocks``: each backend's own pass.

    Returns the kernel block size each layer's metadata builder (and so its block table)
    uses; for draft layers that is the drafter's own attention group (MRv1
    ``drafter.initialize_attn_backend``, given the runner's kernel block sizes; MRv2
    ``speculator.set_attn``, which chooses its own: ``draft_kernel_sizes``).
    """
    drafts = {layer.name for layer in case.layers if layer.is_draft}
    layer_kinds = {layer.name: layer.kind for layer in case.layers}
    per_layer: dict[str, int] = {}
    for gid, group in enumerate(d_plan.groups):
        checked: dict[tuple, int] = {}
        for name in group.layer_names:
            spec = layer_spec_of(group.spec, name)
            if isinstance(spec, MambaSpec):
                continue
            backend = backends[name]
            base = draft_kernel_sizes[gid] if draft_kernel_sizes is not None and name in drafts else kernel_sizes[gid]
            key = (backend, spec, base)
            if key not in checked:
                checked[key] = select_common_block_size(base, [_kernel_sizes_of(backend, spec, case)])
                if layer_kinds[name] == "dsv4_indexer":
                    _check_indexer_builder(case)
                if layer_kinds[name] == "inkling_conv_state" and spec.kind is not SpecKind.SLIDING_WINDOW:
                    # --disable-hybrid-kv-cache-manager promoted the conv state to full attention beside Inkling's
                    # global layers; its builder takes only its own window spec (a bare assert).
                    raise StartupError("AssertionError()", where="vllm.models.inkling.nvidia.sconv_swa_attn."
                                       "InklingSconvMetadataBuilder.__init__ (assert isinstance(kv_cache_spec, "
                                       "SlidingWindowSpec))")
            kbs = per_layer[name] = checked[key]
            if bk.get_backend(backend).power_of_two_builder_blocks and kbs & (kbs - 1):
                raise StartupError(
                    f"flex_attn_kv_block_size must be a power of 2 and divisible by flex_attn_block_n, got {kbs}, None",
                    where="vllm.v1.attention.backends.flex_attention.FlexAttentionMetadataBuilder._get_block_sizes",
                )
    return per_layer


def _check_kernel_views(d_plan: KVCachePlan, backends: dict[str, str], views: dict[str, TensorView],
                        per_layer: dict[str, int]) -> None:
    """``map_kv_cache_to_kernel_blocks`` in ``initialize_kv_cache_tensors``: a packed layout's
    block cannot be viewed as the kernel blocks a builder was given. Every builder exists
    before this (``initialize_metadata_builders`` comes first in both runners), so a builder's
    refusal, and MRv2's DCP check, come first whatever the layer order."""
    for group in d_plan.groups:
        for name in group.layer_names:
            spec = layer_spec_of(group.spec, name)
            kbs = per_layer.get(name)
            view = views[name]
            if kbs is not None and kbs != spec.block_size and view.shape[2] != spec.num_kernel_states(kbs):
                kernel_page = spec.num_kernel_states(kbs) * view.stride[2]
                if spec.tokens_per_state > 1 and view.shape[1] == 1 and view.stride[0] % kernel_page == 0:
                    # vLLM 0.33 maps a compressed cache (written from its block table) to kernel blocks through a
                    # strided view instead: kernel block j of block b is b * (block stride / kernel page) + j, the
                    # builder's block table expanded by that stride, the registered view kept in manager blocks.
                    raise NotModeledError(
                        f"layer {name!r}: a packed compressed cache ({spec.tokens_per_state} tokens per state) split "
                        f"into {kbs}-token kernel blocks through a strided view (vLLM 0.33's "
                        "AttentionGroup.map_kv_cache_to_kernel_blocks) is not modeled yet")
                raise StartupError(
                    f"{backends[name]} needs {kbs}-token kernel blocks, which packed {spec.block_size}-token KV "
                    f"cache blocks cannot be split into. Reduce --block-size to {kbs} or set "
                    "VLLM_KV_CACHE_LAYOUT to a layer-compact layout (e.g. LBNHC).",
                    where="vllm.v1.worker.utils.AttentionGroup.map_kv_cache_to_kernel_blocks",
                )


def _connector_kernel_block_size(case: CaseConfig, specs: dict[str, LayerSpec], backends: dict[str, str], cache_block_size: int) -> int | None:
    attn = dict.fromkeys(
        (backends[n], s) for n, s in specs.items() if isinstance(s, AttentionSpec)
    )
    if not attn:
        return None
    try:
        return select_common_block_size(cache_block_size, [_kernel_sizes_of(b, s, case) for b, s in attn])
    except StartupError:
        return None


def _unaligned_mamba(spec) -> bool:
    first = first_layer_spec(spec)
    return isinstance(first, MambaSpec) and first.mamba_cache_mode != "align"


def _check_prefix_alignment(case: CaseConfig, d_plan: KVCachePlan, scheduler_block: int, hash_block: int) -> None:
    """``resolve_kv_cache_block_sizes``' last check (vllm/v1/core/kv_cache_utils.py; read in 0.30.0 and 0.33.0): with
    several groups and block hashing on, a prefix-cache hit lands on the hash block (when aligned Mamba states allow
    hits inside a block: ``partial_hash_hits_enabled``) or on the scheduler block, and that boundary must cut no
    compressed state of a prefix-cacheable spec (``tokens_per_state`` > 1: a pooled indexer, QSA's compressed keys,
    DeepSeek V4's compressed caches)."""
    if len(d_plan.groups) <= 1 or any(_unaligned_mamba(g.spec) for g in d_plan.groups):
        return  # one group's hits land on its block; an unaligned Mamba group turns block hashing off
    # The engine core asks with the scheduler's config (generate_scheduler_kv_cache_config), where a uniform-type
    # group is its first layer's spec: a DeepSeek V4 C128 layer grouped behind C4 layers is not asked about.
    specs = [layer_spec_of(g.spec, g.layer_names[0]) for g in d_plan.groups]
    alignments = sorted({s.tokens_per_state for s in specs
                         if s.prefix_cacheable and getattr(s, "tokens_per_state", 1) > 1})
    dcp = case.decode_context_parallel_size
    partial = any(
        isinstance(s, MambaSpec) and s.mamba_cache_mode == "align"
        and (s.block_size > hash_block if dcp == 1 else s.block_size >= hash_block)
        for s in specs
    )
    boundary = hash_block if partial else scheduler_block
    if any(boundary % a for a in alignments):
        raise StartupError(
            f"Invalid prefix_match_unit={hash_block}; prefix-cache boundaries must align with each spec's per-state "
            f"compression. Got alignments={alignments}.",
            where="vllm.v1.core.kv_cache_utils.resolve_kv_cache_block_sizes",
        )


def _check_parallel_modeled(case: CaseConfig) -> None:
    """DCP refusals vLLM makes outside the layout code this reference follows."""
    if case.decode_context_parallel_size == 1:
        return
    windowed = ("sliding_window", "sliding_window_mla", "inkling_conv_state") if _dsv4_indexer_refuses_dcp(case) else (
        "sliding_window", "sliding_window_mla", "dsv4_swa", "inkling_conv_state")
    if any(layer.kind in windowed for layer in case.layers):
        raise NotModeledError(
            "sliding-window layers under DCP: vLLM refuses them at admission "
            "(SlidingWindowSpec.max_memory_usage_bytes: 'DCP not support sliding window.'), "
            "which the reference does not model"
        )
    if case.connector is not None:
        raise NotModeledError("KV connectors under DCP are checked by VllmConfig validation, not modeled")


def _dsv4_indexer_refuses_dcp(case: CaseConfig) -> bool:
    return (case.decode_context_parallel_size > 1 and holds(DSV4_INDEXER_REFUSES_DCP, case.vllm_version)
            and any(layer.kind == "dsv4_indexer" for layer in case.layers))


def _check_indexer_builder(case: CaseConfig) -> None:
    """The sparse indexer's metadata builder under DCP (``DeepseekV32IndexerMetadataBuilder.__init__``, built when
    its attention group's builders are, after that group's kernel block is chosen): each compressed state must live
    on one DCP rank, so the interleave (--cp-kv-cache-interleave-size, 1 in every case) must cover whole states, and
    never for DeepSeek V4."""
    if not _dsv4_indexer_refuses_dcp(case):
        return
    compressed = next(layer for layer in case.layers if layer.kind == "dsv4_indexer")
    raise StartupError(
        f"DCP with sparse indexer KV compression (compress_ratio={compressed.index_kpool}) requires "
        "--cp-kv-cache-interleave-size to be a multiple of it; DeepSeek-V4 is not supported.",
        where="vllm.v1.attention.backends.mla.indexer.DeepseekV32IndexerMetadataBuilder.__init__",
    )


def _check_model_runner_support(case: CaseConfig, runner: str) -> None:
    """The runner refuses a configuration before any layer is built: MRv1 at VllmConfig validation (PCP and, from
    0.33, a Step5 model: ``_get_v1_model_runner_unsupported_features`` lists them in that order, joined), MRv2 in its
    constructor's ``PCPManager.validate_config``. The drivers ask before building layers, so a hybrid's block-size
    negotiation comes after it here."""
    if runner == "mrv1" and holds(MRV1_REFUSES_STEP5, case.vllm_version) and any(l.family == "step5" for l in case.layers):
        features = ["prefill context parallel"] if case.prefill_context_parallel_size > 1 else []
        raise StartupError("Model Runner V1 does not support: " + ", ".join(features + ["Step5"]),
                           where="vllm/config/vllm.py: VllmConfig._validate_v1_model_runner")
    targets = [layer for layer in case.layers if not layer.is_draft]
    refusal = prefill_context_parallel_refusal(
        runner, case.prefill_context_parallel_size, case.decode_context_parallel_size,
        use_mla=any(layer.kind in ("mla", "sliding_window_mla") for layer in targets),
        is_encoder_decoder=any(layer.kind == "cross" for layer in case.layers),
        has_drafts=len(targets) != len(case.layers),
        # index_topk in the model's config: DeepSeek V3.2's sparse MLA, whose indexer cache is a layer.
        is_sparse_mla=any(layer.kind == "mla_indexer" for layer in targets),
    )
    if refusal is not None:
        raise StartupError(refusal[0], where=refusal[1])


_LAYERS_WITHOUT_IMPL = ("mamba", "mla_indexer", "circular_buffer", "minimax_indexer", *QSA_KINDS, *DSV4_KINDS)
"""Layer kinds with no attention ``impl`` (state-space mixers, DeepSeek V3.2's indexer cache, GLM-5-next's
tail ring: caches written by other modules' kernels), which ``check_attention_cp_compatibility`` skips."""


def _check_context_parallel_backends(case: CaseConfig, backends: dict[str, str]) -> None:
    """Both runners' ``check_attention_cp_compatibility`` (``v1/worker/cp_utils.py``), layer by
    layer: under PCP every layer's backend must support it (state and indexer layers included:
    each has a ``get_attn_backend``); under DCP every attention impl must return the softmax
    LSE during decode."""
    pcp, dcp = case.prefill_context_parallel_size, case.decode_context_parallel_size
    if pcp * dcp <= 1:
        return
    for layer in case.layers:
        backend = backends[layer.name]
        if pcp > 1 and not layer.is_draft and not bk.get_backend(backend).supports_pcp:
            raise StartupError(f"PCP requires attention backend support, but {backend} does not support PCP.",
                               where="vllm.v1.worker.cp_utils.check_attention_cp_compatibility")
        if dcp <= 1 or layer.kind in _LAYERS_WITHOUT_IMPL:
            continue
        if not bk.BACKENDS[backend].returns_lse:
            raise StartupError(
                "Decode Context Parallelism (DCP) requires attention implementations to return the "
                f"softmax LSE during decode, but the {backend} implementation does not. Try a different "
                "backend by setting --attention-backend or disable DCP.",
                where="vllm.v1.worker.cp_utils.check_attention_cp_compatibility",
            )


def _attention_free(case: CaseConfig, runner: str, backends: dict[str, str], layout: KVCacheLayout) -> Derivation:
    """A model whose every layer is encoder-only (BERT-like pooling models): no layer reports a spec, the
    engine core offers no memory and ``get_kv_cache_config_from_groups`` plans no group and one block of
    nothing. The encoder-only layers' metadata builders still exist, with ``cache_config.block_size``: MRv1
    appends an ``EncoderOnlyAttentionSpec`` group of them to its own copy of the config
    (``may_add_encoder_only_layers_to_kv_cache_config``), MRv2 builds them in ``EncoderOnlyModelState``."""
    # Both runners still check every attention impl for context parallelism (check_attention_cp_compatibility
    # iterates the model's Attention layers, encoder-only ones included).
    _check_context_parallel_backends(case, backends)
    encoder_only = {layer.name: case.block_size for layer in case.layers if layer.kind == "encoder_only"}
    return Derivation(
        case=case, runner=runner, layer_backends=backends, specs={}, layout=layout,
        plan=KVCachePlan(1, 0, (), (), layout), kernel_block_sizes=(), cache_block_size=case.block_size,
        scheduler_block_size=case.block_size, hash_block_size=case.block_size, connector_kernel_block_size=None,
        registered={}, builder_kernel_block_sizes=encoder_only, _geometry_inputs={},
    )


def derive(case: CaseConfig, runner: str = "mrv1") -> Derivation:
    """Run the reference pipeline; raises ConfigError, StartupError or NotModeledError."""
    if runner not in ("mrv1", "mrv2"):
        raise ConfigError(f"runner {runner!r} is not one of mrv1, mrv2")
    if case.generation != 2:
        raise NotModeledError("generation-1 cases are derived by reference.gen1, not reference.derive")
    _check_parallel_modeled(case)
    _check_model_runner_support(case, runner)
    given = case  # what the Derivation reports as its case (its replay line is the user's options)
    if _is_hybrid(case):
        # Engine start-up may raise --block-size for the state; in align mode the state's block is
        # the attention block, whatever --mamba-block-size said.
        negotiated, _ = hybrid_block_size(case, runner)
        case = replace(case, block_size=negotiated,
                       mamba_block_size=negotiated if case.mamba_cache_mode == "align" else case.mamba_block_size)
    specs, backends = _customized_specs(case, runner)
    layout = _resolve_layout(case, specs, backends)
    if not specs:
        return _attention_free(given, runner, backends, layout)
    groups = get_kv_cache_groups(dict(specs), layout, hybrid_manager=not case.disable_hybrid_kv_cache_manager,
                                 hidden_state_page_grows=holds(HIDDEN_STATE_PAGE_GROWS, case.vllm_version),
                                 sliding_window_packed_as_state=holds(SLIDING_WINDOW_PACKED_AS_STATE, case.vllm_version))
    # Grouping may rescale block sizes; the per-layer specs that matter from here on are
    # the grouped ones.
    kv_plan = plan(groups, layout, num_blocks=case.num_blocks, available_memory=case.kv_cache_memory_bytes,
                   memory_check_divides_by_page=not holds(STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, case.vllm_version))
    # The engine core resolves the scheduler and hash block sizes before any worker builds its runner's
    # attention backends (EngineCore._initialize_kv_caches -> resolve_kv_cache_block_sizes).
    cacheable = [first_layer_spec(g.spec).prefix_cacheable for g in kv_plan.groups]
    cache_block_size = min(
        [g.spec.block_size for g, c in zip(kv_plan.groups, cacheable) if c] or [g.spec.block_size for g in kv_plan.groups]
    )
    scheduler_block, hash_block = scheduler_block_sizes(
        (
            (g.spec.block_size, g.spec.dcp_sharded, c, _unaligned_mamba(g.spec))
            for g, c in zip(kv_plan.groups, cacheable)
        ),
        cache_block_size=cache_block_size,
        decode_context_parallel_size=case.decode_context_parallel_size,
        one_replicated_group_unscaled=holds(ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK, case.vllm_version),
    )
    _check_prefix_alignment(case, kv_plan, scheduler_block, hash_block)
    if runner == "mrv1":
        # MRv1 checks DCP support in initialize_attn_backend, before any builder exists.
        _check_context_parallel_backends(case, backends)
    kernel_sizes = prepare_kernel_block_sizes(case, kv_plan, backends)
    _check_release_builders(case, kv_plan, backends)
    views: dict[str, TensorView] = {}
    geometry: dict[str, tuple] = {}
    for tensor in kv_plan.tensors:
        gid = kv_plan.group_of(tensor.layers[0])
        spec = layer_spec_of(kv_plan.groups[gid].spec, tensor.layers[0])
        kbs = kernel_sizes[gid]
        packing = bk.get_backend(backends[tensor.layers[0]]).packing
        for view, byte_strides in create_views(tensor, spec, gid, kv_plan.num_blocks, layout, kbs):
            views[view.name] = view
            geometry[view.name] = (view, byte_strides, spec, packing, spec.block_size // kbs)
    drafts = frozenset(layer.name for layer in case.layers if layer.is_draft)
    # MRv2's speculator picks the drafts' kernel block size over the draft layers alone
    # (speculator.set_attn -> init_attn_backend(active_layer_names=drafts)).
    draft_kernel_sizes = prepare_kernel_block_sizes(case, kv_plan, backends, only=drafts) if runner == "mrv2" and drafts else None
    builder_sizes = _check_metadata_builders(case, kv_plan, backends, kernel_sizes, views, draft_kernel_sizes)
    # Encoder-only layers beside KV cache layers (ColQwen3.5 interleaves them with Gated DeltaNet layers): no group
    # of theirs, but their metadata builders exist, over cache_config.block_size as engine start-up left it (MRv1's
    # may_add_encoder_only_layers_to_kv_cache_config, MRv2's EncoderOnlyModelState).
    builder_sizes.update({layer.name: case.block_size for layer in case.layers if layer.kind == "encoder_only"})
    if runner == "mrv2":
        # MRv2's initialize_kv_cache checks it after init_attn_backend built the metadata
        # builders (gpu/model_runner.py: check_attention_cp_compatibility follows it), so
        # a builder's refusal comes first there.
        _check_context_parallel_backends(case, backends)
    _check_kernel_views(kv_plan, backends, views, builder_sizes)
    # EngineCore._initialize_kv_caches: cache_config.block_size is the smallest block of the
    # prefix-cacheable groups (a circular buffer's ring is not one), of every group if none is
    # (cache_block_size, above).
    grouped_specs = {n: layer_spec_of(g.spec, n) for g in kv_plan.groups for n in g.layer_names}
    return Derivation(
        case=given,
        runner=runner,
        layer_backends=backends,
        specs=grouped_specs,
        layout=layout,
        plan=kv_plan,
        kernel_block_sizes=kernel_sizes,
        cache_block_size=cache_block_size,
        scheduler_block_size=scheduler_block,
        hash_block_size=hash_block,
        connector_kernel_block_size=_connector_kernel_block_size(case, grouped_specs, backends, cache_block_size),
        registered=views,
        builder_kernel_block_sizes=builder_sizes,
        _geometry_inputs=geometry,
    )


__all__ = ["Derivation", "derive", "layer_backend", "quant_mode"]
