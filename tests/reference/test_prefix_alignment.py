"""``resolve_kv_cache_block_sizes``' last check, as the engine core makes it: prefix-cache boundaries must cut no
compressed state, asked of the *scheduler's* config (``generate_scheduler_kv_cache_config``), where a uniform-type
group is represented by its first layer's spec."""

from __future__ import annotations

import pytest

from reference.config import CaseConfig
from reference.derive import derive
from reference.errors import StartupError
from suites.named_cases import deepseek_v4_caches


def _dsv4(ratios: tuple[int, ...], block_size: int) -> CaseConfig:
    return CaseConfig("dsv4-prefix", deepseek_v4_caches(ratios), block_size=block_size, num_blocks=64,
                      capability=(10, 0), connector="nixl")


def test_a_c128_layer_behind_c4_layers_in_one_group_is_not_asked() -> None:
    """Found by the ci sample (random-s20261129-233-dsv4): at block 16 the C128 attention shares the C4 layers'
    uniform-type group, whose first spec (the C4 indexer's 4 tokens a state) is all the check sees; vLLM goes on to
    the worker, where the C4 indexer's 256-token kernel block refuses the 16-token group."""
    with pytest.raises(StartupError, match=r"No common block size for 16 \(DEEPSEEK_V4_INDEXER: 256\)"):
        derive(_dsv4((4, 0, 4, 128), 16))


def test_a_group_whose_first_spec_is_cut_is_refused() -> None:
    """C128 first (random-s20261129-197-dsv4's pattern) at block 272 with a connector hashing blocks: the compressed
    group's first spec keeps 128 tokens a state, which the 4-token hash block does not divide (and vLLM refuses)."""
    case = CaseConfig("dsv4-prefix", deepseek_v4_caches((128, 4, 128, 128)), block_size=272, num_blocks=64,
                      capability=(10, 0), connector="offloading")
    with pytest.raises(StartupError, match=r"Invalid prefix_match_unit=4; .* Got alignments=\[128\]"):
        derive(case)
