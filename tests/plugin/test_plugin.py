"""The kvconform pytest plugin: options, seeded sampling, hypothesis profiles, fixtures, coverage.

Every inner session loads the plugin through its ``pytest11`` entry point (the package is
installed in the test environments). None of these tests needs vLLM: conformance is
checked against ``reference_observation``, the reference's own prediction shaped like an
observation of vLLM.
"""

from __future__ import annotations

import json
import re

import pytest

from conformance.pytest_plugin import PROJECT_SEED

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

SAMPLED = """
import pytest

@pytest.mark.kvconform_sample(count=4)
def test_case(kv_case):
    assert kv_case.layers
"""

SAMPLED_DEFAULT = """
def test_case(kv_case):
    assert kv_case.layers
"""


def _ids(result: pytest.RunResult) -> list[str]:
    return sorted(set(re.findall(r"test_\w+\.py::test_case\[([^\]]+)\]", result.stdout.str())))


def test_options_are_registered_and_shown_in_the_header(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SAMPLED_DEFAULT)
    result = pytester.runpytest("--kvconform-seed", "7", "--kvconform-examples", "5", "--kvconform-profile", "thorough")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "kvconform: seed 7 (--kvconform-seed), profile thorough, examples 5 sampled / 5 hypothesis (kvconform-thorough-seed7-n5)*",
            "kvconform: vllm *, torch *, gpu *",
        ]
    )
    help_text = pytester.runpytest("--help").stdout.str()
    for option in ("--kvconform-seed", "--kvconform-examples", "--kvconform-profile", "--kvconform-coverage-json"):
        assert option in help_text


OPT_IN = "[pytest]\nkvconform_hypothesis = true\n"
"""The ini flag kvconform's own suite sets (pyproject.toml) to load its hypothesis profile."""


def test_defaults_are_the_project_seed_and_the_ci_profile(pytester: pytest.Pytester) -> None:
    pytester.makeini(OPT_IN)
    pytester.makepyfile(SAMPLED)
    result = pytester.runpytest()
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [f"kvconform: seed {PROJECT_SEED} (project default), profile ci, examples 1000 sampled / 60 hypothesis (kvconform-ci)*"]
    )
    assert _ids(result) == [] or all(i.startswith(f"random-s{PROJECT_SEED}-") for i in _ids(result))


@pytest.mark.parametrize(
    "args, message",
    [
        (("--kvconform-seed", "abc"), "expected an integer or 'random'"),
        (("--kvconform-examples", "0"), "must be >= 1"),
        (("--kvconform-profile", "nightly"), "invalid choice"),
        (("--kvconform-shard", "3/2"), "--kvconform-shard: shard '3/2': the index 3 must be from 1 to the count 2"),
        (("--kvconform-shard", "a/b"), "the index 'a' is not a whole number"),
    ],
)
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    pytester.makepyfile(SAMPLED)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_shards_split_the_collected_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import pytest

@pytest.mark.kvconform_sample(count=9)
def test_case(kv_case):
    assert kv_case.layers

@pytest.mark.parametrize("n", range(4))
def test_plain(n):
    pass
