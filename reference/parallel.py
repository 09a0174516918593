"""Tensor, decode-context and prefill-context parallelism: what one rank's KV cache sees.

A case's layers carry *per-rank* head counts. This module turns a model's totals into
them the way the target release does, and predicts the scheduler-side token spans DCP changes:

- ``ModelConfig.get_num_kv_heads``: MLA keeps one latent head; otherwise
  ``max(1, total_kv_heads // tp)`` (KV heads are replicated when TP exceeds them).
- ``ModelConfig.verify_with_parallel_config`` and ``ParallelConfig``'s validator: the
  startup refusals for TP/DCP combinations (texts copied, so a driver can check vLLM
  fails the same way).
- ``kv_cache_utils.resolve_kv_cache_block_sizes``: a DCP-sharded attention block spans
  ``block_size * dcp`` tokens of the sequence; the scheduler block is the LCM of every
  group's span, and the prefix-cache hash block their GCD.

The registered tensors themselves do not change with DCP: each rank stores every
``dcp``-th token (interleaved, see ``reference.block_tables``) in pages of the same shape.

Prefill context parallelism (PCP, ``--prefill-context-parallel-size``) changes no layout either:
PCP alone replicates the KV cache on its ranks (``ParallelConfig.pcp_shard_decode_requests``),
and a DCP group spanning the PCP axis shards it as DCP does. What it adds are refusals, which
``prefill_context_parallel_refusal`` predicts: only MRv2 runs it (``VllmConfig.
_get_v1_model_runner_unsupported_features``), only for MLA models
(``v1/worker/gpu/pcp_manager.py: PCPManager.validate_config``), and only on attention backends
that support it (``v1/worker/cp_utils.py: check_attention_cp_compatibility``, in
``reference.derive``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from reference.errors import ConfigError


@dataclass(frozen=True)
class ModelHeads:
    """A model's head totals before tensor parallelism splits them."""

    total_kv_heads: int
    total_attention_heads: int
    use_mla: bool = False


