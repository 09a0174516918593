"""kvconform's pytest plugin (``pytest11`` entry point): options, sampling, fixtures, coverage.

Options (also in ``pytest --help``, group "kvconform"):

- ``--kvconform-seed N|random``: the seed of every sampled case list (default: the project
  seed ``PROJECT_SEED``, or ``KVCONFORM_SEED``; ``random`` picks one and prints it). It is
  resolved once, on the xdist controller, and handed to the workers, so test ids are
  identical on every worker. An explicit seed also seeds hypothesis (otherwise hypothesis
  is derandomized per test, as before).
- ``--kvconform-examples N``: how many cases a sampled test draws and hypothesis's
  ``max_examples`` (default per profile: ci 1000 sampled / 60 hypothesis; thorough 3000 /
  1000).
- ``--kvconform-profile ci|thorough|gpu`` (default ``ci``, or ``KVCONFORM_PROFILE``): also
  loads the hypothesis profile ``kvconform-<profile>`` explicitly, so ``CI=true`` (which
  makes hypothesis load its own ``ci`` profile) changes nothing. ``gpu`` keeps only
  ``gpu``-marked tests (skipped, with a reason, where there is no GPU).
- ``--kvconform-coverage-json FILE``: also write the coverage view as JSON.

Fixtures:

- ``kv_reference``: ``(case_or_name, runner="mrv1") -> Derivation``.
- ``kv_case``: one sampled ``CaseConfig``; a test that requests it is parametrized over
  ``sampled_cases(config)`` (ids are the case names, which carry the seed).
- ``kvconform_sample``: ``(count=None, **limits) -> list[CaseConfig]``, the same sample.
- ``kv_observed``: ``(case_or_name, runner="mrv1") -> Observation`` through the installed
  vLLM (``gpu_impl.vllm_cpu.planning.observe``); skips with a reason without vLLM 0.33.0.
- ``assert_conforms``: ``(case, observation_or_runner="mrv1", *, runner=None)``: compares
  the reference with an observation (or observes with the runner named, or calls
  ``observation_or_runner(case, runner)``); raises AssertionError with one line per
  divergence and the replay command; skips where vLLM cannot run it or the reference does
  not model it; returns the ``Comparison``.
- ``kv_connector_check``: ``conformance.connectors.validate_registration``
  ``(connector, cases=None, runners=("mrv1", "mrv2")) -> ConnectorReport``; skips with a
  reason without torch (it builds real CPU tensors).

Markers: ``gpu`` (skipped without nvidia-smi), ``vllm`` (skipped without vLLM),
``kvconform_sample(count=None, **limits)`` (per-test sample size for ``kv_case``).

Every case a test ran through ``kv_case`` / ``kv_observed`` / ``assert_conforms`` is
counted in ``conformance.coverage`` and summarized at the end of the run (merged from
xdist workers).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import secrets
import shlex
import shutil
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from conformance.coverage import Coverage
from suites.profiles import PROFILES, PROJECT_SEED

HYPOTHESIS_PROFILES = tuple(f"kvconform-{name}" for name in PROFILES)

_WORKER_KEY = "kvconform"


@dataclass(frozen=True)
class Settings:
    """What this run samples: resolved once (on the controller) and shared with workers."""

    seed: int
    seed_source: str
    """``project default``, ``KVCONFORM_SEED``, ``--kvconform-seed`` or ``random``."""
    profile: str
    sample_count: int
    hypothesis_examples: int
    examples_given: bool
    hypothesis_profile: str | None = None
    """The hypothesis profile loaded (None: hypothesis missing, or --hypothesis-profile)."""

    @property
    def seed_explicit(self) -> bool:
        return self.seed_source != "project default"

    def to_data(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seed_source": self.seed_source,
            "profile": self.profile,
            "sample_count": self.sample_count,
            "hypothesis_examples": self.hypothesis_examples,
            "examples_given": self.examples_given,
        }


_SETTINGS = pytest.StashKey[Settings]()
_COVERAGE = pytest.StashKey[Coverage]()
_RESTORE = pytest.StashKey[tuple[str | None, Any]]()
_CASE = pytest.StashKey[list]()


# --- options and settings ----------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("kvconform_hypothesis", type="bool", default=False,
                  help="load kvconform's hypothesis profile for the whole session (kvconform's own suite)")
    group = parser.getgroup("kvconform", "kvconform conformance harness")
    group.addoption(
        "--kvconform-seed",
        default=None,
        metavar="N|random",
        help=f"seed of the sampled cases (default {PROJECT_SEED}, or $KVCONFORM_SEED); 'random' picks one and prints it",
    )
    group.addoption(
        "--kvconform-examples",
        type=int,
        default=None,
        metavar="N",
        help="cases per sampled test and hypothesis max_examples (default: per profile)",
    )
    group.addoption(
        "--kvconform-profile",
        choices=sorted(PROFILES),
        default=None,
        help="ci (default, or $KVCONFORM_PROFILE): fast; thorough: many more examples; gpu: only gpu-marked tests",
    )
    group.addoption(
        "--kvconform-coverage-json",
        default=None,
        metavar="FILE",
        help="write the backend x layout x kind x dtype coverage of this run as JSON",
    )


def _resolve(config: pytest.Config) -> Settings:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _WORKER_KEY in workerinput:
        # An xdist worker: never resolve on its own (a 'random' seed would differ).
        data = dict(workerinput[_WORKER_KEY])
        return Settings(**data)
    profile = config.getoption("kvconform_profile") or os.environ.get("KVCONFORM_PROFILE") or "ci"
    if profile not in PROFILES:
        raise pytest.UsageError(f"KVCONFORM_PROFILE={profile!r} is not one of {', '.join(sorted(PROFILES))}")
    raw = config.getoption("kvconform_seed")
    source = "--kvconform-seed"
    if raw is None and os.environ.get("KVCONFORM_SEED"):
        raw, source = os.environ["KVCONFORM_SEED"], "KVCONFORM_SEED"
    if raw is None:
        seed, source = PROJECT_SEED, "project default"
    elif str(raw).strip().lower() == "random":
        seed, source = secrets.randbelow(2**32), "random"
    else:
        try:
            seed = int(str(raw).strip(), 0)
        except ValueError:
            raise pytest.UsageError(f"{source} {raw!r}: expected an integer or 'random'") from None
        if seed < 0:
            raise pytest.UsageError(f"{source} {raw!r}: the seed must be >= 0")
    examples = config.getoption("kvconform_examples")
    if examples is not None and examples < 1:
        raise pytest.UsageError(f"--kvconform-examples {examples}: must be >= 1")
    defaults = PROFILES[profile]
    return Settings(
        seed=seed,
        seed_source=source,
        profile=profile,
        sample_count=examples if examples is not None else defaults["sample"],
        hypothesis_examples=examples if examples is not None else defaults["hypothesis"],
        examples_given=examples is not None,
    )


def _hypothesis_asked(config: pytest.Config) -> bool:
    """kvconform's hypothesis profile is loaded only when asked: the ini flag
    ``kvconform_hypothesis = true`` (kvconform's own suite sets it), a ``--kvconform-*``
    option, or ``KVCONFORM_PROFILE``/``KVCONFORM_SEED`` in the environment."""
    if config.getini("kvconform_hypothesis"):
        return True
    options = ("--kvconform-profile", "--kvconform-seed", "--kvconform-examples")
    if any(config.getoption(o, None) is not None for o in options):
        return True
    return bool(os.environ.get("KVCONFORM_PROFILE") or os.environ.get("KVCONFORM_SEED"))


def _load_hypothesis_profile(config: pytest.Config, s: Settings) -> str | None:
    """Register kvconform-{ci,thorough,gpu} and load ours explicitly (CI=true changes nothing)."""
    try:
        from hypothesis import HealthCheck, core, settings
    except ImportError:
        return None
    base = settings(
        max_examples=PROFILES["ci"]["hypothesis"],
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    for name, values in PROFILES.items():
        settings.register_profile(f"kvconform-{name}", parent=base, max_examples=values["hypothesis"])
    try:
        previous = settings.get_current_profile_name()
    except AssertionError:
        previous = None
    config.stash[_RESTORE] = (previous, core.global_force_seed)
    if config.getoption("--hypothesis-profile", None):
        return None  # the user chose a hypothesis profile explicitly: theirs wins
    if not _hypothesis_asked(config):
        return None  # another project's hypothesis settings stay its own
    name = f"kvconform-{s.profile}"
    extra: dict[str, Any] = {}
    if s.examples_given:
        extra["max_examples"] = s.hypothesis_examples
    if s.seed_explicit and config.getoption("--hypothesis-seed", None) is None:
        # An explicit seed drives hypothesis too (derandomize would override it).
        extra["derandomize"] = False
        core.global_force_seed = s.seed
        name += f"-seed{s.seed}"
    if extra:
        if s.examples_given:
            name += f"-n{s.hypothesis_examples}"
        settings.register_profile(name, parent=settings.get_profile(f"kvconform-{s.profile}"), **extra)
    settings.load_profile(name)
    return name


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvconform_gpu: needs a CUDA GPU; skipped with a reason on CPU")
    config.addinivalue_line("markers", "kvconform_vllm: needs the vllm package importable; skipped with a reason otherwise")
    config.addinivalue_line(
        "markers", "kvconform_sample(count=None, **limits): cases for this test's kv_case (default --kvconform-examples)"
    )
    s = _resolve(config)
    hyp = _load_hypothesis_profile(config, s)
    config.stash[_SETTINGS] = Settings(**s.to_data(), hypothesis_profile=hyp)
    config.stash[_COVERAGE] = Coverage()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Leave hypothesis as found (matters for in-process runs, e.g. pytester).
    restore = config.stash.get(_RESTORE, None)
    if restore is None:
        return
    previous, force_seed = restore
    try:
        from hypothesis import core, settings
    except ImportError:
        return
    core.global_force_seed = force_seed
    if previous is not None:
        settings.load_profile(previous)


def run_settings(config: pytest.Config) -> Settings:
    """This run's seed, profile and example counts."""
    return config.stash[_SETTINGS]


def run_coverage(config: pytest.Config) -> Coverage:
    """This process's coverage counts (the controller's include the workers' at the end)."""
    return config.stash[_COVERAGE]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand the resolved settings to each worker."""
    node.workerinput[_WORKER_KEY] = run_settings(node.config).to_data()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: merge a worker's coverage."""
    data = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if data:
        run_coverage(node.config).merge(data)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):
        config.workeroutput[_WORKER_KEY] = run_coverage(config).to_data()