""")
    everything = pytester.runpytest("-v")
    everything.assert_outcomes(passed=13)
    parts = [pytester.runpytest("-v", "--kvconform-shard", f"{k}/3") for k in (1, 2, 3)]
    ran = [set(re.findall(r"::(test_\w+\[[^\]]+\]) PASSED", p.stdout.str())) for p in parts]
    assert all(r for r in ran)  # none of the three is empty
    assert sum(len(r) for r in ran) == 13 and set().union(*ran) == set(re.findall(r"::(test_\w+\[[^\]]+\]) PASSED", everything.stdout.str()))
    assert "deselected" in parts[0].stdout.str()


def test_random_seed_is_printed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SAMPLED)
    result = pytester.runpytest("--kvconform-seed", "random", "-v")
    result.assert_outcomes(passed=4)
    seed = re.search(r"kvconform: seed (\d+) \(random\)", result.stdout.str())
    assert seed, result.stdout.str()
    result.stdout.fnmatch_lines([f"kvconform: seed {seed.group(1)} (random), profile ci; rerun with --kvconform-seed {seed.group(1)}"])
    assert all(i.startswith(f"random-s{seed.group(1)}-") for i in _ids(result))


def test_seed_makes_ids_stable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SAMPLED)
    first = _ids(pytester.runpytest("--kvconform-seed", "11", "-v"))
    second = _ids(pytester.runpytest("--kvconform-seed", "11", "-v"))
    other = _ids(pytester.runpytest("--kvconform-seed", "12", "-v"))
    assert len(first) == 4 and first == second
    assert other != first


def test_ids_are_identical_on_xdist_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(SAMPLED)
    alone = _ids(pytester.runpytest("--kvconform-seed", "11", "-v"))
    spread = pytester.runpytest_subprocess("--kvconform-seed", "11", "-v", "-n", "2")
    spread.assert_outcomes(passed=4)
    assert _ids(spread) == alone and len(alone) == 4
    # A random seed is drawn once on the controller: workers collect the same ids.
    rand = pytester.runpytest_subprocess("--kvconform-seed", "random", "-v", "-n", "2")
    rand.assert_outcomes(passed=4)


COVERAGE = """
import pytest
from conformance.pytest_plugin import reference_observation
from reference.config import CaseConfig, LayerConfig

def case(name, backend, layout=None, dtype="auto"):
    return CaseConfig(name=name, block_size=16, num_blocks=4, layout=layout, layers=(
        LayerConfig("model.layers.0.self_attn.attn", backend=backend, num_kv_heads=2, head_size=64, cache_dtype=dtype),
        LayerConfig("model.layers.1.self_attn.attn", backend=backend, num_kv_heads=2, head_size=64, cache_dtype=dtype),
    ))

A = case("a", "FLASH_ATTN")
B = case("b", "TRITON_ATTN", layout="LBHNC", dtype="fp8")

@pytest.mark.parametrize("n", range(3))
def test_a(assert_conforms, n):
    assert_conforms(A, reference_observation(A))
    assert_conforms(A, reference_observation(A))  # the same case twice in one test counts once

def test_b(assert_conforms):
    assert_conforms(B, reference_observation, runner="mrv2")

def test_skipped_cases_do_not_count(assert_conforms):
    pytest.skip("not run")
"""


def _coverage_rows(result: pytest.RunResult) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("kvconform coverage:"))
    return lines[start : start + 4]


def test_coverage_table_counts_cells(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(COVERAGE)
    out = pytester.path / "cov.json"
    result = pytester.runpytest("--kvconform-coverage-json", str(out))
    result.assert_outcomes(passed=4, skipped=1)
    rows = _coverage_rows(result)
    assert rows[0].startswith("kvconform coverage: 4 case runs, 2 cells (backend x layout x kind x dtype)")
    assert rows[1].split() == ["backend", "kind", "dtype", "auto", "LBHNC"]
    assert rows[2].split() == ["FLASH_ATTN", "full", "bfloat16", "3", "."]
    assert rows[3].split() == ["TRITON_ATTN", "full", "fp8", ".", "1"]
    result.stdout.fnmatch_lines(["parallel (runs per TP/DCP): tp1/dcp1 4"])
    data = json.loads(out.read_text())
    assert data["parallel"] == {"tp1/dcp1": 4}
    assert data["runs"] == 4 and data["seed"] == PROJECT_SEED and data["profile"] == "ci"
    assert data["cells"] == [
        {"backend": "FLASH_ATTN", "layout": "auto", "kind": "full", "dtype": "bfloat16", "count": 3},
        {"backend": "TRITON_ATTN", "layout": "LBHNC", "kind": "full", "dtype": "fp8", "count": 1},
    ]


def test_coverage_is_merged_from_xdist_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(COVERAGE, test_sampled=SAMPLED)
    alone, spread = pytester.path / "alone.json", pytester.path / "spread.json"
    pytester.runpytest("--kvconform-coverage-json", str(alone)).assert_outcomes(passed=8, skipped=1)
    result = pytester.runpytest_subprocess("-n", "2", "--kvconform-coverage-json", str(spread))
    result.assert_outcomes(passed=8, skipped=1)
    assert json.loads(spread.read_text()) == json.loads(alone.read_text())
    assert json.loads(spread.read_text())["runs"] == 8
    result.stdout.fnmatch_lines(["kvconform coverage: 8 case runs, *"])


FAILING = """
from dataclasses import replace
from conformance.pytest_plugin import reference_observation
from suites.named_cases import get_case

