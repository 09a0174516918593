"""The one registry of vLLM release facts: which releases the reference models, and every fact
that differs between them.

Each fact is a ``Fact``: the release it holds from (``since``), its value, and where it was
read (``source``); a series of them, oldest first, says what holds at any release.
``reference.derive`` models the target release (``TARGET_RELEASE``); ``reference.gen1``
models generation 1 and reads its per-release facts here. Adding a release, or a fact that
changes at one, is an edit here plus its test (``tests/reference/test_releases.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, Mapping, Sequence, TypeVar

from reference.errors import ConfigError, NotModeledError
from reference.specs import KernelBlockSize, MultipleOf

Version = tuple[int, int, int]
T = TypeVar("T")


# --- versions ------------------------------------------------------------------------------


def parse_version(text: str) -> Version:
    """``"0.22.1rc1.dev116+g71df063c4"`` -> ``(0, 22, 1)``; the release part only."""
    if not isinstance(text, str):
        raise ConfigError(f"vLLM version {text!r} is not a string like '0.21.0'")
    body = text[1:] if text.startswith("v") else text
    parts: list[int] = []
    for piece in body.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break  # "1rc1": the release number ends here
    if len(parts) < 2:
        raise ConfigError(f"vLLM version {text!r} is not of the form MAJOR.MINOR[.PATCH]")
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def parse_release(text: str) -> Version:
    """``"0.32.1.dev3+cpu"`` -> ``(0, 32, 1)`` (``parse_version``, by its older name)."""
    return parse_version(text)


def format_version(version: Version) -> str:
    """``(0, 33, 0)`` -> ``"0.33.0"``."""
    return ".".join(map(str, version))


def format_series(version: Version) -> str:
    """``(0, 28, 0)`` -> ``"0.28.x"``: every patch release of ``version``'s minor."""
    return f"{version[0]}.{version[1]}.x"


def _minor(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


# --- record types ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact(Generic[T]):
    """One fact about vLLM that holds from ``since`` on, until the next fact of its series."""

    since: Version
    """The first release it holds in."""
    value: T
    """What holds: a layout, kernel block sizes, or whether a behaviour is there."""
    source: str
    """Where it was read (vLLM source, issue or pull request, or a release observed)."""


@dataclass(frozen=True)
class ReleaseSpan:
    """The releases a generation's facts cover: ``first`` to just before ``end``."""

    first: Version
    """The oldest release the facts hold for."""
    end: Version
    """The first release after the newest one they hold for."""
    source: str
    """How the bounds were established."""


@dataclass(frozen=True)
class Gen1Layout:
    """Generation 1 (vLLM < 0.30): ``get_kv_cache_shape`` and ``get_kv_cache_stride_order``."""

    shape: str
    """``"2BNHD"`` (FA: ``(2, B, N, H, D)``), ``"B2NHD"`` (FlashInfer) or ``"BND"`` (MLA)."""
    stride_order_nhd: tuple[int, ...]
    stride_order_hnd: tuple[int, ...]


def fact_at(series: Sequence[Fact[T]], version: Version) -> Fact[T] | None:
    """The latest fact of ``series`` that has started at ``version``; None before the first."""
    started = [fact for fact in series if version >= fact.since]
    return max(started, key=lambda fact: fact.since) if started else None


def holds(series: Sequence[Fact[bool]], vllm_version: str | Version) -> bool:
    """Whether the behaviour ``series`` describes is there at ``vllm_version`` (not before its first fact)."""
    if isinstance(vllm_version, str):
        version = parse_version(vllm_version)
    elif isinstance(vllm_version, tuple):
        version = vllm_version
    else:
        raise ConfigError(f"vLLM version {vllm_version!r} is not a string like '0.33.0'")
    fact = fact_at(series, version)
    return fact is not None and fact.value


# --- the target release --------------------------------------------------------------------

TARGET_RELEASE = "0.33.0"
"""The release ``reference.derive`` and the backend table model; ``scripts/env.sh`` installs it and
``pyproject.toml`` allows up to its next minor (``tests/reference/test_releases.py`` checks both)."""
_TARGET: Version = parse_version(TARGET_RELEASE)


# --- generation 1: per-backend get_kv_cache_shape ------------------------------------------

GEN1 = ReleaseSpan(
    (0, 19, 0),
    (0, 29, 0),
    "first: 0.19.1 and 0.20.0 were read with scripts/probe_backend_facts.py (every backend's shape, stride orders "
    "and kernel block sizes) and checked case by case in their release venvs (tests/releases). end: 0.29.0 no "
    "longer asks backends for shapes (read off its wheel: vllm/v1/kv_cache_layout.py and "
    "vllm/v1/worker/utils.py: allocate_kv_cache are there, FlashAttentionBackend has no get_kv_cache_shape), as a "
    "downstream port note's '0.29.0 (from 0.28.0)' entry said. The backend "
    "table's generation-1 shapes and orders: vllm/v1/attention/backends/{flash_attn,flashinfer,triton_attn,"
    "flex_attention}.py and mla/*.py (the stored flash_attn.py is older than 0.21 but has the gen-1 shape and the "
    "NHD/HND orders); the rest follows shared/research (feasibility-cpu.md section 9, vllm-specs-backends.md "
    "section 3.4, connectors.md sections 1.4 and 4)",
)
GEN1_FIRST: Version = GEN1.first
GEN1_END: Version = GEN1.end
GEN2_FIRST: Version = GEN1_END
"""The first ``KVCacheLayout`` release (generation 2)."""

MRV2_KERNEL_BLOCKS: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/gpu/attn_utils.py _reshape_kv_cache (read from a public copy of 0.21): no kernel_block_sizes; "
         "get_kv_cache_shape(num_blocks, storage_block_size, ...), identity order on NotImplementedError, "
         ".view(dtype).view(permuted).permute(inv_order) (vLLM issue #42846, fixed by #42766); observed on 0.19.1, "
         "0.20.0 and 0.21.0"),
    Fact((0, 22, 0), True,
         "gpu/attn_utils.init_kv_cache(..., kernel_block_sizes, vllm_config) appears in 0.22 (feasibility-cpu.md "
         "section 9; read from a public copy of 0.22): MRv2 reshapes with kernel blocks like MRv1"),
)
"""Whether MRv2 views its KV cache in kernel blocks (before: in logical blocks)."""

