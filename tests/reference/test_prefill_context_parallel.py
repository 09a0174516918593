"""Prefill context parallelism (PCP): its refusals, and the contract that it changes no layout."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reference.config import CaseConfig
from reference.derive import derive
from reference.errors import ConfigError, StartupError
from reference.parallel import PCP_MODEL_RUNNER_REFUSAL, check_tp_dcp, prefill_context_parallel_refusal
from suites.named_cases import CASES


@pytest.mark.parametrize(("tp", "dcp", "pcp"), [(1, 1, 2), (2, 2, 2), (2, 4, 2), (4, 2, 1), (1, 3, 3)])
def test_valid_parallel_sizes_pass(tp: int, dcp: int, pcp: int) -> None:
    check_tp_dcp(tp, dcp, pcp)


@pytest.mark.parametrize(("tp", "dcp", "pcp"), [(2, 3, 2), (4, 2, 4), (1, 2, 4)])
def test_dcp_must_span_nothing_pcp_or_tp_times_pcp(tp: int, dcp: int, pcp: int) -> None:
    with pytest.raises(ConfigError, match=rf"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are"):
        check_tp_dcp(tp, dcp, pcp)


def _refusal(runner: str = "mrv2", dcp: int = 1, **model: bool) -> str | None:
    traits = dict(use_mla=True, is_encoder_decoder=False, has_drafts=False, is_sparse_mla=False) | model
    found = prefill_context_parallel_refusal(runner, 2, dcp, **traits)
    return None if found is None else found[0]


def test_refusals_in_the_order_vllm_checks_them() -> None:
    assert _refusal("mrv1") == PCP_MODEL_RUNNER_REFUSAL
    assert _refusal(use_mla=False, is_encoder_decoder=True) == "MRV2 PCP currently supports MLA models only."
    assert _refusal(is_encoder_decoder=True, has_drafts=True) == "MRV2 PCP does not support encoder-decoder models yet."
    assert _refusal(has_drafts=True, dcp=2) == "MRV2 PCP only supports DSpark or single-module MTP speculative decoding."
    assert _refusal(dcp=2) == "MRV2 PCP + DCP supports sparse MLA models only."
    assert _refusal(dcp=2, is_sparse_mla=True) is None
    assert _refusal() is None
    assert prefill_context_parallel_refusal("mrv1", 1, 1, use_mla=False, is_encoder_decoder=False,
                                            has_drafts=False, is_sparse_mla=False) is None


PCP_REFUSALS = ("MRV2 PCP", "PCP requires attention backend support", "No valid attention backend found",
                "Selected backend",
                # a family's own layer class refusing PCP in its constructor (Kimi K3's MLA)
                "Kimi-K3 MultiHeadLatentAttention does not support prefill context parallelism")

MLA_CASES = [name for name, case in CASES.items()
             if case.generation == 2 and case.prefill_context_parallel_size == 1
             and any(layer.kind == "mla" for layer in case.layers)]


@pytest.mark.parametrize("name", MLA_CASES)
def test_pcp_changes_no_layout_where_mrv2_runs_it(name: str) -> None:
    """Contract: PCP alone replicates the cache, so MRv2's plan, views and kernel blocks are those
    of the same case without it; MRv1 refuses it outright."""
    case = CASES[name]
    with_pcp = replace(case, prefill_context_parallel_size=2)
    with pytest.raises(StartupError, match="Model Runner V1 does not support"):
        derive(with_pcp, "mrv1")
    try:
        plain = derive(case, "mrv2")
    except StartupError:
        with pytest.raises(StartupError):  # PCP gives no way to start what MRv2 refuses without it
            derive(with_pcp, "mrv2")
        return
    try:
        parallel = derive(with_pcp, "mrv2")
    except StartupError as exc:
        # Only PCP's own refusals: drafts, encoder-decoder models, backends or layer classes without PCP.
        assert str(exc).startswith(PCP_REFUSALS), str(exc)
        assert "PCP" in str(exc) or "prefill context parallelism" in str(exc), str(exc)
        return
    assert parallel.plan == plain.plan
    assert parallel.registered == plain.registered
    assert parallel.kernel_block_sizes == plain.kernel_block_sizes
    assert parallel.scheduler_block_size == plain.scheduler_block_size


def test_a_pcp_case_round_trips_and_stays_out_of_json_at_one() -> None:
    case = CASES["pcp2-mla-flashmla-b64"]
    assert CaseConfig.from_json(case.to_json()) == case
    assert "prefill_context_parallel_size" not in CASES["mla-flashmla-b64"].to_dict()


def test_backends_without_pcp_support_are_refused_by_the_selector() -> None:
    case = CASES["mla-flashmla-b64"]
    mixed = replace(case, prefill_context_parallel_size=2,
                    layers=case.layers + (replace(CASES["dense-fa-b128-lbhnc"].layers[0], name="full.0"),))
    with pytest.raises(StartupError, match=r"No valid attention backend found: FLASH_ATTN: \['PCP not supported'\]"):
        derive(mixed, "mrv2")
