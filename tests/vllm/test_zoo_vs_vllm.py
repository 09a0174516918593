"""The model zoo through vLLM 0.33.0's own layout code, against the reference.

Each zoo architecture (suites/zoo/*.json) x a few (backend, block size, layout) combos,
observed through ``gpu_impl.vllm_cpu.planning.observe`` for both model runners:

- ``compare`` must pass for each runner (a failure prints the case JSON and a replay
  command);
- ``compare_runners`` must be clean, or every mismatch matched by
  ``conformance/expectations.toml`` (``conformance.expectations.classify``).

Combos vLLM refuses before any layout code runs are checked as refusals: a head size the
backend does not take (Phi-3's 96 under FlashInfer, against the backend class's
``supports_head_size``) and sliding windows under DCP (the engine core's admission check).
A further test checks the zoo's reading of each config (sliding windows, layer types)
against transformers' own config classes, which is what vLLM parses them with.
"""

from __future__ import annotations

import shlex
import warnings

import pytest

from conformance.diff import compare, compare_runners
from conformance.pytest_plugin import check_runners_agree
from reference import backends as bk
from reference.derive import derive
from reference.state_mixers import layer_state
from reference.errors import ConfigError, NotModeledError, StartupError
from reference.parallel import check_parallel
from reference.config import LAYER_OWN_BACKENDS
from suites.zoo import hybrid_block_size, load_zoo, model_heads, sliding_windows, to_case

ZOO = load_zoo()

COMBOS = (
    ("FLASH_ATTN", 16, None),
    ("FLASHINFER", 128, "LBNHC"),
    ("TRITON_ATTN", 64, "LBHNC"),
    ("FLASH_ATTN", 128, "BLHNC"),
)
# (backend, block size, layout, capability, cache dtype): SM100 (FA4's head-256 pages,
# FlashInfer's TRT-LLM sizes and layouts) and fp8 caches.
EXTRA_COMBOS = (
    ("FLASH_ATTN", 16, None, (10, 0), "auto"),
    ("FLASHINFER", 64, "LBHNC", (10, 0), "fp8"),
)

# (backend, block size, layout, TP, DCP): one rank of a parallel deployment. DCP needs
# TP above the KV head count for GQA models; vLLM refuses the rest (skipped with its text).
PARALLEL_COMBOS = (
    ("FLASHINFER", 128, "LBNHC", 8, 1),
    ("FLASH_ATTN", 64, None, 16, 2),
)
# Sliding windows under DCP: refused only by the engine core's admission check (the
# reference's NotModeledError quotes it), so vLLM's admission path is asserted instead.
ADMISSION_ONLY_REFUSAL = "DCP not support sliding window."
# Hybrid models also at the block size vLLM would raise them to (update_block_size_for_backend).
HYBRID_COMBOS = (("FLASH_ATTN", None), ("FLASHINFER", "LBNHC"))


def _params():
    out = []
    for name in sorted(ZOO):
        model = ZOO[name]
        combos = list(COMBOS)
        if any(l.kind == "mamba" for l in to_case(model, block_size=16, backend="FLASH_ATTN").layers):
            combos += [(b, hybrid_block_size(model, b, 16), lay) for b, lay in HYBRID_COMBOS]
        for backend, block_size, layout in combos:
            out.append(pytest.param(name, backend, block_size, layout, (9, 0), "auto", 1, 1, id=f"{name}-{backend}-b{block_size}-{layout}"))
        for backend, block_size, layout, cap, dtype in EXTRA_COMBOS:
            out.append(
                pytest.param(
                    name, backend, block_size, layout, cap, dtype, 1, 1,
                    id=f"{name}-{backend}-b{block_size}-{layout}-sm{cap[0]}{cap[1]}-{dtype}",
                )
            )
        for backend, block_size, layout, tp, dcp in PARALLEL_COMBOS:
            try:
                check_parallel(model_heads(model), tp, dcp)
            except ConfigError:
                continue  # vLLM refuses it at config time: test_zoo_parallel_heads_and_refusals_are_vllms
            out.append(
                pytest.param(
                    name, backend, block_size, layout, (9, 0), "auto", tp, dcp,
                    id=f"{name}-{backend}-b{block_size}-{layout}-tp{tp}-dcp{dcp}",
                )
            )
    return out