def test_layout_moved(assert_conforms):
    case = get_case("flashinfer-b128-k64")
    obs = reference_observation(case)
    obs.layout = "BHLNC" if obs.layout != "BHLNC" else "LBNHC"
    obs.num_blocks = obs.num_blocks + 1
    assert_conforms(case, obs)

def test_passes(assert_conforms):
    result = assert_conforms("flashinfer-b128-k64", reference_observation, runner="mrv2")
    assert result.status == "pass" and result.runner == "mrv2"
"""


def test_assert_conforms_failure_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FAILING)
    result = pytester.runpytest("--kvconform-seed", "5")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            # "(drift)" after "facts" where the installed vLLM is an unreleased build.
            "E*AssertionError: case flashinfer-b128-k64 [[]mrv1[]] does not conform to the contract and the "
            "reference's facts*: 4 divergences",
            # One more block and the views no longer count num_blocks x 2 kernel blocks: the contract.
            "E*  kernel_blocks: *a dimension of 10 kernel blocks: observed (*) vs expected 10 [[]contract[]]",
            "E*  kernel_blocks: *",
            # "[drift]" after each fact's divergence where the installed vLLM is an unreleased build.
            "E*  layout: layout: observed '*' vs expected '*'*",
            "E*  num_blocks: num_blocks: observed * vs expected *",
            "E*seed: 5 (profile ci)",
            "E*config: {*}",
            "E*replay: python -m gpu_impl.vllm_cpu.planning '{*}' mrv1",
            "E*rerun: pytest test_assert_conforms_failure_message.py::test_layout_moved --kvconform-seed 5",
        ]
    )


def test_kv_observed_skips_without_vllm_and_fails_where_it_cannot_be_driven(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import conformance.assertions as plugin  # the library the plugin's fixtures call

        def test_observe(kv_observed, monkeypatch):
            monkeypatch.setattr(plugin, "vllm_problem", lambda: "vllm is not installed; stand-in")
            monkeypatch.setattr(plugin, "vllm_absent", lambda: True)
            kv_observed("flashinfer-b128-k64", "mrv1")

        def test_assert_with_a_runner(assert_conforms, monkeypatch):
            monkeypatch.setattr(plugin, "vllm_problem", lambda: "vllm is not installed; stand-in")
            monkeypatch.setattr(plugin, "vllm_absent", lambda: True)
            assert_conforms("flashinfer-b128-k64", "mrv2")

        def test_an_undrivable_vllm_fails(kv_observed, monkeypatch):
            monkeypatch.setattr(plugin, "vllm_problem", lambda: "vLLM 0.21.0 does not provide what it needs; stand-in")
            monkeypatch.setattr(plugin, "vllm_absent", lambda: False)
            kv_observed("flashinfer-b128-k64", "mrv1")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2, failed=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *: vllm is not installed; stand-in"] * 2)
    result.stdout.fnmatch_lines(["*vLLM is installed but cannot be driven: vLLM 0.21.0 does not provide what it needs; stand-in*"])


def test_sampled_failures_print_seed_config_and_rerun(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kvconform_sample(count=1)
        def test_case(kv_case):
            assert False, "boom"
        """
    )
    result = pytester.runpytest("--kvconform-seed", "3")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*kvconform replay*", "seed: 3 (profile ci)", "config: {*}", "rerun: pytest *test_case?random-s3-0-* --kvconform-seed 3"]
    )