def per_rank_kv_heads(heads: ModelHeads, tensor_parallel_size: int) -> int:
    """``ModelConfig.get_num_kv_heads``: the KV heads one TP rank stores."""
    if heads.use_mla:
        return 1
    return max(1, heads.total_kv_heads // tensor_parallel_size)


def check_parallel(heads: ModelHeads, tensor_parallel_size: int, decode_context_parallel_size: int = 1) -> None:
    """Raise ``ConfigError`` with vLLM's text where vLLM refuses this TP/DCP combination."""
    tp, dcp = tensor_parallel_size, decode_context_parallel_size
    for name, value in (("tensor_parallel_size", tp), ("decode_context_parallel_size", dcp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} {value!r} must be a positive integer")
    if heads.total_attention_heads % tp:
        raise ConfigError(
            f"Total number of attention heads ({heads.total_attention_heads}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    if dcp > 1 and not heads.use_mla:
        if tp <= heads.total_kv_heads:
            raise ConfigError(
                f"Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` ({tp}) to be "
                f"greater than the model's total number of KV heads ({heads.total_kv_heads}). "
                "Increase `--tensor-parallel-size` or set `--decode-context-parallel-size 1`."
            )
        max_dcp = tp // heads.total_kv_heads
        if dcp > max_dcp:
            raise ConfigError(
                f"`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported value ({max_dcp}) "
                f"for `--tensor-parallel-size` ({tp}) and {heads.total_kv_heads} model KV heads."
            )
        q_per_kv = heads.total_attention_heads // heads.total_kv_heads
        if q_per_kv % dcp:
            raise ConfigError(
                f"The model's number of query heads per KV head ({q_per_kv}) must be divisible by "
                f"`--decode-context-parallel-size` ({dcp}) for GQA/MQA."
            )
    check_tp_dcp(tp, dcp)


def check_tp_dcp(tensor_parallel_size: int, decode_context_parallel_size: int,
                 prefill_context_parallel_size: int = 1) -> None:
    """``ParallelConfig``'s validator (``config/parallel.py``): without PCP, DCP reuses the TP
    ranks; with PCP, DCP is off or spans the PCP axis or the whole TP x PCP grid."""
    tp, dcp, pcp = tensor_parallel_size, decode_context_parallel_size, prefill_context_parallel_size
    if pcp == 1:
        if tp % dcp:
            raise ConfigError(f"tp_size={tp} must be divisible by dcp_size={dcp}.")
    elif dcp not in (1, pcp, tp * pcp):
        raise ConfigError(
            "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. "
            f"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are {sorted({1, pcp, tp * pcp})}."
        )


PCP_MODEL_RUNNER_REFUSAL = "Model Runner V1 does not support: prefill context parallel"
"""``VllmConfig._validate_v1_model_runner`` (0.30 on): "PCP runtime support is implemented only by
the V2 model runner"."""


def prefill_context_parallel_refusal(
    runner: str,
    prefill_context_parallel_size: int,
    decode_context_parallel_size: int,
    *,
    use_mla: bool,
    is_encoder_decoder: bool,
    has_drafts: bool,
    is_sparse_mla: bool,
) -> tuple[str, str] | None:
    """(vLLM's message, where) for a PCP configuration a runner refuses before any layer exists,
    or None.

    MRv1 refuses PCP outright. MRv2 builds its ``PCPManager`` in the runner's constructor, whose
    ``validate_config`` refuses models that are not MLA, encoder-decoder models, drafts that are
    not DSpark or single-module MTP (a case's drafts are Eagle drafts: both runners build them
    through their Eagle paths), and DCP beside PCP on dense MLA (#53573). Its CUDA-graph refusal
    for sparse MLA is not predicted: cases are judged with CUDA graphs off, as the drivers'
    ``VllmConfig`` resolves them on CPU (``cudagraph_mode`` NONE).
    """
    if prefill_context_parallel_size <= 1:
        return None
    if runner == "mrv1":
        return PCP_MODEL_RUNNER_REFUSAL, "vllm/config/vllm.py: VllmConfig._validate_v1_model_runner"
    where = "vllm/v1/worker/gpu/pcp_manager.py: PCPManager.validate_config"
    if not use_mla:
        return "MRV2 PCP currently supports MLA models only.", where
    if is_encoder_decoder:
        return "MRV2 PCP does not support encoder-decoder models yet.", where
    if has_drafts:
        return "MRV2 PCP only supports DSpark or single-module MTP speculative decoding.", where
    if decode_context_parallel_size > 1 and not is_sparse_mla:
        return "MRV2 PCP + DCP supports sparse MLA models only.", where
    return None


def dcp_block_span(block_size: int, dcp_sharded: bool, decode_context_parallel_size: int) -> int:
    """``resolve_dcp_kv_block_size``: the sequence tokens one cache block covers."""
    return block_size * (decode_context_parallel_size if dcp_sharded else 1)


def scheduler_block_sizes(
    groups: Iterable[tuple[int, bool, bool, bool]],
    *,
    cache_block_size: int,
    decode_context_parallel_size: int,
    hashing: bool = True,
    one_replicated_group_unscaled: bool = True,
) -> tuple[int, int]:
    """``resolve_kv_cache_block_sizes``: (scheduler block size, hash block size).

    ``groups``: per KV cache group ``(block_size, dcp_sharded, prefix_cacheable,
    is_unaligned_mamba)``. ``hashing``: prefix caching or a KV connector is on (vLLM's
    default for generative models). One group: ``cache_block_size`` scaled by DCP when the
    group is sharded. Several: the LCM of the groups' spans; the hash block is their GCD
    over prefix-cacheable groups, unless a Mamba group is not in ``align`` mode.
    ``one_replicated_group_unscaled``: the release keeps one unsharded group's block unscaled
    (``reference.releases.ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK``; 0.29 and 0.30 scale it by DCP too).
    """
    groups = list(groups)
    dcp = decode_context_parallel_size
    if len(groups) <= 1:
        if groups and not groups[0][1] and one_replicated_group_unscaled:
            dcp = 1
        size = cache_block_size * dcp
        return size, size
    spans = [dcp_block_span(bs, sharded, dcp) for bs, sharded, _, _ in groups]
    scheduler = math.lcm(*spans)
    if not hashing or any(unaligned for *_, unaligned in groups):
        return scheduler, scheduler
    hashing_spans = [span for span, (_, _, cacheable, _) in zip(spans, groups) if cacheable] or spans
    return scheduler, math.gcd(*hashing_spans)


__all__ = [
    "ModelHeads",
    "check_parallel",
    "check_tp_dcp",
    "prefill_context_parallel_refusal",
    "dcp_block_span",
    "per_rank_kv_heads",
    "scheduler_block_sizes",
]