_ID5, _HND5 = (0, 1, 2, 3, 4), (0, 1, 3, 2, 4)
_B2NHD = Gen1Layout("B2NHD", _ID5, _HND5)
_PACKED_026 = Fact(
    (0, 26, 0),
    # Packed (B, H, N, 2D): NHD keeps tokens outside heads physically, HND is the identity.
    Gen1Layout("BHNC", (0, 2, 1, 3), (0, 1, 2, 3)),
    "observed on vLLM 0.26.0, 0.27.0 and 0.28.0 (gpu_impl/vllm_cpu/backend_facts.py): vLLM #44455 packed K|V into "
    "the content dim, (num_blocks, H, block_size, 2*D), stride order (0, 2, 1, 3) under NHD and the identity "
    "under HND (0.25.0 still splits K/V; kvcached#493 and a 0.28 connector's notes agree)",
)

GEN1_LAYOUT_OVERRIDES: dict[str, tuple[Fact[Gen1Layout | None], ...]] = {
    # The table's FA entry ("2BNHD") holds only up to 0.22.x.
    "FLASH_ATTN": (
        Fact(
            (0, 23, 0),
            _B2NHD,
            "vLLM #42095 (blocks-first layouts); FlexKV#187 ('vLLM 0.23 changed ... from (kv, "
            "num_block, ...) to (num_block, kv, ...)'); tair-kvcache#257 (<= 0.22.1 is (2, B, N, H, D)); "
            "vLLM #47314 (FA HND keeps logical (B, 2, N, H, D))",
        ),
        _PACKED_026,
    ),
    "FLASHINFER": (_PACKED_026,),
    # Triton honours HND in the table; that holds from the #37940 fix of issue #37703
    # (reported on 0.17.2), whose regression test asserts every 5-D backend puts heads
    # before tokens under HND.
    "TRITON_ATTN": (
        Fact(GEN1_FIRST, Gen1Layout("B2NHD", _ID5, _ID5),
             "observed on vLLM 0.19.1: TritonAttentionBackend.get_kv_cache_stride_order() is the identity under "
             "HND too (issue #37703, fixed by #37940 in 0.20.0; the stored triton_attn.py is older still, with no "
             "stride order)"),
        Fact((0, 20, 0), _B2NHD, "observed on vLLM 0.20.0 to 0.25.0: HND puts heads before tokens (#37940)"),
        _PACKED_026,
    ),
    # The table gives Flex FA's HND order; before 0.23 the runner's `except (AttributeError,
    # NotImplementedError)` fallback used the identity for HND too.
    "FLEX_ATTENTION": (
        Fact(GEN1_FIRST, Gen1Layout("2BNHD", _ID5, _ID5),
             "observed on vLLM 0.19.1 to 0.22.0: get_kv_cache_stride_order raises NotImplementedError (identity)"),
        Fact((0, 23, 0), Gen1Layout("B2NHD", (0, 2, 1, 3, 4), (0, 2, 1, 3, 4)),
             "observed on vLLM 0.23.0 to 0.25.0 (gpu_impl/vllm_cpu/backend_facts.py): blocks-first "
             "(num_blocks, 2, block_size, H, D) with stride order (0, 2, 1, 3, 4) under NHD and HND alike "
             "(#42095: tokens outside K/V, the layout is ignored)"),
        Fact(
            (0, 26, 0),
            Gen1Layout("BHNC", (0, 2, 1, 3), (0, 2, 1, 3)),
            "observed on vLLM 0.26.0 to 0.28.0: packed (num_blocks, H, block_size, 2*D), stride order (0, 2, 1, 3) "
            "whatever the layout (as the stored flex_attention.py of the packed era)",
        ),
    ),
}
"""Where the backend table's generation-1 layout (``reference.backends``) does not hold for every generation-1 release: per backend, the layout from
each ``since`` on; a value of None: known to differ but not established (refused)."""

GEN1_KERNEL_BLOCK_SIZES: dict[str, tuple[Fact[tuple[KernelBlockSize, ...] | None], ...]] = {
    "FLASHINFER": (
        Fact(GEN1_FIRST, (16, 32, 64), "vllm/v1/attention/backends/flashinfer.py of 0.19.1 to 0.23.0: "
             "FlashInferBackend.get_supported_kernel_block_sizes() returns [16, 32, 64] on every capability "
             "(observed on SM100 too)"),
        Fact((0, 24, 0), None, "vLLM 0.24.0's FlashInferBackend.get_supported_kernel_block_sizes adds 128 to 1024 where "
             "the model can use TRT-LLM attention (GQA on SM100: can_use_trtllm_attention), as the table; observed"),
    ),
    "FLEX_ATTENTION": (
        Fact(GEN1_FIRST, (MultipleOf(1),), "observed on vLLM 0.19.1 and 0.20.0: [MultipleOf(1)]"),
        Fact((0, 21, 0), None, "observed on vLLM 0.21.0 and 0.22.0: [MultipleOf(16)], as the table"),
    ),
}
"""A backend's ``get_supported_kernel_block_sizes()`` from each ``since`` on; None: the backend
table's (the target release's) again."""

MOONCAKE_KERNEL_SYNC: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "observed on vLLM 0.19.1: MooncakeConnectorWorker.register_kv_caches asserts "
         "self.block_size == cache.shape[-2 if self.use_mla else -3]"),
    Fact((0, 20, 0), True,
         "vLLM #39596 ('[Mooncake] Fix mixed MLA+Eagle block-size validation', in 0.20.0) removed that assert and "
         "added _sync_block_size_with_kernel (the worker's block size becomes select_common_block_size over the "
         "backends); observed on 0.20.0"),
)
"""Whether Mooncake's worker takes its block size from the kernel block sizes (before: the
configured block size, checked against the registered shape)."""


def check_gen1_version(text: str) -> Version:
    """The parsed version, or an error saying why generation 1 does not model it."""
    v = parse_version(text)
    if v >= GEN2_FIRST:
        raise ConfigError(
            f"vLLM {text} is generation 2 (>= {format_version(GEN2_FIRST)}); generation 1 covers "
            f"{format_version(GEN1_FIRST)} to {format_series((0, GEN1_END[1] - 1, 0))}"
        )
    if v < GEN1_FIRST:
        raise NotModeledError(f"vLLM {text} is older than {format_version(GEN1_FIRST)}, the oldest release modeled")
    return v