# (model, backend, block size, layout) -> reason, for known divergences (xfail strict).
KNOWN_DIVERGENCES: dict[tuple[str, str, int, str | None], str] = {}


def _fail(case, runner: str, lines: str) -> None:
    pytest.fail(
        f"runner {runner}:\n{lines}\n  config: {case.to_json()}\n"
        f"  replay: python -m gpu_impl.vllm_cpu.planning {shlex.quote(case.to_json())} {runner}",
        pytrace=False,
    )


@pytest.mark.parametrize("name, backend, block_size, layout, capability, cache_dtype, tp, dcp", _params())
def test_zoo_model_conforms(name, backend, block_size, layout, capability, cache_dtype, tp, dcp) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    model = ZOO[name]
    known = KNOWN_DIVERGENCES.get((name, backend, block_size, layout))
    if known:
        pytest.xfail(known)  # pragma: no cover - none today
    case = to_case(
        model, block_size=block_size, backend=backend, layout=layout, capability=capability,
        cache_dtype=cache_dtype, tensor_parallel_size=tp, decode_context_parallel_size=dcp,
    )
    try:
        derive(case)
    except ConfigError as exc:
        # The reference refuses it as the backend selector would: check vLLM's backend agrees.
        from gpu_impl.vllm_cpu import shims

        assert "head size" in str(exc), exc
        # The layer the reference names (Gemma 4's full layers have a head size of their own).
        (layer,) = [l for l in case.layers if f"layer {l.name!r}:" in str(exc)]
        assert not shims.backend_class(layer.backend).supports_head_size(layer.head_size), exc
        return
    except NotModeledError as exc:
        if ADMISSION_ONLY_REFUSAL in str(exc):
            # The reference leaves admission unmodeled but names vLLM's refusal: check it.
            for runner in ("mrv1", "mrv2"):
                refused = observe(case, runner, admission=True)
                assert refused.error and ADMISSION_ONLY_REFUSAL in refused.error, (runner, refused.error)
            return
    except StartupError:
        pass  # compare() checks vLLM refuses it the same way
    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    for runner, obs in observations.items():
        result = compare(case, runner, obs)
        if result.status == "unsupported":
            pytest.skip(f"unsupported by the CPU driver: {result.detail}")
        if result.status == "not_modeled":
            pytest.skip(f"not modeled by the reference: {result.detail}")
        if result.status != "pass":
            _fail(case, runner, "\n".join(f"  {d.message}" for d in result.divergences))
    check_runners_agree(case, observations["mrv1"], observations["mrv2"])