HYPOTHESIS = """
from hypothesis import given, settings, strategies as st

def test_count():
    calls = []

    @given(st.integers(0, 10**9))
    def inner(x):
        calls.append(x)

    inner()
    print(f"COUNT={len(calls)} PROFILE={settings.get_current_profile_name()} DERANDOMIZE={settings.default.derandomize}")
"""


def _hypothesis_run(pytester: pytest.Pytester, *args: str) -> str:
    result = pytester.runpytest_subprocess("-s", *args)
    result.assert_outcomes(passed=1)
    match = re.search(r"COUNT=\d+ PROFILE=\S+ DERANDOMIZE=\w+", result.stdout.str())
    assert match, result.stdout.str()
    return match.group(0)


def test_ci_env_does_not_change_hypothesis(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hypothesis")
    pytester.makeini(OPT_IN)
    pytester.makepyfile(HYPOTHESIS)
    local = _hypothesis_run(pytester)
    monkeypatch.setenv("CI", "true")
    in_ci = _hypothesis_run(pytester)
    assert in_ci == local == "COUNT=60 PROFILE=kvconform-ci DERANDOMIZE=True"
    assert _hypothesis_run(pytester, "--kvconform-examples", "7") == "COUNT=7 PROFILE=kvconform-ci-n7 DERANDOMIZE=True"


def test_another_projects_markers_and_hypothesis_settings_stay_its_own(pytester: pytest.Pytester) -> None:
    """Installed beside another project, kvconform touches neither its `gpu`/`vllm`
    markers nor its hypothesis profile (nothing asked for kvconform's)."""
    pytest.importorskip("hypothesis")
    pytester.makeini("[pytest]\nmarkers =\n    gpu: theirs\n    vllm: theirs\n")
    pytester.makepyfile(
        """
        import pytest
        from hypothesis import settings

        settings.register_profile("theirs", max_examples=3)
        settings.load_profile("theirs")

        @pytest.mark.gpu
        def test_their_gpu_test():
            pass

        @pytest.mark.vllm
        def test_their_vllm_test():
            pass

        def test_their_profile():
            assert settings.get_current_profile_name() == "theirs"
            assert settings().max_examples == 3
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*hypothesis: not loaded by kvconform*"])


def test_gpu_profile_keeps_only_gpu_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.kvconform_gpu
        def test_on_gpu():
            pass

        def test_on_cpu():
            pass
        """
    )
    result = pytester.runpytest("--kvconform-profile", "gpu", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("deselected") == 1
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 1
    if outcomes.get("skipped"):
        result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])


def test_coverage_counts_parallel_sizes() -> None:
    from conformance.coverage import Coverage, from_data
    from suites.named_cases import CASES

    cov = Coverage()
    for name in ("gqa-tp8-dcp4-flashinfer-b128", "mla-gqa-draft-dcp2", "dense-fa-b128-lbhnc"):
        cov.record(CASES[name], "t")
    assert cov.parallel == {"tp8/dcp4": 1, "tp4/dcp2": 1, "tp1/dcp1": 1}
    assert cov.table()[-1] == "parallel (runs per TP/DCP): tp1/dcp1 1, tp4/dcp2 1, tp8/dcp4 1"
    assert from_data([cov.to_data(), cov.to_data()]).parallel == {"tp8/dcp4": 2, "tp4/dcp2": 2, "tp1/dcp1": 2}


