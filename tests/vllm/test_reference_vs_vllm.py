"""The reference model's facts, proved against vLLM 0.33.0's own code on CPU.

For every case in ``vllm_cases.CASES`` the reference (``reference.derive``) and vLLM
(``gpu_impl.vllm_cpu.planning.observe``) must agree field by field, judged by the one
comparator ``conformance.diff.compare`` (layout, groups, num_blocks, bytes per block,
every KVCacheTensor, kernel block sizes, builders, registered and bound tensors). When
the reference predicts a startup failure, vLLM must fail too, for the same reason. A second test diffs the reference backend table
against the real backend classes.

Every failure prints the case as JSON and a one-line replay command.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from gpu_impl.vllm_cpu import shims
from gpu_impl.vllm_cpu.backends import declared, size_repr
from conformance.replay import replay_command
from gpu_impl.vllm_cpu.planning import Observation, observe
from reference import backends as ref_backends
from reference.config import CaseConfig, LayerConfig
from reference.derive import derive, raw_spec
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.kernel_blocks import select_common_block_size as ref_select_common_block_size
from vllm_cases import CASES, admission_cases

REPO = Path(__file__).resolve().parents[2]
FIRST_WORDS = 4

# Known reference-vs-vLLM disagreements, each with the vLLM source that explains it:
# strict xfails, so a test fails as soon as the disagreement goes away. Empty today: the
# six found so far (sliding-window padding, FA4 head-256 pages, null-block reservation,
# MLA + SWA full-allocation fallback, mamba_type and cache-dtype spec equality) were all
# reference bugs and are fixed.
KNOWN_DISAGREEMENTS: dict[str, str] = {}
KNOWN_TABLE_DISAGREEMENTS: dict[str, str] = {}


def _report(case: CaseConfig, runner: str, problems: list[str]) -> str:
    lines = [f"case {case.name!r} ({runner}): reference and vLLM disagree"]
    lines += [f"  - {p}" for p in problems]
    lines.append(f"case JSON: {case.to_json()}")
    lines.append(f"replay: {replay_command(case)}")
    lines.append(
        f"replay (vLLM side only): cd {shlex.quote(str(REPO))} && PYTHONPATH=. {shlex.quote(sys.executable)} "
        f"-m gpu_impl.vllm_cpu.planning {shlex.quote(case.to_json())} {runner}"
    )
    lines.append(
        f"replay (reference): cd {shlex.quote(str(REPO))} && python -c "
        + shlex.quote(
            "import sys; from reference.config import CaseConfig; from reference.derive import derive; "
            f'print(derive(CaseConfig.from_json(sys.argv[1]), "{runner}"))'
        )
        + f" {shlex.quote(case.to_json())}"
    )
    return "\n".join(lines)


def _first_words(text: str, n: int = FIRST_WORDS) -> list[str]:
    return text.split()[:n]


def diff(case: CaseConfig, runner: str, obs: Observation) -> list[str]:
    """Every field where the reference or the contract and vLLM differ and no shipped
    expectation acknowledges it, one line each: the one comparator (``conformance.diff.compare``)
    and the shipped expectations, as ``kvconform run`` judges the same observation."""
    import importlib.metadata

    from conformance.diff import compare
    from conformance.expectations import Environment, case_facts, classify

    env = Environment(importlib.metadata.version("vllm"), {case.name: case_facts(case, (obs,))})
    return [d.message for d in classify(compare(case, runner, obs).divergences, env).unexpected]


def _has_draft(case: CaseConfig) -> bool:
    return any(layer.is_draft for layer in case.layers)


def _params():
    for case in CASES:
        # Both runners where they differ by design (drafts; PCP, which only MRv2 runs).
        both = _has_draft(case) or case.prefill_context_parallel_size > 1
        runners = ("mrv1", "mrv2") if both else ("mrv1",)
        for runner in runners:
            marks = []
            if case.name in KNOWN_DISAGREEMENTS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DISAGREEMENTS[case.name]))
            yield pytest.param(case, runner, id=f"{case.name}[{runner}]", marks=marks)


def test_case_list_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize(("case", "runner"), list(_params()))
def test_reference_matches_vllm(case: CaseConfig, runner: str):
    ref_error: StartupError | None = None
    invalid: str | None = None
    try:
        derive(case, runner)
    except StartupError as exc:
        ref_error = exc
    except NotModeledError as exc:
        pytest.skip(f"reference does not model this case yet: {exc}")
    except ConfigError as exc:
        invalid = str(exc)
    obs = observe(case, runner)
    if invalid is not None:
        verdict = (
            f"vLLM refuses it at {obs.error_stage}: {obs.error}"
            if obs.error
            else f"vLLM accepts it (layout {obs.layout}, groups {[g.block_size for g in obs.groups]}, "
            f"kernel block sizes {obs.kernel_block_sizes})"
        )
        pytest.fail(
            _report(case, runner, [f"the reference rejects the case as invalid (ConfigError: {invalid}); {verdict}"]),
            pytrace=False,
        )
    if obs.unsupported is not None:
        pytest.skip(f"vLLM cannot be driven on CPU for this case: {obs.unsupported}")

    problems = diff(case, runner, obs)
    if problems:
        where = f"the reference predicts vLLM refuses ({ref_error.where}); " if ref_error is not None else ""
        vllm = f"vLLM refuses at {obs.error_stage}: {obs.error}" if obs.error else "vLLM starts"
        pytest.fail(_report(case, runner, [where + vllm, *problems]), pytrace=False)


@pytest.mark.parametrize("case", admission_cases(), ids=lambda c: c.name)
def test_engine_core_planning_matches(case: CaseConfig):
    """With a pool that admits one max_model_len request, the engine core's full
    ``get_kv_cache_configs`` path plans exactly what the reference predicts."""
    derive(case)  # the reference models the case (raises otherwise)
    obs = observe(case, admission=True)
    if obs.unsupported is not None:
        pytest.skip(f"vLLM cannot be driven on CPU for this case: {obs.unsupported}")
    if obs.error is not None:
        pytest.fail(_report(case, "mrv1", [f"get_kv_cache_configs refused: {obs.error_stage}: {obs.error}"]), pytrace=False)
    problems = diff(case, "mrv1", obs)
    if problems:
        pytest.fail(_report(case, "mrv1", problems), pytrace=False)


# --- the backend table vs the real backend classes -------------------------------------------

TABLE_BLOCK_SIZES = (16, 32, 64, 128, 256)
TABLE_CAPABILITIES = ((9, 0), (10, 0))


def _table_layers(info: ref_backends.BackendInfo) -> list[LayerConfig]:
    """A plain and (where the backend takes one) a quantized layer of the right kind."""
    if info.is_mla:
        base = dict(kind="mla", head_size=576 if info.head_sizes.accepts(576) else 512)
    else:
        head = next(h for h in (128, 64, 256, 96, 512, 192) if info.head_sizes.accepts(h))
        base = dict(kind="full", num_kv_heads=2, head_size=head)
    out = [LayerConfig(name="model.layers.0.self_attn.attn", backend=info.name, **base)]
    if not info.is_mla and base["head_size"] != 256 and info.head_sizes.accepts(256):
        # head 256 takes FA4's dedicated hd256 kernel path on SM10x/SM11x.
        out.append(LayerConfig(name="model.layers.0.self_attn.attn", backend=info.name, **{**base, "head_size": 256}))
    for dtype in ("fp8", "fp8_e4m3", "nvfp4", "int8_per_token_head"):
        if dtype in info.kv_cache_dtypes:
            out.append(LayerConfig(name="model.layers.0.self_attn.attn", backend=info.name, cache_dtype=dtype, **base))
    return out


def _table_params():
    for name, info in ref_backends.BACKENDS.items():
        if info.is_ssm:
            continue
        for capability in TABLE_CAPABILITIES:
            for layer in _table_layers(info):
                test_id = f"{name}-{layer.cache_dtype}-hd{layer.head_size}-sm{capability[0]}{capability[1]}"
                marks = []
                if test_id in KNOWN_TABLE_DISAGREEMENTS:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_TABLE_DISAGREEMENTS[test_id]))
                yield pytest.param(name, layer, capability, id=test_id, marks=marks)


def _ref_sizes(sizes) -> tuple:
    return tuple(size_repr(s) for s in sizes)


@pytest.mark.parametrize(("backend", "layer", "capability"), list(_table_params()))
def test_backend_table_matches_vllm(backend: str, layer: LayerConfig, capability: tuple[int, int]):
    info = ref_backends.get_backend(backend)
    try:
        shims.backend_class(backend)
    except shims.BackendUnavailable as exc:
        pytest.skip(f"backend class not importable on CPU: {exc}")
    problems: list[str] = []
    for block_size in TABLE_BLOCK_SIZES:
        case = CaseConfig(name=f"table-{backend}", layers=(layer,), block_size=block_size, capability=capability)
        try:
            ref_raw = raw_spec(case, layer, info)
            ref_spec = ref_backends.customize_attention_spec(info, ref_raw, capability)
        except ConfigError as exc:
            problems.append(f"bs={block_size}: the reference rejects the table spec: {exc}")
            continue
        facts = declared(backend, layer, block_size, capability)
        where = f"bs={block_size} {layer.cache_dtype}"
        gqa = not info.is_mla
        expected = {
            "kernel_block_sizes": _ref_sizes(info.supported_kernel_block_sizes(ref_spec, capability, gqa=gqa)),
            "kernel_block_sizes_no_spec": _ref_sizes(info.supported_kernel_block_sizes(None, capability, gqa=gqa)),
            "layouts": None if (lays := info.supported_layouts(capability)) is None else tuple(l.name for l in lays),
            "num_heads": ref_spec.num_heads,
            "state_content_bytes": ref_spec.state_content_size_bytes,
            "page_size_bytes": ref_spec.page_size_bytes,
            "block_stride_alignment": None
            if ref_spec.block_stride_alignment is None
            else size_repr(ref_spec.block_stride_alignment),
            "block_stride_alignment_bytes": ref_spec.get_block_stride_alignment(),
        }
        if any(v.head_size is not None or v.unquantized_only for v in info.variants):
            # Without a spec vLLM reads the head size from the current model config, which the
            # reference's spec-less query cannot know; the with-spec answer above is compared.
            del expected["kernel_block_sizes_no_spec"]
        for field, want in expected.items():
            got = getattr(facts, field)
            if want != got:
                problems.append(f"{where}: {field}: reference={want!r} vllm={got!r}")
        sizes = info.supported_kernel_block_sizes(ref_spec, capability, gqa=gqa)
        try:
            want_common: int | str = ref_select_common_block_size(block_size, [(backend, sizes)])
        except StartupError as exc:
            want_common = exc.vllm_message
        got_common = facts.common_block_size
        if isinstance(want_common, int) or isinstance(got_common, int):
            if want_common != got_common:
                problems.append(f"{where}: select_common_block_size: reference={want_common!r} vllm={got_common!r}")
        elif _first_words(want_common) != _first_words(got_common):
            problems.append(f"{where}: select_common_block_size error: reference={want_common!r} vllm={got_common!r}")
    if problems:
        pytest.fail(
            f"backend {backend} at capability {capability}, layer {layer}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            pytrace=False,
        )


@pytest.mark.parametrize("capability", TABLE_CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
def test_state_space_backends_match_vllm(capability: tuple[int, int]):
    """Mamba-like backends: no declared layouts, kernel sizes unused (MambaSpec never splits)."""
    problems = []
    for name, info in ref_backends.BACKENDS.items():
        if not info.is_ssm:
            continue
        try:
            cls = shims.backend_class(name)
        except shims.BackendUnavailable as exc:
            problems.append(f"{name}: not importable on CPU: {exc}")
            continue
        with shims.fake_capability(capability):
            layouts = cls.supported_kv_cache_layouts()
            sizes = tuple(size_repr(s) for s in cls.get_supported_kernel_block_sizes(None))
            is_ssm = cls.is_ssm()
        want_layouts = info.supported_layouts(capability)
        if (None if want_layouts is None else tuple(l.name for l in want_layouts)) != (
            None if layouts is None else tuple(l.name for l in layouts)
        ):
            problems.append(f"{name}: layouts reference={want_layouts} vllm={layouts}")
        if _ref_sizes(info.supported_kernel_block_sizes(None, capability)) != sizes:
            problems.append(f"{name}: kernel sizes reference={info.kernel_block_sizes} vllm={sizes}")
        if not is_ssm:
            problems.append(f"{name}: vLLM's class says is_ssm() is False")
    assert not problems, "\n".join(problems)