# --- generation 2: KVCacheLayout -----------------------------------------------------------

GEN2 = ReleaseSpan(
    GEN2_FIRST,
    (_TARGET[0], _TARGET[1] + 1, 0),
    "first: 0.29.0, 0.30.0, 0.31.0 and 0.32.0 were run through the same drivers (kvconform run --profile ci in "
    "scripts/release_env.sh X's venv: 1,063 cases, both runners, their own code, request schedules included) and "
    "differ from the target release only where GEN2_DIFFERENCES says (0.29.0's own: the sliding-window block "
    "size, FlashInfer's SM90 window refusal, the hidden-state page; its Mamba pages were a misread of its "
    "MambaSpec, which has no real_page_size_bytes). end: the target release's next minor",
)
GEN2_FACTS_FROM: Version = GEN2.first
GEN2_FACTS_UNTIL: Version = GEN2.end

PACKED_GROUPS_KEEP_MANAGER_BLOCKS: tuple[Fact[bool], ...] = (
    Fact(GEN2_FACTS_FROM, False,
         "vLLM 0.30.0 and 0.31.0, vllm/v1/worker/utils.py: prepare_kernel_block_sizes gives every attention group "
         "select_common_block_size(manager block, backends); vllm/v1/kv_cache_interface.py: create_kv_cache_views then "
         "refuses to split a block-outermost (packed) block: 'The resolved KV cache layout (BLHNC) does not store blocks "
         "as dense, unpadded pages (block stride S != page P), so a manager block cannot be split into R kernel blocks "
         "of K tokens...'; observed on 0.29.0, 0.30.0 and 0.31.0 (flashinfer-b128-blhnc-packed, both runners)"),
    Fact((0, 32, 0), True,
         "vllm/v1/worker/utils.py: prepare_kernel_block_sizes keeps the manager block size for a group whose tensors "
         "are block-outermost (t.block_stride > t.layer_stride), so the views are made whole and the metadata builder "
         "refuses instead (AttentionGroup.map_kv_cache_to_kernel_blocks: '<BACKEND> needs K-token kernel blocks, which "
         "packed B-token KV cache blocks cannot be split into...'); observed on 0.32.0 and 0.33.0"),
)
"""Whether a group whose tensors store blocks outermost keeps the manager block size as its kernel block
size (the builder then refuses a split); before, the views were made in kernel blocks and refused there."""

STRIDE_ALIGNMENT_FROM_KERNEL_SIZES: tuple[Fact[bool], ...] = (
    Fact(GEN2_FACTS_FROM, False,
         "vLLM 0.30.0 and 0.31.0: the runners customize a layer's spec with the backend's customize_spec alone "
         "(vllm/v1/worker/gpu_model_runner.py: get_kv_cache_spec -> attn_module.get_attn_backend().customize_spec; "
         "vllm/v1/worker/gpu/attn_utils.py likewise; vllm.v1.worker.utils has no customize_attention_spec), so a "
         "FlashInfer draft's spec equals a Triton target's and MRv1 puts them in one FullAttentionSpec group and one "
         "tensor; observed on 0.31.0 (gqa+draft-attention-backend-b128, gqa+flex-draft-b48)"),
    Fact((0, 32, 0), True,
         "vllm/v1/worker/utils.py: customize_attention_spec sets block_stride_alignment = MultipleOf(the largest "
         "kernel block size) for a backend that takes only fixed sizes; observed on 0.32.0 and 0.33.0"),
)
"""Whether a layer's spec carries the stride alignment its backend's fixed kernel block sizes need
(``block_stride_alignment``), which keeps such a layer out of a group of other backends' layers."""

MRV2_SLIDING_WINDOW_REACH: tuple[Fact[bool], ...] = (
    Fact(GEN2_FACTS_FROM, False,
         "0.32.0's BlockTables gathers every block id of the row (observed: swa-hybrid-* cases through 0.32.0's own "
         "BlockTables keep the ids below the window); 0.30.0's and 0.31.0's vllm/v1/worker/gpu/block_table.py have "
         "no sliding_window_reach either (read off their wheels)"),
    Fact((0, 33, 0), True,
         "vllm/v1/worker/gpu/block_table.py: BlockTables(sliding_window_reach=...) is new in 0.33.0"),
)
"""Whether MRv2's ``BlockTables`` nulls the block ids below a sliding window."""

MRV1_MOVE_ROW_CLEARS_SOURCE: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/block_table.py BlockTable.move_row in 0.19.1 to 0.26.0 (read off their wheels) copies "
         "[:num_blocks] to the target and leaves the source row and its count as they were; observed on 0.19.1 and "
         "0.22.0 (gen1-triton-mla-b64: a row reused by add_row keeps its earlier occupant's ids past its own)"),
    Fact((0, 27, 0), True,
         "vLLM #49757 ('[BugFix] Stop dummy runs from writing mamba state through stale block-table rows', in "
         "0.27.0): move_row zeroes the vacated source row's [:num_blocks] and its count"),
)
"""Whether MRv1's ``BlockTable.move_row`` (``InputBatch.condense``) clears the row it moved from."""

MRV2_FREES_SLOTS_IN_ID_ORDER: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/gpu/model_runner.py finish_requests in 0.19.1 to 0.28.0 (read off their wheels): "
         "'for req_id in finished_req_ids' over finished | preempted, a set of strings, so the order the request "
         "slots return to RequestState.free_indices (a stack) follows the process's string hashes "
         "(PYTHONHASHSEED); observed on 0.19.1 and 0.22.0 (a later request takes the other freed slot)"),
    Fact((0, 29, 0), True,
         "vllm/v1/worker/gpu/model_runner.py in 0.29.0: 'for req_id in sorted(finished_req_ids)' ('Sorted so every "
         "TP rank frees request slots in the same order')"),
)
"""Whether MRv2 frees a step's finished requests' slots in request-id order (before: in set order,
so which free slot a later request takes is not determined by the schedule)."""