def test_a_failing_assert_conforms_shows_the_diff_not_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from types import SimpleNamespace

        def test_refused_for_another_reason(assert_conforms):
            observed = SimpleNamespace(error="ValueError: totally unrelated failure", unsupported=None)
            assert_conforms("flashinfer-b128-k64-lhbnc", observed, runner="mrv1")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "startup_error: error reason" in text and "replay:" in text
    assert "def check_conforms" not in text and "def _assert" not in text  # __tracebackhide__


LAYOUT_MOVED_BETWEEN_RUNNERS = """
from conformance.pytest_plugin import check_runners_agree, reference_observation
from suites.named_cases import get_case

def test_runners_agree():
    case = get_case("flashinfer-b128-k64")
    moved = reference_observation(case, "mrv2")
    moved.layout = "BHLNC"
    expected = check_runners_agree(case, reference_observation(case, "mrv1"), moved)
    print("absorbed by", [(m.expectation.id, m.expectation.source) for m in expected])
"""

MY_ENTRY = """schema = 1

[[expectation]]
id = "{id}"
kind = "mrv1_mrv2_mismatch"
case = "flashinfer-b128-k64"
field = "layout"
reason = "my-vllm-fork PR #123 moves MRv2's FlashInfer cache to BHLNC on purpose"
"""


def test_expectations_ini_option_layers_a_consumer_file(pytester: pytest.Pytester) -> None:
    import conformance.assertions as assertions

    pytester.makepyfile(LAYOUT_MOVED_BETWEEN_RUNNERS)
    # Without a consumer file the shipped expectations do not know this difference.
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*case flashinfer-b128-k64: MRv1 and MRv2 differ beyond conformance/expectations.toml",
                                 "E*layout: MRv1 'LBNHC' vs MRv2 'BHLNC'"])
    (pytester.path / "ci").mkdir()
    (pytester.path / "ci" / "kvconform-expectations.toml").write_text(MY_ENTRY.format(id="my-layout-move"))
    pytester.makeini("[pytest]\nkvconform_expectations =\n    ci/kvconform-expectations.toml\n")
    result = pytester.runpytest("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "kvconform: expectations conformance/expectations.toml (shipped) + ci/kvconform-expectations.toml",
        "*absorbed by [[]('my-layout-move', 'ci/kvconform-expectations.toml')[]]",
    ])
    # The session's files are put back when it ends (pytester sessions run in this process).
    assert assertions._LAYERED[0] is None


