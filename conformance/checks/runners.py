"""Runner checks: MRv1 against MRv2 for the same case, without the reference.

What a connector or kernel would see differently between the model runners, even where the
reference has no opinion (or is wrong the same way for both).
"""

from __future__ import annotations

from typing import Any, Mapping

from reference.config import CaseConfig

from conformance.checks.layout import compare_tensors
from conformance.checks.views import compare_views
from conformance.divergence import NOT_OBSERVED, RUNNER_PAIR, Collector, Divergence, Kind, case_name, draft_layers

KINDS = (Kind("mrv1_mrv2_mismatch", "MRv1 and MRv2 differ on the same case (from ``compare_runners`` only)."),)


def compare_runners(case: CaseConfig | str, mrv1: Any, mrv2: Any) -> tuple[Divergence, ...]:
    """Everything a connector or kernel could see differently between MRv1 and MRv2.

    Both observations are of the same case; no reference is involved, so this also
    catches what the reference does not model. Nothing is reported when either runner
    could not be driven (``unsupported``). Each divergence has kind ``mrv1_mrv2_mismatch``,
    runner ``"mrv1/mrv2"``, ``expected`` = MRv1's value and ``observed`` = MRv2's.
    """
    if mrv1 is None or mrv2 is None or getattr(mrv1, "unsupported", None) or getattr(mrv2, "unsupported", None):
        return ()
    c = Collector(case_name(case), RUNNER_PAIR, basis="contract")  # no reference involved
    kind = "mrv1_mrv2_mismatch"
    e1, e2 = getattr(mrv1, "error", None), getattr(mrv2, "error", None)
    if (e1 is None) != (e2 is None):
        c.cmp(kind, "error", e1 or "(starts)", e2 or "(starts)")
    # After a refusal only what both runners got to is compared (the steps before the
    # refusal; the runners order their steps differently, so a refusal's stage and
    # words are each runner's own, judged against the reference by compare()).
    refused = e1 is not None or e2 is not None
    # Builders and bound views are read off the runner when its own initialize_kv_cache
    # ran, and recomputed from the shared functions otherwise: compare them only
    # between observations made the same way (each report row says which).
    same_fidelity = getattr(mrv1, "fidelity", None) == getattr(mrv2, "fidelity", None)

    def cmp(field: str, v1: Any, v2: Any) -> None:
        if refused and (v1 in (None, (), [], {}) or v2 in (None, (), [], {})):
            return
        c.cmp(kind, field, v1, v2)

    b1: Mapping[str, str] = getattr(mrv1, "layer_backends", {}) or {}
    b2: Mapping[str, str] = getattr(mrv2, "layer_backends", {}) or {}
    for layer in sorted(set(b1) | set(b2)):
        # The backend a layer (a draft in particular) runs under in each runner.
        cmp(f"{layer}.backend", b1.get(layer), b2.get(layer))
    cmp("layout", mrv1.layout, mrv2.layout)
    cmp(
        "groups",
        [(tuple(g.layer_names), g.block_size) for g in mrv1.groups],
        [(tuple(g.layer_names), g.block_size) for g in mrv2.groups],
    )
    cmp("num_blocks", mrv1.num_blocks, mrv2.num_blocks)
    cmp("bytes_per_block", mrv1.bytes_per_block, mrv2.bytes_per_block)
    if not refused or (mrv1.tensors and mrv2.tensors):
        compare_tensors(c, kind, mrv1.tensors, mrv2.tensors)
    if mrv1.kernel_block_sizes is not None and mrv2.kernel_block_sizes is not None:
        cmp("kernel_block_sizes", list(mrv1.kernel_block_sizes), list(mrv2.kernel_block_sizes))
    if same_fidelity:
        # Targets and drafts apart: the drafter (MRv1) / speculator (MRv2) builds the
        # drafts' metadata builders with its own code.
        drafts = draft_layers(case) if isinstance(case, CaseConfig) else set()
        k1 = dict(getattr(mrv1, "builder_kernel_block_sizes", {}) or {})
        k2 = dict(getattr(mrv2, "builder_kernel_block_sizes", {}) or {})
        for field_name, keep in (("builder_kernel_block_sizes", False), ("draft_builder_kernel_block_sizes", True)):
            part1 = {n: k for n, k in k1.items() if (n in drafts) == keep}
            part2 = {n: k for n, k in k2.items() if (n in drafts) == keep}
            if part1 or part2:
                cmp(field_name, part1, part2)
    c1 = getattr(mrv1, "connector_kernel_block_size", NOT_OBSERVED)
    c2 = getattr(mrv2, "connector_kernel_block_size", NOT_OBSERVED)
    if c1 is not NOT_OBSERVED and c2 is not NOT_OBSERVED:
        cmp("connector_kernel_block_size", c1, c2)
    for field_name in ("cache_block_size", "scheduler_block_size", "hash_block_size"):
        cmp(field_name, getattr(mrv1, field_name, None), getattr(mrv2, field_name, None))
    if not refused or (mrv1.registered and mrv2.registered and same_fidelity):
        compare_views(c, mrv1.registered, mrv2.registered, mismatch=True)
    if same_fidelity:
        # What layers are bound to after map_kv_caches_to_kernel_blocks: what the kernels index.
        bound1: Mapping[str, tuple[int, ...]] = getattr(mrv1, "bound_shapes", {}) or {}
        bound2: Mapping[str, tuple[int, ...]] = getattr(mrv2, "bound_shapes", {}) or {}
        for layer in sorted(set(bound1) | set(bound2)):
            cmp(f"{layer}.bound_shape", bound1.get(layer), bound2.get(layer))
    return tuple(c.out)


__all__ = ["KINDS", "compare_runners"]
