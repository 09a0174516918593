"""The release registry (``reference.releases``): the version parser, the spans each
generation's facts cover, what each per-release fact says at its bounds, and the files that
cannot import it (``pyproject.toml``, ``scripts/env.sh``) agreeing with its target release."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference import backends
from reference.config import CaseConfig, uniform_layers
from reference.errors import ConfigError, NotModeledError
from reference.releases import (
    BY_CONTRACT,
    BY_FACTS,
    BY_NEWEST_FACTS,
    GEN1_KERNEL_BLOCK_SIZES,
    GEN1_LAYOUT_OVERRIDES,
    ATTENTION_PAGES_PADDED,
    GEN2_DIFFERENCES,
    PROMOTED_WINDOW_KEEPS_ITS_BLOCK,
    SLIDING_WINDOW_BLOCK_DECOUPLED,
    MOONCAKE_KERNEL_SYNC,
    MRV2_KERNEL_BLOCKS,
    MRV2_SLIDING_WINDOW_REACH,
    ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK,
    PACKED_GROUPS_KEEP_MANAGER_BLOCKS,
    STRIDE_ALIGNMENT_FROM_KERNEL_SIZES,
    TARGET_RELEASE,
    check_gen1_version,
    check_gen2_version,
    fact_at,
    holds,
    is_unreleased,
    judgement_for,
    parse_version,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_parser_keeps_the_release_part_only() -> None:
    assert parse_version("0.22.1rc1.dev116+g71df063c4") == (0, 22, 1)
    assert parse_version("v0.28") == (0, 28, 0)
    assert parse_version("0.33.1.dev12+cu128") == (0, 33, 1)
    with pytest.raises(ConfigError, match="is not of the form MAJOR.MINOR"):
        parse_version("latest")
    with pytest.raises(ConfigError, match="is not a string"):
        parse_version(33)  # type: ignore[arg-type]


def test_the_target_release_is_read_from_the_registry() -> None:
    assert backends.VLLM_VERSION == TARGET_RELEASE
    assert CaseConfig("c", uniform_layers(1)).vllm_version == TARGET_RELEASE
    check_gen2_version(TARGET_RELEASE)


def test_each_generation_says_which_releases_it_has_facts_for() -> None:
    assert check_gen2_version("0.29.0") == (0, 29, 0)
    assert check_gen2_version("0.30.0") == (0, 30, 0)
    assert check_gen2_version("0.31.2") == (0, 31, 2)
    assert check_gen2_version("0.33.9.dev1") == (0, 33, 9)
    for outside in ("0.28.0", "0.34.0rc1"):
        with pytest.raises(NotModeledError) as refused:
            check_gen2_version(outside)
        assert str(refused.value) == (
            f"the reference has no generation-2 facts for vLLM {outside} (it has them for 0.29.0 to 0.33.x; "
            "generation 1: 0.19 to 0.28)"
        )
    assert check_gen1_version("0.28.3") == (0, 28, 3)
    # 0.29 already derives every layout from specs (generation 2), without facts of its own.
    for release in ("0.29.1", "0.30.0"):
        with pytest.raises(ConfigError, match=rf"^vLLM {release} is generation 2 \(>= 0.29.0\); generation 1 covers "
                                              r"0.19.0 to 0.28.x$"):
            check_gen1_version(release)


def test_every_fact_names_where_it_was_read_and_series_run_oldest_first() -> None:
    series = [MRV2_KERNEL_BLOCKS, MOONCAKE_KERNEL_SYNC, SLIDING_WINDOW_BLOCK_DECOUPLED, ATTENTION_PAGES_PADDED, PROMOTED_WINDOW_KEEPS_ITS_BLOCK, *GEN2_DIFFERENCES.values(),
              *GEN1_LAYOUT_OVERRIDES.values(), *GEN1_KERNEL_BLOCK_SIZES.values()]
    for facts in series:
        assert [f.since for f in facts] == sorted({f.since for f in facts})
        assert all(f.source.strip() for f in facts)


@pytest.mark.parametrize(
    ("facts", "release", "expected"),
    [
        (MRV2_KERNEL_BLOCKS, "0.21.2", False),
        (MRV2_KERNEL_BLOCKS, "0.22.0", True),
        (MOONCAKE_KERNEL_SYNC, "0.19.1", False),
        (MOONCAKE_KERNEL_SYNC, "0.20.0", True),
        (SLIDING_WINDOW_BLOCK_DECOUPLED, "0.24.0", False),
        (SLIDING_WINDOW_BLOCK_DECOUPLED, "0.25.0", True),
        (ATTENTION_PAGES_PADDED, "0.23.0", False),
        (ATTENTION_PAGES_PADDED, "0.24.0", True),
        (PROMOTED_WINDOW_KEEPS_ITS_BLOCK, "0.26.0", True),
        (PROMOTED_WINDOW_KEEPS_ITS_BLOCK, "0.27.0", False),
        (MRV2_SLIDING_WINDOW_REACH, "0.32.4", False),
        (PACKED_GROUPS_KEEP_MANAGER_BLOCKS, "0.31.1", False),
        (PACKED_GROUPS_KEEP_MANAGER_BLOCKS, "0.32.0", True),
        (STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, "0.30.0", False),
        (STRIDE_ALIGNMENT_FROM_KERNEL_SIZES, TARGET_RELEASE, True),
        (MRV2_SLIDING_WINDOW_REACH, "0.33.0", True),
        (MRV2_SLIDING_WINDOW_REACH, TARGET_RELEASE, True),
        (ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK, "0.30.0", False),
        (ONE_REPLICATED_GROUP_SPANS_ITS_BLOCK, "0.31.0", True),
    ],
)
def test_each_behaviour_is_there_from_its_release_on(facts, release: str, expected: bool) -> None:
    assert holds(facts, release) is expected
    assert holds(facts, parse_version(release)) is expected


def test_a_series_says_nothing_before_its_first_fact() -> None:
    assert fact_at(GEN1_LAYOUT_OVERRIDES["FLASH_ATTN"], (0, 22, 1)) is None
    assert fact_at(GEN1_LAYOUT_OVERRIDES["FLASH_ATTN"], (0, 23, 0)).value.shape == "B2NHD"
    assert not holds(MRV2_SLIDING_WINDOW_REACH, "0.31.0")


# --- the files that cannot import the registry -------------------------------------------


def _next_minor(release: str) -> str:
    major, minor, _ = parse_version(release)
    return f"{major}.{minor + 1}"


def test_env_sh_installs_the_target_release_by_default() -> None:
    script = (ROOT / "scripts" / "env.sh").read_text()
    (default,) = re.findall(r'^vllm_release="\$\{KVCONFORM_VLLM:-([^}]*)\}"$', script, flags=re.M)
    assert default == TARGET_RELEASE
    # Every vLLM release the script names is the target too (its messages say which it installs).
    named = set(re.findall(r"vLLM (\d+\.\d+\.\d+)", script))
    assert named <= {TARGET_RELEASE}, named


def test_pyproject_allows_up_to_the_target_releases_next_minor() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    (lower, upper) = re.findall(r'"vllm>=([\d.]+),<([\d.]+)"', pyproject)[0]
    assert upper == _next_minor(TARGET_RELEASE)
    check_gen1_version(lower)  # the oldest release the range admits is one the reference models


# --- what a run is judged by -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("installed", "basis", "facts"),
    [
        (TARGET_RELEASE, BY_FACTS, TARGET_RELEASE),
        ("0.32.0", BY_FACTS, "0.32.0"),
        ("0.32.0+cpu", BY_FACTS, "0.32.0"),  # a platform build of a release is that release
        ("0.33.0+cu128", BY_FACTS, "0.33.0"),
        ("0.34.0.dev12+g1a2b3c4", BY_NEWEST_FACTS, TARGET_RELEASE),  # vLLM's CI
        ("0.33.0+g9f8e7d6", BY_NEWEST_FACTS, "0.33.0"),  # a source build at a release's tag or after it
        ("0.33.1rc1", BY_NEWEST_FACTS, "0.33.1"),
        ("0.35.0", BY_NEWEST_FACTS, TARGET_RELEASE),  # a release after the newest facts
        ("0.30.0", BY_FACTS, "0.30.0"),
        ("0.31.0", BY_FACTS, "0.31.0"),
        ("0.29.1", BY_FACTS, "0.29.1"),
        ("0.18.0", BY_CONTRACT, None),  # older than generation 1: no facts
        ("0.21.0", BY_FACTS, "0.21.0"),
        ("0.28.1.dev3", BY_NEWEST_FACTS, "0.28.1"),
    ],
)
def test_every_vllm_is_judged_never_refused_for_lack_of_facts(installed: str, basis: str, facts: str | None) -> None:
    judgement = judgement_for(installed)
    assert (judgement.basis, judgement.facts_release) == (basis, facts)
    assert judgement.describe().startswith(f"vLLM {installed}")
    assert ("contract" in judgement.describe()) and (facts is None or f"{facts}'s facts" in judgement.describe())


def test_the_header_for_vllms_ci_says_unreleased_and_which_facts() -> None:
    assert judgement_for("0.34.0.dev12+g1a2b3c4").describe() == (
        f"vLLM 0.34.0.dev12+g1a2b3c4 (unreleased): judged by the contract and by {TARGET_RELEASE}'s facts")
    assert judgement_for("0.18.0").describe() == (
        "vLLM 0.18.0 (the reference has no facts for it): judged by the contract alone")
    assert judgement_for("0.29.0").describe() == "vLLM 0.29.0: judged by the contract and by 0.29.0's facts"


def test_contract_only_is_asked_for() -> None:
    judgement = judgement_for(TARGET_RELEASE, contract_only=True)
    assert judgement.contract_only and judgement.facts_release is None
    # The header must not claim the reference lacks facts for a release it has them for.
    assert judgement.describe() == f"vLLM {TARGET_RELEASE}: judged by the contract alone (asked for: --contract-only)"


@pytest.mark.parametrize("text", ["0.34.0.dev12+g1a2b3c4", "0.33.1rc1", "0.33.0+g9f8e7d", "0.34.0a1", "0.34.0.dev0"])
def test_unreleased_builds_are_recognised(text: str) -> None:
    assert is_unreleased(text)


@pytest.mark.parametrize("text", ["0.33.0", "0.32.0+cpu", "0.33.0+cu128", "0.33.0+rocm6.4", "0.33.0+gfx942"])
def test_releases_and_platform_builds_are_not_unreleased(text: str) -> None:
    assert not is_unreleased(text)


def test_a_version_that_is_no_version_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'main'"):
        judgement_for("main")


def test_one_replicated_group_is_scaled_by_dcp_before_031() -> None:
    """A model whose one KV cache group is a Mamba state (Gated DeltaNet beside encoder-only layers) at DCP 2:
    0.29 and 0.30 scale its 4096-token block by DCP like an attention group's, 0.31 on keeps it."""
    from reference.derive import derive
    from reference.config import LayerConfig, StateMixer

    gdn = StateMixer("gated_delta_net", num_heads=8, head_dim=16, num_k_heads=16, head_k_dim=8)
    layers = (LayerConfig("model.layers.0.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
              LayerConfig("model.encoder.layer.0.attention.self.attn", kind="encoder_only", num_kv_heads=1, head_size=64))
    case = CaseConfig("one-state-group-dcp2", layers, block_size=32, num_blocks=2, tensor_parallel_size=2,
                      decode_context_parallel_size=2)
    sizes = {v: derive(CaseConfig.from_dict(dict(case.to_dict(), vllm_version=v)), "mrv2").scheduler_block_size
             for v in ("0.30.0", "0.31.0")}
    assert sizes == {"0.30.0": 8192, "0.31.0": 4096}
