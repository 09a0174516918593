"""What the seeded sampler and the hypothesis strategy generate: valid, varied, replayable."""

from __future__ import annotations

from collections import Counter

from hypothesis import given

from reference.config import RUNNERS, CaseConfig
from reference.derive import derive
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.parallel import check_tp_dcp
from suites.profiles import PROJECT_SEED
from suites.strategies import FAMILIES, cases, sample_cases

SEED = 20261129


def test_sample_is_deterministic_and_json_replayable() -> None:
    first, again = sample_cases(SEED, 200), sample_cases(SEED, 200)
    assert first == again
    assert sample_cases(SEED + 1, 200) != first
    assert all(CaseConfig.from_json(c.to_json()) == c for c in first)


def test_sample_covers_every_family_and_parallel_shape() -> None:
    sample = sample_cases(SEED, 1000)
    families = Counter(c.name.split("-", 3)[-1] for c in sample)
    assert set(families) == set(FAMILIES), families
    assert min(families.values()) >= 35, families  # about 53 each for 19 families (a binomial sd of 7)
    parallel = Counter((c.tensor_parallel_size, c.decode_context_parallel_size) for c in sample)
    assert sum(n for (tp, _), n in parallel.items() if tp > 1) >= 200, parallel
    assert sum(n for (_, dcp), n in parallel.items() if dcp > 1) >= 50, parallel
    kinds = Counter(layer.kind for c in sample for layer in c.layers)
    assert {"full", "sliding_window", "mla", "mamba", "chunked_local", "sink_full", "cross"} <= set(kinds)
    assert {16, 48, 96, 272} <= {c.block_size for c in sample}
    assert {"fp8"} <= {layer.cache_dtype for c in sample for layer in c.layers}


def test_sample_never_asks_for_what_vllm_refuses_at_config_time() -> None:
    # Only derive-time outcomes: a layout, or vLLM's own startup refusal; never an
    # invalid case (ConfigError) and never sliding windows under DCP.
    outcomes = Counter()
    for case in sample_cases(SEED, 1000):
        check_tp_dcp(case.tensor_parallel_size, case.decode_context_parallel_size)
        if case.decode_context_parallel_size > 1:
            assert not any(l.kind == "sliding_window" for l in case.layers), case.to_json()
        started = False
        for runner in RUNNERS:  # derived where either runner starts it (MRv1 refuses a Step5 model outright)
            try:
                derive(case, runner)
                started = True
            except StartupError:
                pass
            except (ConfigError, NotModeledError) as exc:  # pragma: no cover - the failure path
                raise AssertionError(f"{exc}\n  config: {case.to_json()}") from None
        outcomes["derived" if started else "refused"] += 1
    assert outcomes["derived"] >= 500, outcomes


@given(cases())
def test_hypothesis_strategy_builds_valid_cases(case: CaseConfig) -> None:
    assert case.layers and case.block_size >= 16
    try:
        derive(case)
    except (StartupError, NotModeledError):
        pass


def test_the_sampled_layouts_are_the_reference_layouts() -> None:
    from reference.layout import LAYOUT_NAMES
    from suites.strategies import LAYOUTS

    assert sorted(LAYOUTS) == sorted(LAYOUT_NAMES) and len(LAYOUTS) == len(set(LAYOUTS))


def test_generation_1_draws_the_profile_from_what_generation_1_has() -> None:
    from reference.errors import NotModeledError, StartupError
    from reference.gen1 import derive_gen1
    from suites.release_cases import GEN1_FAMILIES, gen1_sample_cases

    cases = gen1_sample_cases("0.21.0", PROJECT_SEED, 1000)
    assert [c.name for c in cases] == [c.name for c in gen1_sample_cases("0.21.0", PROJECT_SEED, 1000)]
    assert {c.name.rsplit("-", 1)[1] for c in cases} == set(GEN1_FAMILIES)
    assert all(c.generation == 1 and c.vllm_version == "0.21.0" and c.layout in (None, "NHD", "HND") for c in cases)
    assert all(c.decode_context_parallel_size == 1 and c.connector is None and c.attention_backend is None
               and c.speculative_attention_backend is None for c in cases)
    # Enough of them the generation-1 reference judges (the release history asks for >= 300 per release);
    # the rest say why in one line (NotModeledError).
    judged = 0
    for case in cases:
        try:
            derive_gen1(case, "mrv1")
            judged += 1
        except StartupError:
            judged += 1
        except NotModeledError as exc:
            assert str(exc)
    assert judged >= 300, judged

