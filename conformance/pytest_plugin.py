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
- ``--kvconform-expectations FILE`` (repeatable) and the ini option
  ``kvconform_expectations`` (paths, one a line, relative to the ini file): expectations
  files layered on the shipped one (ini files first, then the options), used wherever the
  plugin classifies divergences (``assert_conforms``, ``check_runners_agree``); see
  docs/expectations.md.
- ``--kvconform-contract-only`` and the ini option ``kvconform_contract_only``: judge by the
  contract alone whatever the installed release (``kvconform run --contract-only``). Without
  it the installed vLLM is judged as ``kvconform run`` judges it (its release's facts; the
  newest facts as drift on an unreleased or newer build; the contract alone where the
  reference has no facts); the header says which.

Fixtures:

- ``kv_reference``: ``(case_or_name, runner="mrv1") -> Derivation``.
- ``kv_case``: one sampled ``CaseConfig``; a test that requests it is parametrized over
  ``sampled_cases(config)`` (ids are the case names, which carry the seed).
- ``kvconform_sample``: ``(count=None, **limits) -> list[CaseConfig]``, the same sample.
- ``kv_observed``: ``(case_or_name, runner="mrv1") -> Observation`` through the installed
  vLLM (``gpu_impl.vllm_cpu.planning.observe``); skips with a reason without vLLM.
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
xdist workers). The fixtures' library, for test modules that call it directly, is
``conformance.assertions`` (re-exported here).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from conformance.assertions import (  # re-exported: test modules import them from the plugin
    as_case,
    check_conforms,
    check_runners_agree,
    format_failure,
    expectations_files,
    installed,
    layered_expectations,
    observe_case,
    reference_observation,
    judgement_line,
    restore_expectations,
    use_contract_only,
    use_expectations,
    vllm_absent,
    vllm_problem,
)
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
_EXPECTATIONS = pytest.StashKey[Any]()
"""What ``use_expectations`` replaced, put back when the session ends."""
_CONTRACT_ONLY = pytest.StashKey[bool]()
"""What ``use_contract_only`` replaced, put back when the session ends."""


# --- options and settings ----------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("kvconform_hypothesis", type="bool", default=False,
                  help="load kvconform's hypothesis profile for the whole session (kvconform's own suite)")
    parser.addini("kvconform_expectations", type="paths", default=[],
                  help="your own expectations files (one a line, relative to the ini file), layered after "
                  "the shipped conformance/expectations.toml (docs/expectations.md)")
    parser.addini("kvconform_contract_only", type="bool", default=False,
                  help="judge the installed vLLM by the contract alone, whatever its release")
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
        "--kvconform-expectations",
        action="append",
        default=[],
        metavar="FILE",
        help="an expectations file layered after the shipped one and the kvconform_expectations ini files (repeatable)",
    )
    group.addoption(
        "--kvconform-contract-only",
        action="store_true",
        default=False,
        help="judge the installed vLLM by the contract alone, whatever its release (kvconform run --contract-only)",
    )
    group.addoption(
        "--kvconform-shard",
        default=None,
        metavar="K/N|auto",
        help="run only the K-th of N parts of the collected tests (disjoint, their union every test, balanced by "
        "each sampled case's expected cost; 'auto': Buildkite's BUILDKITE_PARALLEL_JOB of BUILDKITE_PARALLEL_JOB_COUNT)",
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
    _use_expectations(config)
    contract_only = config.getoption("kvconform_contract_only", False) or config.getini("kvconform_contract_only")
    config.stash[_CONTRACT_ONLY] = use_contract_only(contract_only)


def _use_expectations(config: pytest.Config) -> None:
    """The ini's kvconform_expectations files, then each --kvconform-expectations, on the shipped file."""
    paths, labels = expectations_files(config)
    if not paths:
        return  # the shipped file alone, read only when a test classifies
    from conformance.expectations import ExpectationsError

    try:
        config.stash[_EXPECTATIONS] = use_expectations(paths, labels=labels)
    except ExpectationsError as exc:
        raise pytest.UsageError(f"kvconform: {exc}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    if _EXPECTATIONS in config.stash:
        restore_expectations(config.stash[_EXPECTATIONS])
    if _CONTRACT_ONLY in config.stash:
        use_contract_only(config.stash[_CONTRACT_ONLY])
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


def _version(dist: str) -> str:
    """Installed version without importing the package (never imports vllm/torch)."""
    import importlib.metadata

    if not installed(dist):
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
    ] + ([f"kvconform: expectations {layered_expectations()[1]}"] if _EXPECTATIONS in config.stash else []) + (
        [f"kvconform: {judged}"] if (judged := judgement_line()) else [])


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
    shard_text = config.getoption("kvconform_shard", None)
    if shard_text:
        from conformance.shards import ShardError, item_cost, parse_shard, take

        try:
            shard = parse_shard(shard_text)
        except ShardError as exc:
            raise pytest.UsageError(f"--kvconform-shard: {exc}") from None
        keep, _ = take(list(items), shard, item_cost)
        kept = set(map(id, keep))
        dropped = [item for item in items if id(item) not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    if run_settings(config).profile == "gpu":
        keep = [item for item in items if item.get_closest_marker("kvconform_gpu")]
        dropped = [item for item in items if not item.get_closest_marker("kvconform_gpu")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found: no nvidia-smi); run scripts/gpu_check.sh on a GPU machine")
    no_vllm = pytest.mark.skip(reason="needs vllm importable (pip install 'kvconform[vllm]')")
    has_gpu = _has_gpu()
    has_vllm = installed("vllm")
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


@pytest.fixture
def kv_reference() -> Callable[..., Any]:
    """Derive the reference layout of a named case or a ``CaseConfig``."""
    from reference.derive import derive

    def _derive(case: Any, runner: str = "mrv1"):
        return derive(as_case(case), runner)

    return _derive


@pytest.fixture
def kv_observed(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``(case_or_name, runner="mrv1") -> Observation`` of the installed vLLM."""

    def _observe(case: Any, runner: str = "mrv1") -> Any:
        case = as_case(case)
        _record(request, case)
        return observe_case(case, runner)

    return _observe


@pytest.fixture
def assert_conforms(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``(case, observation_or_runner="mrv1", *, runner=None) -> Comparison``; AssertionError on divergence."""
    s = run_settings(request.config)

    def _assert(case: Any, observation_or_runner: Any = "mrv1", *, runner: str | None = None) -> Any:
        __tracebackhide__ = True
        case = as_case(case)
        _record(request, case)
        return check_conforms(
            case, observation_or_runner, runner=runner, seed=s.seed, profile=s.profile, nodeid=request.node.nodeid
        )

    return _assert


@pytest.fixture
def kv_connector_check() -> Callable[..., Any]:
    """``validate_registration`` for a KV-connector adapter (see docs/connector-authors.md)."""
    if not installed("torch"):
        pytest.skip("kv_connector_check builds real CPU tensors: needs torch (CPU is enough)")
    from conformance.connectors import validate_registration

    return validate_registration