# --- header and summary ------------------------------------------------------------------


def _installed(name: str) -> bool:
    """Importable as a real package (not a namespace package such as a tests/vllm folder)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def _version(dist: str) -> str:
    """Installed version without importing the package (never imports vllm/torch)."""
    import importlib.metadata

    if not _installed(dist):
        return f"{dist} not installed"
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} (importable, version unknown)"


def _seed_text(s: Settings) -> str:
    return f"seed {s.seed} ({s.seed_source})"


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = run_settings(config)
    hyp = s.hypothesis_profile or "hypothesis: not loaded by kvconform"
    return [
        f"kvconform: {_seed_text(s)}, profile {s.profile}, examples {s.sample_count} sampled / "
        f"{s.hypothesis_examples} hypothesis ({hyp}); rerun: --kvconform-seed {s.seed}",
        f"kvconform: {_version('vllm')}, {_version('torch')}, gpu {'yes (nvidia-smi)' if _has_gpu() else 'none'}",
    ]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    s = run_settings(config)
    cov = run_coverage(config)
    path = config.getoption("kvconform_coverage_json")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(cov.to_json(**s.to_data()) + "\n")
    if not cov and not s.seed_explicit:
        return
    terminalreporter.section("kvconform", sep="-")
    if cov:
        for line in cov.table():
            terminalreporter.write_line(line)
    terminalreporter.write_line(f"kvconform: {_seed_text(s)}, profile {s.profile}; rerun with --kvconform-seed {s.seed}")
    if path:
        terminalreporter.write_line(f"kvconform: coverage written to {path}")


# --- markers -----------------------------------------------------------------------------


def _has_gpu() -> bool:
    # Avoid importing torch.cuda at collection time: a driver tool on PATH is the cheap
    # signal; tests that pass this gate still check torch.cuda.is_available() themselves.
    return shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if run_settings(config).profile == "gpu":
        keep = [item for item in items if item.get_closest_marker("kvconform_gpu")]
        dropped = [item for item in items if not item.get_closest_marker("kvconform_gpu")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found: no nvidia-smi); run scripts/gpu_check.sh on a GPU machine")
    no_vllm = pytest.mark.skip(reason="needs vllm importable (pip install 'kvconform[vllm]')")
    has_gpu = _has_gpu()
    has_vllm = _installed("vllm")
    for item in items:
        # Only kvconform's own (namespaced) markers: another project's `gpu` or `vllm`
        # marker means what that project says.
        if not has_gpu and item.get_closest_marker("kvconform_gpu"):
            item.add_marker(no_gpu)
        if not has_vllm and item.get_closest_marker("kvconform_vllm"):
            item.add_marker(no_vllm)


# --- sampling ----------------------------------------------------------------------------


def sampled_cases(config: pytest.Config, count: int | None = None, **limits: int) -> list:
    """The run's sample: ``count`` (default ``--kvconform-examples``) cases from the seed.

    Deterministic from the seed alone, so every xdist worker collects the same ids.
    """
    from suites.strategies import sample_cases

    s = run_settings(config)
    return sample_cases(s.seed, s.sample_count if count is None else count, **limits)


def _user_parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kv_case" not in metafunc.fixturenames or _user_parametrized(metafunc, "kv_case"):
        return
    mark = metafunc.definition.get_closest_marker("kvconform_sample")
    count = None
    limits: dict[str, int] = {}
    if mark is not None:
        limits = dict(mark.kwargs)
        count = limits.pop("count", mark.args[0] if mark.args else None)
    cases = sampled_cases(metafunc.config, count, **limits)
    metafunc.parametrize("kv_case", cases, ids=[c.name for c in cases], indirect=True)


def _record(request: pytest.FixtureRequest, case: Any) -> None:
    """Remember a case this test uses: counted in the coverage if the test runs (not skips)."""
    cases = request.node.stash.setdefault(_CASE, [])
    if all(c is not case for c in cases):
        cases.append(case)


@pytest.fixture
def kv_case(request: pytest.FixtureRequest) -> Any:
    """One sampled case (the test is parametrized over ``sampled_cases``)."""
    case = getattr(request, "param", None)
    if case is None:
        pytest.fail("kv_case is parametrized by the kvconform plugin; it has no value here", pytrace=False)
    _record(request, case)
    return case


@pytest.fixture
def kvconform_sample(pytestconfig: pytest.Config) -> Callable[..., list]:
    """``(count=None, **limits) -> list[CaseConfig]``: the run's seeded sample."""

    def _sample(count: int | None = None, **limits: int) -> list:
        return sampled_cases(pytestconfig, count, **limits)

    return _sample


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any):
    outcome = yield
    report = outcome.get_result()
    cases = item.stash.get(_CASE, None)
    if cases and report.when == "call" and not report.skipped:
        cov = run_coverage(item.config)
        for case in cases:
            cov.record(case, item.nodeid)
    if report.failed and cases and "rerun: pytest" not in str(report.longrepr):
        s = run_settings(item.config)
        lines = [f"seed: {s.seed} (profile {s.profile})"]
        for case in cases[:3]:
            lines.append(f"config: {case.to_json()}")
        lines.append(f"rerun: pytest {shlex.quote(item.nodeid)} --kvconform-seed {s.seed}")
        report.sections.append(("kvconform replay", "\n".join(lines)))