@pytest.mark.parametrize(("name", "backend", "block_size", "expected"), [
    ("qwen3-next-80b-a3b", "FLASH_ATTN", 16, 544),  # 16 * ceil(1097728 / (16 * 2048))
    ("nemotron-h-8b", "FLASHINFER", 128, 1152),  # 128 * ceil(4255744 / (128 * 4096))
    ("qwen3.6-35b-a3b", "FLASH_ATTN", 16, 1056),  # its float32 SSM state: 16 * ceil(page / (16 * 2048))
    ("kimi-k3", "FLASH_ATTN", 16, 5760),  # an MLA hybrid: the KDA state in 128-token multiples of 1152 B/token
])
def test_zoo_hybrid_block_size_is_what_vllm_negotiates(name: str, backend: str, block_size: int, expected: int) -> None:
    """The reference's hybrid_block_size is the block size vLLM's own update_block_size_for_backend leaves,
    asking the family's own model class (Qwen3NextForCausalLM, NemotronHForCausalLM) for its state."""
    model = ZOO[name]
    case = to_case(model, block_size=block_size, backend=backend)
    from gpu_impl.vllm_cpu.planning import observe

    assert hybrid_block_size(model, backend, block_size) == expected
    observation = observe(case, "mrv1")
    assert observation.error is None and observation.unsupported is None, (observation.error, observation.unsupported)
    # The attention groups' block is the negotiated one (the state groups keep mamba_block_size, here
    # max_model_len: Kimi K3's 5760 is above it, so its cache block size is the state's).
    assert {g.block_size for g in observation.groups if g.spec_type != "MambaSpec"} == {expected}, observation.groups


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_reads_configs_like_transformers(name) -> None:
    """The per-layer sliding windows the zoo derives equal what vLLM derives from the
    config transformers parses: CacheConfig.sliding_window only when ``layer_types`` is
    absent or all sliding (vllm/engine/arg_utils.py), else the per-layer pattern."""
    transformers = pytest.importorskip("transformers")
    model = ZOO[name]
    raw = {k: v for k, v in model.config.items() if k != "model_type"}
    model_type = model.config["model_type"]
    if model_type not in transformers.CONFIG_MAPPING:
        # A remote-code wrapper (Kimi K3's kimi_k3): its text config is a type transformers has.
        raw = {k: v for k, v in model.text_config.items() if k != "model_type"}
        model_type = model.model_type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = transformers.AutoConfig.for_model(model_type, **raw).get_text_config()
    n = model.text_config.get("num_hidden_layers", model.text_config.get("decoder_layers"))
    if model.model_type == "deepseek_v4":
        # vLLM's get_compress_ratios reads layer_types and compress_rates as transformers parses them (the legacy
        # compress_ratios key becomes layer_types); the zoo reads the raw config the same way.
        from suites.zoo import deepseek_v4_compress_ratios

        assert deepseek_v4_compress_ratios(model.text_config) == [
            parsed.compress_rates.get(t, 0) for t in parsed.layer_types][:n]
        assert {l.sliding_window for l in to_case(model, block_size=256, backend="FLASH_ATTN").layers
                if l.kind == "dsv4_swa"} == {parsed.sliding_window}
        return
    if model.model_type in ("whisper", "deepseek_v3", "deepseek_v32", "nemotron_h", "kimi_linear", "minimax_m3_vl"):
        assert getattr(parsed, "sliding_window", None) is None
        assert not any(l.kind == "sliding_window" for l in to_case(model, block_size=128, backend="FLASHINFER").layers)
        return
    types = getattr(parsed, "layer_types", None)
    window = getattr(parsed, "sliding_window", None)
    if types is None or all(t == "sliding_attention" for t in types):
        vllm_windows = [window] * n
    elif model.model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        vllm_windows = [None] * n
        assert [t for t in types] == [
            "full_attention" if l.kind == "full" else "linear_attention"
            for l in to_case(model, block_size=16, backend="FLASH_ATTN").layers
        ]
    else:
        vllm_windows = [window if t == "sliding_attention" else None for t in types]
    if model.model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        return
    assert sliding_windows(model.text_config, model.model_type) == vllm_windows


def _gemma4_variants():
    """The zoo's Gemma 4 file as written (an explicit per_layer_config), and the same text config
    in the Hub's other form: per_layer_config left for transformers to fill in from
    global_head_dim / num_global_key_value_heads (K=V global layers with 2 KV heads of 384)."""
    for name in sorted(ZOO):
        model = ZOO[name]
        if model.model_type not in ("gemma4", "gemma4_text"):
            continue
        yield pytest.param(dict(model.config), id=f"{name}-as-written")
        text = {k: v for k, v in model.text_config.items() if k != "per_layer_config"}
        text.update(attention_k_eq_v=True, num_global_key_value_heads=2, global_head_dim=384)
        yield pytest.param(dict(model.config, text_config=text), id=f"{name}-global-fields")


