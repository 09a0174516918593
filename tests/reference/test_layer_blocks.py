"""``Derivation.layer_blocks`` / ``Derivation.head_slice``: a connector's block arithmetic,
answered by the reference (``conformance/connectors/validate.py`` asks these)."""

from __future__ import annotations

import pytest

from reference.derive import derive
from reference.errors import ConfigError
from reference.intervals import merge, total
from suites.named_cases import CASES



def _derivable(name: str, runner: str) -> bool:
    try:
        derive(CASES[name], runner)
    except Exception:  # noqa: BLE001 - refused or not modeled: nothing to address
        return False
    return True


# Dense attention cases the reference derives (refusals have no blocks to address).
DENSE = [
    (name, runner)
    for name, case in CASES.items()
    if case.generation == 2 and all(layer.kind == "full" for layer in case.layers)
    for runner in ("mrv1", "mrv2")
    if _derivable(name, runner)
]


@pytest.mark.parametrize("name, runner", DENSE)
def test_all_heads_of_a_block_are_its_k_and_v_bytes(name: str, runner: str) -> None:
    d = derive(CASES[name], runner)
    for layer, view in d.registered.items():
        blocks = d.layer_blocks(layer)
        assert blocks.kernel_blocks_per_block * d.num_blocks == view.shape[0]
        assert blocks.kernel_block_tokens * blocks.kernel_blocks_per_block == blocks.block_tokens
        for block in (0, d.num_blocks - 1):
            bb = d.block_bytes(layer, block)
            content = merge([*bb.k.runs(), *(bb.v.runs() if bb.v is not None else ())])
            assert merge(d.head_slice(layer, block, 0, blocks.heads)) == content
            # Two halves of the heads: disjoint, together the whole content.
            half = blocks.heads // 2
            lo, hi = merge(d.head_slice(layer, block, 0, half)), merge(d.head_slice(layer, block, half, blocks.heads))
            assert total(lo) + total(hi) == total(content)


def test_head_slice_refuses_what_is_not_there() -> None:
    d = derive(CASES["flashinfer-b128-k64"], "mrv1")
    layer = next(iter(d.registered))
    with pytest.raises(ConfigError, match="block id 99"):
        d.head_slice(layer, 99, 0, 1)
    with pytest.raises(ConfigError, match="heads"):
        d.head_slice(layer, 0, 0, 10_000)
    with pytest.raises(ConfigError, match="not one of the registered layers"):
        d.layer_blocks("nope")