# --- reference, observation and conformance fixtures --------------------------------------


def _as_case(case: Any) -> Any:
    if isinstance(case, str):
        from suites.named_cases import get_case

        return get_case(case)
    return case


@pytest.fixture
def kv_reference() -> Callable[..., Any]:
    """Derive the reference layout of a named case or a ``CaseConfig``."""
    from reference.derive import derive

    def _derive(case: Any, runner: str = "mrv1"):
        return derive(_as_case(case), runner)

    return _derive


def vllm_problem() -> str | None:
    """Why the installed vLLM cannot be observed here (None: it can)."""
    from reference.backends import VLLM_VERSION

    needs = f"observing vLLM needs vllm=={VLLM_VERSION} installed (pip install 'kvconform[vllm]')"
    if not _installed("vllm"):
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
    if not _installed("vllm"):
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

    return observe(_as_case(case), runner)


@pytest.fixture
def kv_observed(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``(case_or_name, runner="mrv1") -> Observation`` of the installed vLLM."""

    def _observe(case: Any, runner: str = "mrv1") -> Any:
        case = _as_case(case)
        _record(request, case)
        return observe_case(case, runner)

    return _observe


def reference_observation(case: Any, runner: str = "mrv1") -> Any:
    """The reference's own prediction shaped like an Observation (a stand-in, no vLLM).

    ``compare(case, runner, reference_observation(case, runner))`` passes by
    construction; tests change a field to see how a divergence is reported.
    """
    from reference.derive import derive
    from reference.errors import StartupError

    case = _as_case(case)
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

    case = _as_case(case)
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


@pytest.fixture
def assert_conforms(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``(case, observation_or_runner="mrv1", *, runner=None) -> Comparison``; AssertionError on divergence."""
    s = run_settings(request.config)

    def _assert(case: Any, observation_or_runner: Any = "mrv1", *, runner: str | None = None) -> Any:
        __tracebackhide__ = True
        case = _as_case(case)
        _record(request, case)
        return check_conforms(
            case, observation_or_runner, runner=runner, seed=s.seed, profile=s.profile, nodeid=request.node.nodeid
        )

    return _assert


@pytest.fixture
def kv_connector_check() -> Callable[..., Any]:
    """``validate_registration`` for a KV-connector adapter (see docs/connector-authors.md)."""
    if not _installed("torch"):
        pytest.skip("kv_connector_check builds real CPU tensors: needs torch (CPU is enough)")
    from conformance.connectors import validate_registration

    return validate_registration
