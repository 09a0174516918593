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
        groups=tuple(SimpleNamespace(layer_names=tuple(g.layer_names), block_size=g.spec.block_size) for g in d.groups),
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


def format_failure(comparison: Any, *, seed: int | None = None, profile: str | None = None, nodeid: str | None = None) -> str:
    """The AssertionError text: a headline, one line per divergence, then how to replay."""
    case, runner = comparison.case, comparison.runner
    n = len(comparison.divergences)
    lines = [f"case {case.name} [{runner}] does not conform to the reference: {n} divergence{'s' if n != 1 else ''}"]
    for d in comparison.divergences:
        lines.append(f"  {d.kind}: {d.field}: observed {_one_line(d.observed)} vs expected {_one_line(d.expected)}")
    if seed is not None:
        lines.append(f"seed: {seed}" + (f" (profile {profile})" if profile else ""))
    lines.append(f"config: {case.to_json()}")
    lines.append(f"replay: python -m gpu_impl.vllm_cpu.planning {shlex.quote(case.to_json())} {runner}")
    if nodeid and seed is not None:
        lines.append(f"rerun: pytest {shlex.quote(nodeid)} --kvconform-seed {seed}")
    return "\n".join(lines)


def check_conforms(
    case: Any,
    observation_or_runner: Any = "mrv1",
    *,
    runner: str | None = None,
    seed: int | None = None,
    profile: str | None = None,
    nodeid: str | None = None,
) -> Any:
    """``assert_conforms`` without a pytest request (see the fixture)."""
    __tracebackhide__ = True  # a failure shows the caller's line and the diff, not this helper
    from conformance.diff import compare

    case = as_case(case)
    if isinstance(observation_or_runner, str):
        runner = observation_or_runner
        observation = observe_case(case, runner)
    elif callable(observation_or_runner) and not hasattr(observation_or_runner, "runner"):
        runner = runner or "mrv1"
        observation = observation_or_runner(case, runner)
    else:
        observation = observation_or_runner
        runner = runner or getattr(observation, "runner", None) or "mrv1"
    result = compare(case, runner, observation)
    if result.status == "not_modeled":
        pytest.skip(f"{case.name} [{runner}]: not modeled by the reference: {result.detail}")
    if result.status == "unsupported":
        pytest.skip(f"{case.name} [{runner}]: unsupported by this vLLM driver: {result.detail}")
    if result.status != "pass":
        raise AssertionError(format_failure(result, seed=seed, profile=profile, nodeid=nodeid))
    return result


@functools.lru_cache(maxsize=1)
def _vllm_version() -> str:
    """The installed vLLM's version, read once (expectations are scoped by it)."""
    import importlib.metadata

    return importlib.metadata.version("vllm")


def check_runners_agree(
    case: Any, mrv1: Any, mrv2: Any, *, seed: int | None = None, profile: str | None = None
) -> tuple[Any, ...]:
    """MRv1 and MRv2 observations of ``case`` build the same layout, except for divergences
    ``conformance/expectations.toml`` declares; AssertionError (with the config and a replay
    command) otherwise. Returns the expected mismatches."""
    __tracebackhide__ = True
    from conformance.diff import compare_runners
    from conformance.expectations import RUN_KINDS, Environment, case_facts, classify

    mismatches = compare_runners(case, mrv1, mrv2)
    if not mismatches:
        return ()
    env = Environment(_vllm_version(), {case.name: case_facts(case, (mrv1, mrv2))})
    verdict = classify(mismatches, env, kinds=RUN_KINDS)
    if verdict.unexpected:
        lines = [f"case {case.name}: MRv1 and MRv2 differ beyond conformance/expectations.toml"]
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
    "format_failure",
    "installed",
    "observe_case",
    "reference_observation",
    "vllm_absent",
    "vllm_problem",
]
