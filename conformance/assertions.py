"""Conformance assertions for tests: observe a case, compare it, fail or skip with the reason.

The library the plugin's fixtures (``conformance.pytest_plugin``) are made of, for test
modules that call it directly (``check_conforms``, ``check_runners_agree``, ``observe_case``,
``format_failure``, ``reference_observation``, ``vllm_problem``).
"""

from __future__ import annotations

import functools
import importlib.util
import shlex
from types import SimpleNamespace
from typing import Any

import pytest

# The comparator, expectations and replay line are imported where used: the plugin imports
# this module whenever pytest starts, in any project that has kvconform installed.


def installed(name: str) -> bool:
    """Importable as a real package (not a namespace package such as a tests/vllm folder)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def as_case(case: Any) -> Any:
    """A ``CaseConfig``, or the named case of that name."""
    if isinstance(case, str):
        from suites.named_cases import get_case

        return get_case(case)
    return case


def vllm_problem() -> str | None:
    """Why the installed vLLM cannot be observed here (None: it can)."""
    from reference.backends import VLLM_VERSION

    needs = f"observing vLLM needs vllm=={VLLM_VERSION} installed (pip install 'kvconform[vllm]')"
    if not installed("vllm"):
        return f"vllm is not installed; {needs}"
    from gpu_impl.vllm_cpu import shims

    shims.prepare_env()  # environment vLLM reads at import time
    try:
        import vllm
    except Exception as exc:  # a broken install fails in many ways
        return f"vllm is not importable ({type(exc).__name__}: {exc}); {needs}"
    if getattr(vllm, "__file__", None) is None:
        return f"vllm is not installed (only a namespace package); {needs}"
    # Not a version pin: whether this vLLM provides what the drivers import.
    from gpu_impl.vllm_api import api_problem

    return api_problem("layout")


def vllm_absent() -> bool:
    """True when vLLM is not installed at all (skipping is right); False when it is
    installed, drivable or not (a vLLM that cannot be driven must fail, not skip)."""
    if not installed("vllm"):
        return True
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as exc:
        return exc.name == "vllm"  # blocked or half-removed: no vLLM to drive
    except Exception:  # noqa: BLE001 - installed but broken: not absent
        return False
    return False


def observe_case(case: Any, runner: str = "mrv1") -> Any:
    """``gpu_impl.vllm_cpu.planning.observe``: skipped (with the reason) without vLLM,
    failed with the reason where vLLM is installed but cannot be driven."""
    __tracebackhide__ = True
    problem = vllm_problem()
    if problem is not None:
        if vllm_absent():
            pytest.skip(problem)
        pytest.fail(f"vLLM is installed but cannot be driven: {problem}", pytrace=False)
    from gpu_impl.vllm_cpu.planning import observe

    return observe(as_case(case), runner)


def reference_observation(case: Any, runner: str = "mrv1") -> Any:
    """The reference's own prediction shaped like an Observation (a stand-in, no vLLM).

    ``compare(case, runner, reference_observation(case, runner))`` passes by
    construction; tests change a field to see how a divergence is reported.
    """
    from conformance.derivation_summary import observed_groups
    from reference.derive import derive
    from reference.errors import StartupError

    case = as_case(case)
    try:
        d = derive(case, runner)
    except StartupError as exc:
        return SimpleNamespace(case_name=case.name, runner=runner, error=exc.vllm_message, unsupported=None)
    return SimpleNamespace(
        case_name=case.name,
        runner=runner,
        error=None,
        unsupported=None,
        layout=d.layout.name,
        groups=observed_groups(d.groups),
        num_blocks=d.num_blocks,
        bytes_per_block=d.plan.bytes_per_block,
        tensors=tuple(d.plan.tensors),
        kernel_block_sizes=tuple(d.kernel_block_sizes),
        builder_kernel_block_sizes=dict(d.builder_kernel_block_sizes),
        cache_block_size=d.cache_block_size,
        scheduler_block_size=d.scheduler_block_size,
        hash_block_size=d.hash_block_size,
        registered=dict(d.registered),
    )


def _one_line(value: Any) -> str:
    return " ".join(repr(value).split())


def format_failure(comparison: Any, *, seed: int | None = None, profile: str | None = None, nodeid: str | None = None,
                   divergences: Any = None, judged_by: str | None = None) -> str:
    """The AssertionError text: a headline, one line per divergence, then how to replay.

    ``divergences``: the ones that fail (default: all of the comparison's); ``judged_by``:
    the judgement's one-line description (``Judgement.describe``)."""
    case, runner = comparison.case, comparison.runner
    failing = tuple(comparison.divergences if divergences is None else divergences)
    n = len(failing)
    held = sum(1 for d in failing if getattr(d, "basis", "facts") == "contract")
    drift = sum(1 for d in failing if getattr(d, "basis", "facts") == "drift")
    against = ["the contract"] if held else []
    if n - held:
        against.append("the reference's facts" + (" (drift)" if drift else ""))
    lines = [f"case {case.name} [{runner}] does not conform to {' and '.join(against) or 'the reference'}: "
             f"{n} divergence{'s' if n != 1 else ''}"]
    for d in failing:
        lines.append(f"  {d.kind}: {d.field}: observed {_one_line(d.observed)} vs expected {_one_line(d.expected)}"
                     + ("" if getattr(d, "basis", "facts") == "facts" else f" [{d.basis}]"))
    if judged_by:
        lines.append(f"judged: {judged_by}")
    if seed is not None:
        lines.append(f"seed: {seed}" + (f" (profile {profile})" if profile else ""))
    lines.append(f"config: {case.to_json()}")
    lines.append(f"replay: python -m gpu_impl.vllm_cpu.planning {shlex.quote(case.to_json())} {runner}")
    if nodeid and seed is not None:
        lines.append(f"rerun: pytest {shlex.quote(nodeid)} --kvconform-seed {seed}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def _vllm_version() -> str | None:
    """The installed vLLM's version, read once (expectations are scoped by it); None: not installed."""
    from conformance.judgement import installed_vllm_version

    return installed_vllm_version()


_CONTRACT_ONLY: list[bool] = [False]
"""Set by ``use_contract_only`` (the plugin's ``--kvconform-contract-only`` / ini
``kvconform_contract_only``): judge by the contract alone whatever the release."""


def use_contract_only(value: bool) -> bool:
    """Judge by the contract alone (True) or by what the installed release allows; returns the
    setting before (for restoring when a session ends: pytester sessions run in-process)."""
    previous = _CONTRACT_ONLY[0]
    _CONTRACT_ONLY[0] = bool(value)
    _judgement_for.cache_clear()  # each session reads the installed version afresh
    return previous


@functools.lru_cache(maxsize=2)
def _judgement_for(contract_only: bool) -> Any:
    from conformance.judgement import installed_judgement
    from reference.errors import ConfigError

    try:
        return installed_judgement(contract_only=contract_only)
    except ConfigError as exc:
        raise pytest.UsageError(f"the installed vLLM's version cannot be read as a release: {exc}") from None


def _judgement() -> Any:
    """What the installed vLLM is judged by (``conformance.judgement``); None: no vLLM
    installed (a stand-in observation is judged by the case's own release's facts)."""
    return _judgement_for(_CONTRACT_ONLY[0])


def judgement_line() -> str | None:
    """The judgement's one line for the plugin's header (None: no vLLM installed)."""
    judgement = _judgement()
    return None if judgement is None else judgement.describe()


def check_conforms(
    case: Any,
    observation_or_runner: Any = "mrv1",
    *,
    runner: str | None = None,
    seed: int | None = None,
    profile: str | None = None,
    nodeid: str | None = None,
) -> Any:
    """``assert_conforms`` without a pytest request (see the fixture).

    Judged as ``kvconform run`` judges (``conformance.judgement``): by the installed release's
    facts, by the newest facts as drift on an unreleased or newer build, or by the contract
    alone; divergences an expectations file in force acknowledges (the shipped file and the
    layered ones, ``use_expectations``) do not fail. A refusal under the contract alone skips."""
    __tracebackhide__ = True  # a failure shows the caller's line and the diff, not this helper
    from conformance.diff import compare
    from conformance.expectations import Environment, case_facts, classify
    from conformance.judgement import basis_of, judged_case

    judgement = _judgement()
    case = judged_case(as_case(case), judgement)
    if isinstance(observation_or_runner, str):
        runner = observation_or_runner
        observation = observe_case(case, runner)
    elif callable(observation_or_runner) and not hasattr(observation_or_runner, "runner"):
        runner = runner or "mrv1"
        observation = observation_or_runner(case, runner)
    else:
        observation = observation_or_runner
        runner = runner or getattr(observation, "runner", None) or "mrv1"
    result = compare(case, runner, observation, basis=basis_of(judgement))
    if result.status == "not_modeled":
        pytest.skip(f"{case.name} [{runner}]: not modeled by the reference: {result.detail}")
    if result.status == "unsupported":
        pytest.skip(f"{case.name} [{runner}]: unsupported by this vLLM driver: {result.detail}")
    if result.status == "refused":
        pytest.skip(f"{case.name} [{runner}]: vLLM refuses it and, judged by the contract alone, "
                    f"nothing predicts whether it should: {result.detail}")
    if result.status != "pass":
        env = Environment(_vllm_version(), {case.name: case_facts(case, (observation,))},
                          None if judgement is None else judgement.facts_release)
        entries, _ = layered_expectations()
        verdict = classify(result.divergences, env, entries)
        if verdict.unexpected or not result.divergences:
            raise AssertionError(format_failure(result, seed=seed, profile=profile, nodeid=nodeid,
                                                divergences=verdict.unexpected or None,
                                                judged_by=None if judgement is None else judgement.describe()))
    return result


_LAYERED: list[Any] = [None]
"""``(entries, label)`` set by ``use_expectations`` (the plugin's ``kvconform_expectations`` /
``--kvconform-expectations``); None: the shipped file alone, read when first needed."""


def use_expectations(paths: Any = (), *, shipped: bool = True, labels: Any = None) -> Any:
    """Classify with the shipped file and then ``paths``' entries (``load_layered``) from now on;
    returns what was in force before (for ``restore_expectations``). Raises
    ``ExpectationsError`` (one line) for a bad or missing file or an id used twice."""
    from conformance.expectations import describe_layers, load_layered

    previous = _LAYERED[0]
    entries = load_layered(paths, shipped=shipped, labels=labels)
    _LAYERED[0] = (entries, describe_layers(paths, shipped=shipped, labels=labels) or "no expectations file")
    return previous


def expectations_files(config: Any) -> tuple[list[Any], list[str]]:
    """A pytest config's expectations files in layering order, and their names for messages:
    the ini option ``kvconform_expectations`` (relative to the ini file; named relative to
    the rootdir), then each ``--kvconform-expectations`` (relative to where pytest started;
    named as given)."""
    import os
    from pathlib import Path

    ini = [Path(p) for p in config.getini("kvconform_expectations")]
    given = [str(p) for p in (config.getoption("kvconform_expectations", None) or [])]
    root = Path(config.rootpath)
    labels = [os.path.relpath(p, root) if p.is_relative_to(root) else str(p) for p in ini]
    labels += [str(Path(p)) for p in given]
    return ini + [Path(config.invocation_params.dir) / p for p in given], labels


def restore_expectations(previous: Any) -> None:
    """Undo ``use_expectations`` (the plugin, when its session ends: pytester sessions run in-process)."""
    _LAYERED[0] = previous


def layered_expectations() -> tuple[Any, str]:
    """The entries ``check_runners_agree`` classifies with, and the files they came from (one string)."""
    if _LAYERED[0] is not None:
        return _LAYERED[0]
    from conformance.expectations import SHIPPED_SOURCE, load

    return load(), SHIPPED_SOURCE


def check_runners_agree(
    case: Any, mrv1: Any, mrv2: Any, *, seed: int | None = None, profile: str | None = None
) -> tuple[Any, ...]:
    """MRv1 and MRv2 observations of ``case`` build the same layout, except for divergences
    ``conformance/expectations.toml`` declares, or a file layered on it (``use_expectations``:
    the plugin's ``kvconform_expectations`` ini option and ``--kvconform-expectations``);
    AssertionError (with the config and a replay command) otherwise. Returns the expected
    mismatches."""
    __tracebackhide__ = True
    from conformance.diff import compare_runners
    from conformance.expectations import RUN_KINDS, Environment, case_facts, classify

    mismatches = compare_runners(case, mrv1, mrv2)
    if not mismatches:
        return ()
    judgement = _judgement()
    env = Environment(_vllm_version(), {case.name: case_facts(case, (mrv1, mrv2))},
                      None if judgement is None else judgement.facts_release)
    entries, files = layered_expectations()
    verdict = classify(mismatches, env, entries, kinds=RUN_KINDS)
    if verdict.unexpected:
        lines = [f"case {case.name}: MRv1 and MRv2 differ beyond {files}"]
        lines += [f"  {d.message}" for d in verdict.unexpected]
        if seed is not None:
            lines.append(f"seed: {seed}" + (f" (profile {profile}; rerun with --kvconform-seed {seed})" if profile else ""))
        lines.append(f"config: {case.to_json()}")
        from conformance.replay import replay_command

        lines.append(f"replay: {replay_command(case)}")
        raise AssertionError("\n".join(lines))
    return verdict.expected


__all__ = [
    "as_case",
    "check_conforms",
    "check_runners_agree",
    "expectations_files",
    "format_failure",
    "installed",
    "judgement_line",
    "layered_expectations",
    "observe_case",
    "reference_observation",
    "restore_expectations",
    "use_contract_only",
    "use_expectations",
    "vllm_absent",
    "vllm_problem",
]