def test_expectations_option_is_repeatable_and_a_bad_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LAYOUT_MOVED_BETWEEN_RUNNERS)
    (pytester.path / "ini.toml").write_text("schema = 1\n")
    (pytester.path / "mine.toml").write_text(MY_ENTRY.format(id="from-the-option"))
    pytester.makeini("[pytest]\nkvconform_expectations = ini.toml\n")
    result = pytester.runpytest("-s", "--kvconform-expectations", "mine.toml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "kvconform: expectations conformance/expectations.toml (shipped) + ini.toml + mine.toml",
        "*absorbed by [[]('from-the-option', 'mine.toml')[]]",
    ])
    # The same id in two layered files: one line naming both.
    (pytester.path / "ini.toml").write_text(MY_ENTRY.format(id="from-the-option"))
    result = pytester.runpytest("--kvconform-expectations", "mine.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kvconform: mine.toml: expectation 1: id 'from-the-option' is already used by expectation 1 of ini.toml*"])
    result = pytester.runpytest("--kvconform-expectations", "missing.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "expectations file" in result.stderr.str() and "missing.toml' does not exist" in result.stderr.str()
    assert "--kvconform-expectations" in pytester.runpytest("--help").stdout.str()


# --- what the installed vLLM is judged by ------------------------------------------------

JUDGED = """
from conformance.pytest_plugin import reference_observation
from suites.named_cases import get_case

def test_layout_moved(assert_conforms):
    case = get_case("flashinfer-b128-k64")
    obs = reference_observation(case)
    obs.layout = "BHLNC"          # a fact of the release, not something every vLLM must do
    assert_conforms(case, obs)

def test_one_block_more(assert_conforms):
    case = get_case("flashinfer-b128-k64")
    obs = reference_observation(case)
    obs.num_blocks += 1           # the views no longer hold num_blocks x 2 kernel blocks: the contract
    assert_conforms(case, obs)

def test_refused(assert_conforms):
    assert_conforms("flashinfer-b128-k64-lhbnc", reference_observation)
"""

UNRELEASED = "0.34.0.dev12+g1a2b3c4"


def _installed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    """The plugin reads the installed vLLM's version through conformance.judgement."""
    import conformance.judgement as judgement

    monkeypatch.setattr(judgement, "installed_vllm_version", lambda: version)


def test_an_unreleased_build_is_judged_by_the_contract_and_the_newest_facts_as_drift(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from reference.releases import TARGET_RELEASE

    _installed(monkeypatch, UNRELEASED)
    pytester.makepyfile(JUDGED)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=2)
    judged = f"vLLM {UNRELEASED} (unreleased): judged by the contract and by {TARGET_RELEASE}'s facts"
    result.stdout.fnmatch_lines([
        f"kvconform: {judged}",
        "E*case flashinfer-b128-k64 [[]mrv1[]] does not conform to the reference's facts (drift): 1 divergence",
        "E*  layout: layout: observed 'BHLNC' vs expected 'LBNHC' [[]drift[]]",
        f"E*judged: {judged}",
    ])
    result.stdout.fnmatch_lines(["E*does not conform to the contract and the reference's facts (drift): 3 divergences"])


def test_contract_only_judges_what_every_vllm_must_do(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import conformance.assertions as assertions

    _installed(monkeypatch, UNRELEASED)
    pytester.makepyfile(JUDGED)
    result = pytester.runpytest("-rs", "--kvconform-contract-only")
    # The moved layout is a release's fact: no longer judged. The missing block still fails;
    # a refusal nothing predicts is skipped with its reason, never passed.
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        f"kvconform: vLLM {UNRELEASED}: judged by the contract alone (asked for: --contract-only)",
        "E*case flashinfer-b128-k64 [[]mrv1[]] does not conform to the contract: 2 divergences",
        "SKIPPED*flashinfer-b128-k64-lhbnc [[]mrv1[]]: vLLM refuses it and, judged by the contract alone*",
    ])
    assert "test_layout_moved PASSED" in pytester.runpytest("-v", "--kvconform-contract-only").stdout.str()
    pytester.makeini("[pytest]\nkvconform_contract_only = true\n")
    pytester.runpytest().assert_outcomes(passed=1, failed=1, skipped=1)
    assert assertions._CONTRACT_ONLY[0] is False  # put back when the session ends
    assert "--kvconform-contract-only" in pytester.runpytest("--help").stdout.str()


def test_a_release_without_facts_is_judged_by_the_contract_alone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, "0.18.0")
    pytester.makepyfile(JUDGED)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["kvconform: vLLM 0.18.0 (the reference has no facts for it): judged by the contract alone"])


DRIFT_ACKNOWLEDGED = """
schema = 1

[[expectation]]
id = "our-pr-moves-the-layout"
kind = "layout"
case = "flashinfer-b128-k64"
field = "layout"
reason = "vllm-project/vllm#99999 moves FlashInfer's cache to BHLNC on purpose"
"""


def test_drift_an_expectations_file_acknowledges_does_not_fail(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, UNRELEASED)
    pytester.makepyfile(JUDGED)
    (pytester.path / "ours.toml").write_text(DRIFT_ACKNOWLEDGED)
    result = pytester.runpytest("--kvconform-expectations", "ours.toml", "-v")
    result.assert_outcomes(passed=2, failed=1)
    assert "test_layout_moved PASSED" in result.stdout.str()
    # The contract's divergences are not the layout: the acknowledgement does not cover them.
    result.stdout.fnmatch_lines(["E*does not conform to the contract and the reference's facts (drift): 3 divergences"])
