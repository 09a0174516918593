"""Layout and pool checks: the resolved layout, KV cache groups, block count and size, the
``KVCacheTensor`` placement and every block size a runner, builder or connector chose.

These come first in a report: they are the root causes the registered views then show.
"""

from __future__ import annotations

from typing import Any, Iterable

from reference.config import CaseConfig
from reference.derive import Derivation
from reference.specs import vllm_spec_class

from conformance.divergence import NOT_OBSERVED, Collector, Kind, draft_layers

KINDS = (
    Kind("layout", "the resolved ``KVCacheLayout``."),
    Kind("groups", "KV cache groups (layer names and manager block size, in order)."),
    Kind("group_spec",
         "each KV cache group's spec class (``FullAttentionSpec``, ``RSWASpec``, "
         "``UniformTypeKVCacheSpecs``, ...): what picks the group's manager."),
    Kind("num_blocks", "the pool's block count."),
    Kind("bytes_per_block", "the pool's bytes per block."),
    Kind("tensor_placement", "the ``KVCacheTensor`` list (layers, size, strides, offset)."),
    Kind("kernel_block_size", "per-group kernel block sizes (``prepare_kernel_block_sizes``)."),
    Kind("builder_kernel_block_size",
         "the block size each target layer's metadata builder and block table use "
         "(``create_metadata_builders``' ``select_common_block_size``)."),
    Kind("draft_kernel_block_size", "the same for each draft (Eagle/MTP) layer's builder."),
    Kind("connector_kernel_block_size",
         "NIXL/Mooncake's ``_sync_block_size_with_kernel``; only compared when the observation "
         "carries a ``connector_kernel_block_size`` attribute."),
    Kind("cache_block_size", "``cache_config.block_size`` after planning."),
    Kind("scheduler_block_size",
         "``resolve_kv_cache_block_sizes``: the scheduler's token alignment and the prefix-cache "
         "hash block (fields ``scheduler_block_size`` and ``hash_block_size``; both scale with DCP)."),
)

_TENSOR_FIELDS = ("size", "layer_stride", "block_stride", "offset")


def _tensor_rows(tensors: Iterable[Any]) -> dict[tuple[str, ...], tuple[int, int, int, int]]:
    """KVCacheTensors keyed by their layers (a layer is in exactly one tensor)."""
    return {tuple(t.layers): (t.size, t.layer_stride, t.block_stride, t.offset) for t in tensors}


def compare_tensors(c: Collector, kind: str, expected: Iterable[Any], observed: Iterable[Any]) -> None:
    """Per tensor and attribute, so the field names exactly what moved.

    The list order is not compared: it follows the group order (a ``groups`` matter),
    and where a layer's bytes live does not depend on it.
    """
    exp, obs = _tensor_rows(expected), _tensor_rows(observed)
    if set(exp) != set(obs):
        # A different partition of the layers into tensors: nothing to pair up.
        c.cmp(kind, "kv_cache_tensors.layers", sorted(exp), sorted(obs))
        return
    for layers, e in exp.items():
        for attr, ev, ov in zip(_TENSOR_FIELDS, e, obs[layers]):
            c.cmp(kind, f"kv_cache_tensor[{layers[0]}].{attr}", ev, ov)