@pytest.mark.parametrize("config", list(_gemma4_variants()))
def test_gemma4_layer_geometry_is_what_its_decoder_layers_read(config) -> None:
    """Per decoder layer, the KV heads and head size the zoo gives equal what vLLM's
    ``Gemma4DecoderLayer`` reads: ``config.per_layer_config[layer_idx]`` of the config
    transformers parses (model_executor/models/gemma4.py)."""
    transformers = pytest.importorskip("transformers")
    from suites.zoo import layer_geometry

    raw = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = transformers.AutoConfig.for_model(config["model_type"], **raw).get_text_config()
    text = config["text_config"]
    wanted = [(parsed.per_layer_config[i].num_key_value_heads, parsed.per_layer_config[i].head_dim)
              for i in range(parsed.num_hidden_layers)]
    assert [layer_geometry(text, text["model_type"], i) for i in range(parsed.num_hidden_layers)] == wanted
    assert len(set(wanted)) == 2  # the global layers differ from the local ones


@pytest.mark.parametrize("backend, block_size, layout", COMBOS, ids=[f"{b}-b{s}-{l}" for b, s, l in COMBOS])
def test_whisper_groups_self_and_cross_attention(backend, block_size, layout) -> None:
    """Whisper's decoder through vLLM's own ``Attention`` and ``CrossAttention``
    ``get_kv_cache_spec``: two groups (self, cross), each as the reference places it."""
    from gpu_impl.vllm_cpu.planning import observe

    case = to_case(ZOO["whisper-large-v3"], block_size=block_size, backend=backend, layout=layout)
    observations = {runner: observe(case, runner) for runner in ("mrv1", "mrv2")}
    for runner, obs in observations.items():
        if not bk.get_backend(backend).supports_cross_attention:
            # The platform refuses a backend without cross attention for encoder_attn.
            assert obs.error is not None and "ENCODER_DECODER not supported" in obs.error, obs
            assert compare(case, runner, obs).status == "pass"
            continue
        assert [g.spec_type for g in obs.groups] == ["FullAttentionSpec", "CrossAttentionSpec"], obs.error
        result = compare(case, runner, obs)
        if result.status != "pass":
            _fail(case, runner, "\n".join(f"  {d.message}" for d in result.divergences) or result.detail)
    assert compare_runners(case, observations["mrv1"], observations["mrv2"]) == ()


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize(
    "name, module, cls_name",
    [
        ("qwen3-next-80b-a3b", "vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
        ("nemotron-h-8b", "vllm.model_executor.models.nemotron_h", "NemotronHForCausalLM"),
        ("qwen3.6-35b-a3b", "vllm.model_executor.models.qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
    ],
)
def test_zoo_state_shapes_are_the_model_classes(name, module, cls_name, tp) -> None:
    """The zoo's state shapes/dtypes equal the vLLM model class's own
    ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config`` at TP 1,
    2 and 4 (no speculative tokens, default cache dtypes; Nemotron-H's config hook applied)."""
    import importlib
    from types import SimpleNamespace

    import torch

    model = ZOO[name]
    hf = SimpleNamespace(**model.text_config)
    cache = SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", use_replayssm=False)
    if name == "nemotron-h-8b":
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig

        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache, hf_config=hf)
    if name == "qwen3.6-35b-a3b":  # Qwen3_5ForConditionalGenerationConfig: 'auto' -> the config's mamba_ssm_dtype
        cache.mamba_ssm_cache_dtype = hf.mamba_ssm_dtype
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        speculative_config=None,
        num_speculative_tokens=0,
        cache_config=cache,
        model_config=SimpleNamespace(hf_config=hf, hf_text_config=hf, dtype=torch.bfloat16),
    )
    cls = getattr(importlib.import_module(module), cls_name)
    shapes = tuple(tuple(s) for s in cls.get_mamba_state_shape_from_config(vllm_config))
    dtypes = tuple(str(d).removeprefix("torch.") for d in cls.get_mamba_state_dtype_from_config(vllm_config))
    case = to_case(model, block_size=16, backend="FLASH_ATTN", tensor_parallel_size=tp)
    states = {layer_state(case, l) for l in case.layers if l.kind == "mamba"}
    assert states == {(shapes, dtypes)}