ATTENTION_PAGES_PADDED: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size in 0.19.1 to 0.23.0 (read off their wheels): "
         "a smaller page that does not divide the largest raises NotImplementedError('The page size of the layer is "
         "not divisible by the maximum page size. Cannot unify by adjusting block_size.')"),
    Fact((0, 24, 0), True,
         "vllm/v1/core/kv_cache_utils.py in 0.24.0: such an attention page is padded (page_size_padded) when its "
         "spec's indexes_kv_by_block_stride is set (the runners' get_kv_cache_spec sets it from the backend), "
         "else NotImplementedError('Layer ...: page size is not divisible by the maximum page size and cannot be "
         "padded')"),
)
"""Whether page-size unification pads an attention page that does not divide the largest one
(before: it refuses the model). Every generation-1 backend kvconform drives opts in
(``AttentionBackend.indexes_kv_by_block_stride()`` is true under NHD and HND for FLASH_ATTN,
FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, TRITON_MLA, FLASHMLA and, from 0.25, FLASHINFER_MLA:
observed on 0.24.0 to 0.28.0); the padded page is then viewed as ``PADDED_PAGE_VIEW`` says."""

PADDED_PAGE_VIEW: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False, "no padded attention pages before 0.24.0 (ATTENTION_PAGES_PADDED)"),
    Fact((0, 24, 0), True,
         "vllm/v1/worker/gpu/attn_utils.py _reshape_attention_kv_cache in 0.24.0 to 0.28.0 (both runners call it "
         "with num_blocks * blocks_per_kv_block): 'assert kv_cache_shape[0] == num_blocks' (a num-blocks-first "
         "layout), then torch.as_strided over the permuted shape's contiguous strides with the block dimension's "
         "stride replaced by page_size_bytes // dtype_size: each kernel block strided by a whole padded logical "
         "page (vllm-project/vllm#54877)"),
)
"""Whether a padded attention page is viewed with ``torch.as_strided``, each *kernel* block strided by
the padded *logical* page (the upstream bug #54877 where a block is split)."""

HYBRID_BLOCK_ALIGNMENT: tuple[Fact[str], ...] = (
    Fact(GEN1_FIRST, "fixed",
         "vllm/model_executor/models/config.py in 0.19.1 HybridAttentionMambaModelConfig.verify_and_update_config: "
         "kernel_block_alignment_size = 16 for attention (64 for MLA, 128 under --attention-backend CUTLASS_MLA); "
         "attn_block_size = alignment * cdiv(mamba_page_size, alignment * attn_page_size_1_token), raised over even a "
         "user-given --block-size; mamba_page_size_padded = the attention page where it is larger"),
    Fact((0, 20, 0), "backend",
         "vllm/platforms/interface.py in 0.20.0 to 0.26.0 Platform._align_hybrid_block_size (run by "
         "update_block_size_for_backend): the alignment is max(the smallest of the first non-SSM layer's backend's "
         "get_supported_kernel_block_sizes() (a MultipleOf's base), cache_config.block_size)"),
    Fact((0, 27, 0), "backend_mla_128",
         "vllm/platforms/interface.py in 0.27.0 and 0.28.0 _align_hybrid_block_size: as before, and for an MLA model "
         "max(alignment, 128) ('TRTLLM/FlashInfer MLA decode kernels require the physical number of kernel blocks to "
         "be aligned to 128 / kernel_block_size')"),
)
"""How a generation-1 release picks the attention block size of a hybrid (attention + Mamba) model:
the alignment its attention block is a multiple of, before the state's page is padded to the
attention page (``reference.gen1.hybrid_block_size``)."""

MAMBA_STATE_PAGE_VIEW: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/gpu_model_runner.py _reshape_kv_cache_tensors and vllm/v1/worker/gpu/attn_utils.py "
         "_reshape_kv_cache in 0.19.1 to 0.26.0 (MRv2 from 0.21.0): a Mamba layer's cache is a list of state tensors, "
         "torch.as_strided(raw.view(dtype), (num_blocks, *shape), (page_size_bytes // dtype_size, *contiguous), "
         "storage_offset = the bytes of the states before it // dtype_size)"),
    Fact((0, 27, 0), True,
         "the same functions in 0.27.0 and 0.28.0: 'a single contiguous [num_blocks, 1, 1, page_size_bytes] int8 "
         "page view per layer ... lets the KV connector register it without special-casing Mamba'"),
)
"""Whether a Mamba layer registers one int8 page view (before: a list of per-state tensors)."""

MAMBA_PAGE_PADDED_BY_UNIFY: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size in 0.19.1 to 0.27.0: a MambaSpec whose page is "
         "smaller than the largest is scaled like an attention spec (its block size times the ratio, the page unchanged: "
         "'assert new_spec.page_size_bytes == max_page_size' fails), or raises NotImplementedError where the page does "
         "not divide the largest; the block-size negotiation pads it beforehand"),
    Fact((0, 28, 0), True,
         "vllm/v1/core/kv_cache_utils.py in 0.28.0: 'Mamba layers, whose page size comes from state shapes and is "
         "independent of block size' are padded to the largest page (page_size_padded)"),
)
"""Whether page-size unification pads a Mamba page that is smaller than the largest one."""

HYBRID_LAYOUT_BY_SHAPE: Mapping[str, tuple[Fact[bool], ...]] = {
    "mrv1": (
        Fact(GEN1_FIRST, True,
             "vllm/v1/worker/gpu_model_runner.py _update_hybrid_attention_mamba_layout in 0.19.1: an attention cache "
             "whose shape[0] == 2 is taken for (2, num_blocks, ...) and restrided block-outermost (stride (hidden, "
             "2 * hidden, ...)), after 'assert kv_cache.shape[1] != 2' ('Fail to determine whether the layout is "
             "(2, num_blocks, ...) or (num_blocks, 2, ...)'): a view of 2 kernel blocks refuses (a bug: 'Loading large "
             "models forces num_blocks == 2', vllm-project/vllm#37236); observed on 0.19.1"),
        Fact((0, 20, 0), False,
             "the same method in 0.20.0 to 0.28.0 asks the backend (vllm-project/vllm#37236): "
             "get_kv_cache_block_dim(kernel_block_size, ...) == 1 is restrided, 0 is left"),
    ),
    "mrv2": (
        Fact(GEN1_FIRST, False,
             "vllm/v1/worker/gpu/attn_utils.py _reshape_kv_cache in 0.19.1 and 0.20.0: 'assert isinstance(kv_cache_spec, "
             "AttentionSpec)' (MRv2 has no Mamba then: MRV2_MAMBA)"),
        Fact((0, 21, 0), True,
             "vllm/v1/worker/gpu/attn_utils.py _update_hybrid_attention_layout in 0.21.0 and 0.22.0: shape[0] == 2, "
             "after 'assert kv_cache.shape[1] != 2' ('Cannot determine layout for tensor of shape ...'); observed on "
             "0.21.0"),
        Fact((0, 23, 0), False,
             "the same function in 0.23.0 to 0.26.0 asks get_kv_cache_block_dim (vllm-project/vllm#38831); 0.27.0 restrides no KV-first view "
             "(_align_mixed_attention_kv_cache_views only), 0.28.0 lays KV-first views sharing an allocation with "
             "Mamba page by page (_kv_first_layers_sharing_pool_with_mamba): every generation-1 backend is "
             "block-first by then, so none of these touches its views"),
    ),
}
"""Per runner, whether it finds the KV-first attention caches of a hybrid model by their shape
(``shape[0] == 2``, refusing where ``shape[1]`` is 2 too) rather than by the backend's block dimension."""