def judge_layout(c: Collector, case: CaseConfig, expected: Derivation, observation: Any) -> None:
    """A generation-2 observation's layout, groups, pool, tensors and block sizes against the derivation."""
    if observation.layout is not None:
        c.cmp("layout", "layout", expected.layout.name, observation.layout)
    exp_groups = [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups]
    obs_groups = [(tuple(g.layer_names), g.block_size) for g in observation.groups]
    c.cmp("groups", "groups", exp_groups, obs_groups)
    if exp_groups == obs_groups and all(getattr(g, "spec_type", None) for g in observation.groups):
        # Paired only where the groups are the same ones (else ``groups`` already says so).
        c.cmp("group_spec", "group_spec_types", [vllm_spec_class(g.spec) for g in expected.groups],
              [g.spec_type for g in observation.groups])
    c.cmp("num_blocks", "num_blocks", expected.num_blocks, observation.num_blocks)
    if observation.bytes_per_block is not None:  # an engine's recording does not carry it
        c.cmp("bytes_per_block", "bytes_per_block", expected.plan.bytes_per_block, observation.bytes_per_block)
    compare_tensors(c, "tensor_placement", expected.plan.tensors, observation.tensors)
    if observation.kernel_block_sizes is not None:  # None: not observed (an engine's recording)
        c.cmp("kernel_block_size", "kernel_block_sizes", list(expected.kernel_block_sizes), list(observation.kernel_block_sizes))
    drafts = draft_layers(case)
    observed_builders = getattr(observation, "builder_kernel_block_sizes", None)
    if observed_builders is not None:
        # Only drivers that observe the runner's metadata builders provide it.
        # Targets and drafts apart: the drafter builds its own attention groups
        # (MRv1 drafter.initialize_attn_backend, MRv2 speculator), a separate code path.
        targets = {n: k for n, k in expected.builder_kernel_block_sizes.items() if n not in drafts}
        c.cmp(
            "builder_kernel_block_size",
            "builder_kernel_block_sizes",
            targets,
            {n: k for n, k in observed_builders.items() if n not in drafts},
        )
        c.cmp(
            "draft_kernel_block_size",
            "draft_kernel_block_sizes",
            # Drafts by the case, not Derivation.draft_kernel_block_sizes: that reads
            # is_draft from the grouped spec, which a draft merged into its target's
            # group (same page, same backend) no longer carries.
            {n: k for n, k in expected.builder_kernel_block_sizes.items() if n in drafts},
            {n: k for n, k in observed_builders.items() if n in drafts},
        )
    observed_connector = getattr(observation, "connector_kernel_block_size", NOT_OBSERVED)
    if observed_connector is not NOT_OBSERVED:
        # Only drivers that run a connector's _sync_block_size_with_kernel provide it.
        c.cmp("connector_kernel_block_size", "connector_kernel_block_size", expected.connector_kernel_block_size, observed_connector)
    observed_cache_block = getattr(observation, "cache_block_size", None)
    if observed_cache_block is not None:
        c.cmp("cache_block_size", "cache_block_size", expected.cache_block_size, observed_cache_block)
    for field_name in ("scheduler_block_size", "hash_block_size"):
        observed_size = getattr(observation, field_name, None)
        if observed_size is not None:
            c.cmp("scheduler_block_size", field_name, getattr(expected, field_name), observed_size)


def judge_gen1_layout(c: Collector, expected: Any, observation: Any) -> None:
    """A generation-1 observation against ``reference.gen1``: layout (NHD/HND), groups,
    blocks, the raw tensors (``KVCacheTensor(size, shared_by)``) and kernel block sizes."""
    if observation.layout is not None:
        c.cmp("layout", "layout", expected.layout, observation.layout)
    c.cmp("groups", "groups", [(tuple(g.layer_names), g.spec.block_size) for g in expected.groups],
          [(tuple(g.layer_names), g.block_size) for g in observation.groups])
    c.cmp("num_blocks", "num_blocks", expected.num_blocks, observation.num_blocks)
    # Keyed by the layers joined with " + " (a report is JSON: its keys are strings).
    c.cmp("tensor_placement", "kv_cache_tensors (shared_by: size)",
          {" + ".join(t.shared_by): t.size for t in expected.kv_cache_tensors},
          {" + ".join(t.layers): t.size for t in observation.tensors})
    if observation.kernel_block_sizes is not None:
        c.cmp("kernel_block_size", "kernel_block_sizes", list(expected.selected_kernel_block_sizes), list(observation.kernel_block_sizes))


__all__ = ["KINDS", "compare_tensors", "judge_gen1_layout", "judge_layout"]