PARALLEL_GRID = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (3, 1), (8, 2), (16, 2), (16, 4), (32, 8), (64, 8))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_parallel_heads_and_refusals_are_vllms(name) -> None:
    """Per-rank KV heads and TP/DCP refusals equal vLLM's own: ``ModelConfig.get_num_kv_heads``
    and ``verify_with_parallel_config`` (run on the ``ModelArchitectureConfig`` vLLM's
    convertor builds from the transformers-parsed config) and ``ParallelConfig``'s validator."""
    transformers = pytest.importorskip("transformers")
    from types import SimpleNamespace

    from vllm.config import ParallelConfig
    from vllm.config.model import ModelConfig
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    model = ZOO[name]
    raw = {k: v for k, v in model.config.items() if k != "model_type"}
    model_type = model.config["model_type"]
    if model_type not in transformers.CONFIG_MAPPING:  # a remote-code wrapper: its text config
        raw = {k: v for k, v in model.text_config.items() if k != "model_type"}
        model_type = model.model_type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoConfig.for_model(model_type, **raw)
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(hf.model_type, ModelArchConfigConvertorBase)
    arch = convertor(hf, hf.get_text_config()).convert(supports_multimodal=False)
    stand_in = SimpleNamespace(model_arch_config=arch, use_mla=model.is_mla, multimodal_config=None)
    stand_in.get_total_num_kv_heads = lambda: arch.total_num_kv_heads
    for tp, dcp in PARALLEL_GRID:
        try:
            ModelConfig.verify_with_parallel_config(
                stand_in,
                SimpleNamespace(
                    enable_hc_sp=False, tensor_parallel_size=tp, enable_expert_parallel=False,
                    pipeline_parallel_size=1, decode_context_parallel_size=dcp,
                ),
            )
            ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp)
            vllm_verdict = None
        except Exception as exc:  # vLLM raises ValueError, or pydantic's ValidationError
            vllm_verdict = str(exc)
        try:
            case = to_case(model, block_size=16, backend="FLASH_ATTN", tensor_parallel_size=tp, decode_context_parallel_size=dcp)
        except ConfigError as exc:
            assert vllm_verdict is not None, f"TP {tp} / DCP {dcp}: the zoo refuses ({exc}) but vLLM accepts"
            assert str(exc).split(".")[0] in vllm_verdict, f"TP {tp} / DCP {dcp}: {exc!s} vs vLLM: {vllm_verdict}"
            continue
        assert vllm_verdict is None, f"TP {tp} / DCP {dcp}: vLLM refuses ({vllm_verdict}) but the zoo accepts"
        # The model-wide geometry's layers (Gemma 4's global layers have their own KV heads,
        # layer_geometry; indexer caches keep one key vector per token).
        per_layer = model.model_type in ("gemma4", "gemma4_text")
        target = [l for l in case.layers if not l.is_draft and l.kind not in ("mamba", *LAYER_OWN_BACKENDS)
                  and (not per_layer or l.head_size == model.text_config["head_dim"])]
        expected = ModelConfig.get_num_kv_heads(stand_in, SimpleNamespace(tensor_parallel_size=tp))
        if model.model_type == "deepseek_v4":
            # Every cache is one of DeepSeek V4's own classes: one latent head, replicated (max_tp_shards=1).
            target = [l for l in case.layers if not l.is_draft]
        assert {l.num_kv_heads for l in target} == {expected}, f"TP {tp}"