MRV2_MAMBA: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/gpu/attn_utils.py _reshape_kv_cache in 0.19.1 and 0.20.0: 'assert isinstance(kv_cache_spec, "
         "AttentionSpec)' for every layer; observed on 0.19.1 (AssertionError with no message)"),
    Fact((0, 21, 0), True,
         "vllm/v1/worker/gpu/attn_utils.py in 0.21.0: a MambaSpec layer gets its state views"),
)
"""Whether MRv2 builds the KV cache of a model with Mamba layers (before: it refuses at the reshape)."""

PROMOTED_WINDOW_KEEPS_ITS_BLOCK: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, True,
         "vllm/v1/core/kv_cache_utils.py unify_hybrid_kv_cache_specs in 0.19.1 to 0.26.0 (read off their wheels): "
         "with --disable-hybrid-kv-cache-manager a sliding-window layer becomes FullAttentionSpec(block_size="
         "spec.block_size, ...), its own block size, and the specs that are then neither uniform nor of a uniform "
         "type raise ValueError('Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
         "unified type.'); observed on 0.25.0 (random swa_hybrid cases: 16-token window blocks beside 96-token full "
         "ones, SLIDING_WINDOW_BLOCK_DECOUPLED)"),
    Fact((0, 27, 0), False,
         "vllm/v1/core/kv_cache_utils.py in 0.27.0: the promoted spec takes the full-attention layers' block size "
         "(full_attention_block_size or spec.block_size), its padded page scaled with it; observed on 0.28.0"),
)
"""Whether a sliding-window layer promoted to full attention (hybrid manager disabled) keeps its own
block size; from 0.27 it takes the full-attention layers' one."""

SLIDING_WINDOW_BLOCK_DECOUPLED: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/model_executor/layers/attention/attention.py in 0.19.1 to 0.24.0 (read off their wheels): "
         "Attention.get_kv_cache_spec gives a sliding-window layer SlidingWindowSpec(block_size="
         "vllm_config.cache_config.block_size, ...), the configured block size"),
    Fact((0, 25, 0), True,
         "vllm/model_executor/layers/attention/attention.py in 0.25.0 (read off its wheel): 'SW chooses its own "
         "block_size, decoupled from the user's --block-size': _largest_kernel_block_within(attn_backend, "
         "sw_per_token, cache_config.skip_page_size_padded, block_size), the backend's smallest supported block "
         "when no page is padded; page-size unification then scales it by a whole ratio"),
)
"""Whether a sliding-window layer picks its own block size from its backend's kernel block sizes
(``_largest_kernel_block_within``); before, it took the configured ``--block-size``."""

SLIDING_WINDOW_BLOCK_FROM_PRIMARY: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, False,
         "vllm/model_executor/layers/attention/attention.py in 0.29.0: Attention.get_kv_cache_spec gives a "
         "sliding-window layer _largest_kernel_block_within(backend, per_token, skip_page_size_padded, block_size), "
         "which returns the backend's smallest supported block (a MultipleOf's base) when there is no padded page; "
         "observed on 0.29.0 (swa-hybrid-padded: the window group's blocks are 16 tokens where 0.30's are 32)"),
    Fact((0, 30, 0), True,
         "vllm/model_executor/layers/attention/attention.py in 0.30.0: page_budget = skip_page_size_padded or "
         "per_token * block_size, and MultipleOf sizes expand to the largest aligned block within it: the primary "
         "block size when the backend can run it"),
)
"""Whether a sliding-window layer's block size starts from the primary block size (the largest
supported block within its page); before, from the backend's smallest supported block."""

FLASHINFER_SM90_REFUSES_SLIDING_WINDOW: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, True,
         "vllm/v1/attention/backends/flashinfer.py in 0.29.0: FlashInferMetadataBuilder.__init__ raises "
         "NotImplementedError('FlashInfer backend on SM90 currently crashes with sliding-window attention layers. "
         "Use the default attention backend.') when any of its layers has a window (flashinfer-ai/flashinfer#3578); "
         "observed on 0.29.0 (random swa_hybrid cases on FLASHINFER, capability 9.0), before the views are made"),
    Fact((0, 30, 0), False, "vllm/v1/attention/backends/flashinfer.py in 0.30.0: no such check"),
)
"""Whether FlashInfer's metadata builder refuses sliding-window layers on SM90."""

SLIDING_WINDOW_PACKED_AS_STATE: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, False,
         "vllm/v1/core/kv_cache_utils.py in 0.29.0: _get_packed_kv_cache_groups caps only a Mamba bucket at the "
         "states the widest block holds ('if anchor_bytes and isinstance(spec.first_spec, MambaSpec)'): with no "
         "repeating pattern, a sliding-window bucket stays one group of all its layers side by side in each block; "
         "observed on 0.29.0 (random swa_hybrid cases: one fp8 full layer beside three bf16 window layers under "
         "BLHNC give two groups and 12,288-byte blocks where 0.30 gives four groups and 4,096)"),
    Fact((0, 30, 0), True,
         "vllm/v1/core/kv_cache_utils.py in 0.30.0: is_state_bucket(spec) is true for Mamba and circular buffers, "
         "and for sliding windows when repeats_per_group is None: such a bucket splits down to the states a block "
         "already fits"),
)
"""Whether a block-outermost sliding-window bucket with no repeating layer pattern is split like a
state bucket (down to what the widest block fits); before, it stayed one group."""

HIDDEN_STATE_PAGE_GROWS: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, False,
         "vllm/v1/core/kv_cache_utils.py in 0.29.0 has no _ensure_min_page_size: a hidden-state layer whose one token "
         "outgrows the common page gets page_size_padded below its own page, and AttentionSpec.page_size_bytes "
         "(vllm/v1/kv_cache_interface.py) fails 'assert self.page_size_padded >= self.unpadded_page_size_bytes' "
         "with a bare AssertionError while the groups are sized; observed on 0.29.0 (hidden-states-swa-hybrid)"),
    Fact((0, 30, 0), True,
         "vllm/v1/core/kv_cache_utils.py in 0.30.0: get_kv_cache_groups calls _ensure_min_page_size, scaling every "
         "group's block size until the common page holds one token of the widest hidden state"),
)
"""Whether the common page grows to hold one token of the widest hidden-state layer (before: vLLM's
own page-size assertion fails)."""

DSV4_INDEXER_REFUSES_DCP: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, False,
         "vllm/v1/attention/backends/mla/indexer.py in 0.30.0 and 0.31.0: DeepseekV32IndexerMetadataBuilder.__init__ "
         "has no DCP check for compressed indexers; 0.32.0 has it, but its sliding-window caches are refused first, "
         "at admission (vllm/v1/kv_cache_interface.py: SlidingWindowSpec.max_memory_usage_bytes: 'DCP not support "
         "sliding window.'); observed on 0.30.0, 0.31.0 and 0.32.0 (dsv4-dcp2-refused)"),
    Fact((0, 33, 0), True,
         "vllm/v1/attention/backends/mla/indexer.py in 0.33.0: DeepseekV32IndexerMetadataBuilder.__init__ raises "
         "NotImplementedError('DCP with sparse indexer KV compression (compress_ratio=N) requires "
         "--cp-kv-cache-interleave-size to be a multiple of it; DeepSeek-V4 is not supported.') before any "
         "sliding-window admission check; observed on 0.33.0 (dsv4-dcp2-refused)"),
)
"""Whether DeepSeek V4 under DCP is refused by the sparse indexer's metadata builder (before: by its sliding-window
caches at admission, which the reference does not model)."""

MRV1_REFUSES_STEP5: tuple[Fact[bool], ...] = (
    Fact(GEN2_FIRST, False,
         "vllm/config/vllm.py in 0.29.0 to 0.32.0: _get_v1_model_runner_unsupported_features lists no architecture "
         "(Step5's model, vllm/models/step5, is new in 0.33.0); observed on 0.29.0 (the ci sample's Step5 configs: "
         "MRv1 goes on to build the layers)"),
    Fact((0, 33, 0), True,
         "vllm/config/vllm.py in 0.33.0: VllmConfig._get_v1_model_runner_unsupported_features appends 'Step5' for "
         "the Step5ForCausalLM and Step5ForConditionalGeneration architectures (step5-dsa-b64)"),
)
"""Whether MRv1 refuses a Step5 model at ``VllmConfig`` validation."""

BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/block_table.py and gpu/block_table.py in 0.19.1 to 0.26.0 (read off their wheels): no "
         "get_block_table_width; a row is max_num_blocks_per_req (MRv1) or cdiv(max_model_len, block_size * dcp) "
         "(MRv2) wide; observed on 0.21.0 (a 44-block row where 0.27 aligns to 128 tokens)"),
    Fact((0, 27, 0), True,
         "vllm/v1/worker/block_table.py in 0.27.0: get_block_table_width(max_num_blocks, block_size, "
         "token_alignment=128) for both runners' token groups"),
)
"""Whether the block-table rows of token groups are widened to span a multiple of 128 tokens."""

MRV1_ROWS_BLOCK_ALIGNED: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/block_table.py MultiGroupBlockTable.__init__ in 0.19.1 and 0.20.0: each group's row is "
         "max_num_blocks_per_req wide"),
    Fact((0, 21, 0), True,
         "vllm/v1/worker/block_table.py in 0.21.0 to 0.26.0 (read off their wheels): 'Align to a multiple of "
         "(128 / block_size) as required by some attention backends such as TRTLLM (#39324)': max_num_blocks = "
         "cdiv(n, 128 // bs) * (128 // bs) if bs <= 128, every group's (a Mamba group's single block too); observed "
         "on 0.21.0 (a 64-token Mamba group's row is 2 blocks wide)"),
    Fact((0, 27, 0), False,
         "vllm/v1/worker/block_table.py in 0.27.0: replaced by get_block_table_width for token groups "
         "(BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED)"),
)
"""Whether MRv1 rounds every group's block-table row up to a multiple of ``128 // block_size``
blocks (blocks of at most 128 tokens), a state group's too."""

MRV1_STATE_SLOTS_SKIPPED: tuple[Fact[bool], ...] = (
    Fact(GEN1_FIRST, False,
         "vllm/v1/worker/block_table.py in 0.19.1 to 0.25.0 (read off their wheels): no SlotMappingMode; MRv1 computes "
         "every group's slot mapping from its rows, a Mamba group's too (block_table[p // B] * B + p % B); observed "
         "on 0.21.0 and 0.25.0"),
    Fact((0, 26, 0), True,
         "vllm/v1/worker/gpu_model_runner.py in 0.26.0 may_reinitialize_input_batch: SlotMappingMode.NONE for a "
         "group whose spec is not an attention spec (its slot mapping is not computed)"),
)
"""Whether MRv1 leaves the slot mapping of a state (Mamba) group uncomputed; before, it maps its
tokens like an attention group's."""

MRV2_DCP_SHARDING_PER_GROUP: tuple[Fact[bool], ...] = (
    Fact(GEN2_FACTS_FROM, False,
         "vllm/v1/worker/gpu/block_table.py in 0.30.0 (read off its wheel): BlockTables takes no dcp_sharded and "
         "_compute_slot_mappings_kernel shards every group's positions over the DCP ranks; observed on 0.30.0 "
         "(mamba-hybrid-dcp2: the Mamba group's MRv2 slots are every other token's, PAD between)"),
    Fact((0, 31, 0), True,
         "vllm/v1/worker/gpu/block_table.py in 0.31.0: BlockTables(dcp_sharded=[...]) and the kernel's "
         "'local_positions = tl.where(sharded, local_positions, positions)': a replicated group (Mamba state) "
         "maps its slots by the global position"),
)
"""Whether MRv2 maps a group that is not DCP-sharded (Mamba state) by the global position;
before, every group's slots were sharded over the DCP ranks."""

ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK: tuple[Fact[bool], ...] = (
    Fact(GEN2_FACTS_FROM, False,
         "vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes in 0.29.0 and 0.30.0: one KV cache group's "
         "scheduler and hash block is cache_config.block_size * dcp whatever the group; observed on 0.30.0 "
         "(random-s20261129-405-encoder_only: Gated DeltaNet layers beside encoder-only ones at DCP 2, 8192)"),
    Fact((0, 31, 0), True,
         "vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes in 0.31.0: 'if groups and not "
         "groups[0].kv_cache_spec.dcp_sharded: dcp = 1' (a Mamba state is replicated, not sharded)"),
)
"""Whether a model's one KV cache group that DCP does not shard (a Mamba state) keeps its own block as the scheduler
and hash block; before, it was scaled by the DCP size like an attention group."""

BLOCK_TABLES_HOLD_KERNEL_IDS: Mapping[str, tuple[Fact[bool], ...]] = {
    "mrv1": (
        Fact(GEN1_FIRST, True,
             "vllm/v1/worker/block_table.py (read off the 0.19.1, 0.22.0, 0.25.0, 0.28.0, 0.30.0 and 0.31.0 wheels): "
             "BlockTable(kernel_block_size) keeps blocks_per_kv_block = block_size // kernel_block_size; append_row "
             "writes map_to_kernel_blocks(block_ids) (b * R + k), max_num_blocks_per_req and num_blocks_per_row count "
             "kernel blocks, and the slot-mapping kernel reads block_table[vbi * R + offset // K] * K + offset % K; the "
             "runner hands that table to the builders as it is (AttentionGroup has no map_to_kernel_block_table)"),
        Fact((0, 32, 0), False,
             "vllm/v1/worker/block_table.py in 0.32.0: BlockTable has no kernel_block_size (rows hold the scheduler's "
             "block ids); AttentionGroup.map_to_kernel_block_table expands them per attention group"),
    ),
    "mrv2": (
        Fact(GEN1_FIRST, False,
             "vllm/v1/worker/gpu/block_table.py in 0.19.1 to 0.21.0: BlockTables has no kernel block sizes (MRv2 views "
             "its KV cache in logical blocks then: MRV2_KERNEL_BLOCKS, #42846)"),
        Fact((0, 22, 0), True,
             "vllm/v1/worker/gpu/block_table.py (read off the 0.22.0, 0.25.0, 0.30.0 and 0.31.0 wheels): "
             "BlockTables(kernel_block_sizes) widens each group by blocks_per_kv_block, append_block_ids writes "
             "b * bpk + k, and _compute_slot_mappings_kernel indexes by local_position // kernel_block_size"),
        Fact((0, 32, 0), False,
             "vllm/v1/worker/gpu/block_table.py in 0.32.0: BlockTables takes no kernel_block_sizes; rows hold the "
             "scheduler's block ids and the slot kernel indexes by kv_block_size"),
    ),
}
"""Per runner, whether its block tables store kernel block ids (each scheduler block id ``b`` as
``b*R .. b*R+R-1``) rather than the scheduler's ids, which attention groups then expand."""

GEN2_DIFFERENCES: Mapping[str, tuple[Fact[bool], ...]] = {
    "a block-outermost group keeps the manager block size as its kernel block size": PACKED_GROUPS_KEEP_MANAGER_BLOCKS,
    "a layer's spec carries its backend's block stride alignment": STRIDE_ALIGNMENT_FROM_KERNEL_SIZES,
    "MRv2 BlockTables nulls block ids below a sliding window": MRV2_SLIDING_WINDOW_REACH,
    "MRv2 maps a replicated group's slots by the global position under DCP": MRV2_DCP_SHARDING_PER_GROUP,
    "one replicated KV cache group keeps its block as the scheduler block under DCP": ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK,
    "a sliding-window layer's block size starts from the primary block size": SLIDING_WINDOW_BLOCK_FROM_PRIMARY,
    "FlashInfer's builder refuses sliding-window layers on SM90": FLASHINFER_SM90_REFUSES_SLIDING_WINDOW,
    "the common page grows to hold a hidden-state token": HIDDEN_STATE_PAGE_GROWS,
    "a packed sliding-window bucket splits like a state bucket": SLIDING_WINDOW_PACKED_AS_STATE,
    "the sparse indexer's builder refuses DeepSeek V4 under DCP": DSV4_INDEXER_REFUSES_DCP,
    "MRv1 refuses a Step5 model": MRV1_REFUSES_STEP5,
    "MRv1's move_row clears the row it vacates": MRV1_MOVE_ROW_CLEARS_SOURCE,
    "block-table rows span a multiple of 128 tokens": BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED,
    "MRv2 frees a step's request slots in request-id order": MRV2_FREES_SLOTS_IN_ID_ORDER,
    "MRv1's block tables hold kernel block ids": BLOCK_TABLES_HOLD_KERNEL_IDS["mrv1"],
    "MRv2's block tables hold kernel block ids": BLOCK_TABLES_HOLD_KERNEL_IDS["mrv2"],
}
"""Every generation-2 behaviour that differs between the releases in ``GEN2``, by what it is."""


def check_gen2_version(text: str) -> Version:
    """The release, or why the reference has no generation-2 facts for it (NotModeledError)."""
    v = parse_version(text)
    if not GEN2_FACTS_FROM <= v < GEN2_FACTS_UNTIL:
        raise NotModeledError(
            f"the reference has no generation-2 facts for vLLM {text} (it has them for "
            f"{format_version(GEN2_FACTS_FROM)} to {format_series((0, GEN2_FACTS_UNTIL[1] - 1, 0))}; "
            f"generation 1: {_minor(GEN1_FIRST)} to {_minor((0, GEN1_END[1] - 1, 0))})"
        )
    return v


# --- what a run is judged by --------------------------------------------------------------

BY_FACTS = "facts"
"""The reference has facts for the installed release: every divergence from them is a finding."""
BY_NEWEST_FACTS = "drift"
"""An unreleased build (``.dev``, ``rc``, a source build ``+g<sha>``) or a release newer than
the newest one the reference has facts for: judged by the contract and by the facts of the
release it builds on; a divergence from those facts is *drift*."""
BY_CONTRACT = "contract"
"""A release the reference has no facts for (older than generation 1):
judged by the contract alone."""

_SOURCE_BUILD = re.compile(r"\+g[0-9a-f]{6,}", re.IGNORECASE)
_PRE_RELEASE = re.compile(r"(\.?dev\d*|rc\d*|a\d+|b\d+)(?=$|[.+])", re.IGNORECASE)


def is_unreleased(text: str) -> bool:
    """Whether ``text`` names a build that is not a published release: ``0.34.0.dev12+g1a2b3c4``,
    ``0.33.1rc1``, a source build ``0.33.0+g9f8e7d6``. A platform build of a release
    (``0.32.0+cpu``, ``0.33.0+cu128``) is that release."""
    body = text.split("+", 1)[0]
    return bool(_PRE_RELEASE.search(body)) or bool(_SOURCE_BUILD.search(text))


@dataclass(frozen=True)
class Judgement:
    """What the installed vLLM is judged by: its own release's facts, the newest facts as drift, or the contract alone."""

    installed: str
    """The installed vLLM's version, as its package metadata reads."""
    basis: str
    """``BY_FACTS``, ``BY_NEWEST_FACTS`` (drift) or ``BY_CONTRACT``."""
    facts_release: str | None
    """The release whose facts the reference predicts with (``"0.33.0"``); None: the contract alone."""
    generation: int | None
    """The generation of those facts (1 or 2); None for the contract alone."""
    requested: bool = False
    """The contract alone was asked for (``--contract-only``), whatever facts the reference has."""

    @property
    def drift(self) -> bool:
        """Whether a divergence from the facts is reported as drift."""
        return self.basis == BY_NEWEST_FACTS

    @property
    def contract_only(self) -> bool:
        return self.basis == BY_CONTRACT

    def describe(self) -> str:
        """``"vLLM 0.34.0.dev12+g1a2b3c4 (unreleased): judged by the contract and by 0.33.0's facts"``."""
        if self.basis == BY_FACTS:
            return f"vLLM {self.installed}: judged by the contract and by {self.facts_release}'s facts"
        if self.basis == BY_NEWEST_FACTS:
            what = "unreleased" if is_unreleased(self.installed) else "newer than the reference's facts"
            return f"vLLM {self.installed} ({what}): judged by the contract and by {self.facts_release}'s facts"
        if self.requested:
            return f"vLLM {self.installed}: judged by the contract alone (asked for: --contract-only)"
        return f"vLLM {self.installed} (the reference has no facts for it): judged by the contract alone"


def judgement_for(installed: str, *, contract_only: bool = False) -> Judgement:
    """What a vLLM reporting ``installed`` is judged by; never refused for lack of facts.

    ``contract_only``: judge by the contract alone whatever the release (``--contract-only``).
    Raises ConfigError only when ``installed`` is not a version at all."""
    v = parse_version(installed)
    if contract_only:
        return Judgement(installed, BY_CONTRACT, None, None, requested=True)
    unreleased = is_unreleased(installed)
    if GEN1_FIRST <= v < GEN1_END:
        return Judgement(installed, BY_NEWEST_FACTS if unreleased else BY_FACTS, format_version(v), 1)
    if GEN2_FACTS_FROM <= v < GEN2_FACTS_UNTIL:
        return Judgement(installed, BY_NEWEST_FACTS if unreleased else BY_FACTS, format_version(v), 2)
    if v >= GEN2_FACTS_UNTIL:
        return Judgement(installed, BY_NEWEST_FACTS, TARGET_RELEASE, 2)
    return Judgement(installed, BY_CONTRACT, None, None)


__all__ = [
    "BY_CONTRACT",
    "BY_FACTS",
    "BY_NEWEST_FACTS",
    "Judgement",
    "is_unreleased",
    "judgement_for",
    "BLOCK_TABLE_WIDTHS_TOKEN_ALIGNED",
    "BLOCK_TABLES_HOLD_KERNEL_IDS",
    "DSV4_INDEXER_REFUSES_DCP",
    "FLASHINFER_SM90_REFUSES_SLIDING_WINDOW",
    "Fact",
    "GEN1",
    "GEN1_END",
    "GEN1_FIRST",
    "GEN1_KERNEL_BLOCK_SIZES",
    "GEN1_LAYOUT_OVERRIDES",
    "GEN2",
    "HIDDEN_STATE_PAGE_GROWS",
    "GEN2_DIFFERENCES",
    "GEN2_FACTS_FROM",
    "GEN2_FACTS_UNTIL",
    "GEN2_FIRST",
    "Gen1Layout",
    "MOONCAKE_KERNEL_SYNC",
    "MRV1_MOVE_ROW_CLEARS_SOURCE",
    "MRV2_DCP_SHARDING_PER_GROUP",
    "ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK",
    "MRV2_FREES_SLOTS_IN_ID_ORDER",
    "MRV2_KERNEL_BLOCKS",
    "MRV2_SLIDING_WINDOW_REACH",
    "ATTENTION_PAGES_PADDED",
    "PROMOTED_WINDOW_KEEPS_ITS_BLOCK",
    "SLIDING_WINDOW_BLOCK_DECOUPLED",
    "SLIDING_WINDOW_BLOCK_FROM_PRIMARY",
    "SLIDING_WINDOW_PACKED_AS_STATE",
    "STRIDE_ALIGNMENT_FROM_KERNEL_SIZES",
    "PACKED_GROUPS_KEEP_MANAGER_BLOCKS",
    "ReleaseSpan",
    "TARGET_RELEASE",
    "Version",
    "check_gen1_version",
    "check_gen2_version",
    "fact_at",
    "format_series",
    "format_version",
    "holds",
    "parse_release",
    "parse_version",
]
