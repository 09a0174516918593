"""The GPU path's scenarios, and the fully resolved run spec of one (scenario, runner).

A scenario names a tiny model and the engine options that shape its KV cache; resolving
it for a device (compute capability) and a model runner gives a run spec: plain JSON
that ``gpu_impl.cuda.run_one`` executes in a fresh process, holding the reference case
the recording is diffed against. Pure Python (imports ``reference``, no vLLM or torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reference.config import CaseConfig, LayerConfig, uniform_layers

from gpu_impl.cuda import models
from gpu_impl.tiny_llm import token_prompts

RUNNERS = ("mrv1", "mrv2")
RUNNER_ENV = {"mrv1": "0", "mrv2": "1"}
"""``VLLM_USE_V2_MODEL_RUNNER`` per runner."""
CONNECTOR_CLASS = "CheckingConnector"
CONNECTOR_MODULE = "gpu_impl.cuda.connector"
NUM_SPECULATIVE_TOKENS = 2
KV_CACHE_MEMORY_BYTES = 64 * 1024 * 1024
"""Set so the worker skips memory profiling (``num_gpu_blocks_override`` sizes the pool)."""
GPU_MEMORY_UTILIZATION = 0.08
"""Only the start-up free-memory check reads it once ``kv_cache_memory_bytes`` is set."""
MLA = "MLA"
"""Scenario backend placeholder: FLASHMLA where it runs (SM90/SM100), else TRITON_MLA."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    model: str
    """``qwen3`` (dense GQA, 8 KV heads x 128) or ``deepseek_v3`` (MLA, 576-wide latent)."""
    block_size: int
    num_blocks: int
    backend: str
    layout: str | None = None
    draft: str | None = None
    """``eagle3`` / ``eagle``: a one-layer Llama draft, ``num_speculative_tokens=2``."""
    num_layers: int = 2
    max_model_len: int = 512
    prompt_lens: tuple[int, ...] = (40, 21, 5)
    max_tokens: int = 4


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "fa-b16",
            "dense Qwen3-like, FLASH_ATTN, 16-token blocks (no kernel split); the smallest scenario",
            "qwen3",
            block_size=16,
            num_blocks=64,
            backend="FLASH_ATTN",
        ),
        Scenario(
            "flashinfer-b128-k64",
            "dense Qwen3-like, FLASHINFER at block 128: 64-token kernel blocks (the vLLM #42846 scenario)",
            "qwen3",
            block_size=128,
            num_blocks=16,
            backend="FLASHINFER",
            prompt_lens=(200, 70, 5),
        ),
        Scenario(
            "flashinfer-b128-k64-lbhnc",
            "FLASHINFER at block 128 under VLLM_KV_CACHE_LAYOUT=LBHNC: head-major blocks, where a split "
            "and an unsplit view put a token at different bytes (not in the default set)",
            "qwen3",
            block_size=128,
            num_blocks=16,
            backend="FLASHINFER",
            layout="LBHNC",
            prompt_lens=(200, 70, 5),
        ),
        Scenario(
            "fa-b128-lbhnc",
            "dense Qwen3-like, FLASH_ATTN at block 128 with VLLM_KV_CACHE_LAYOUT=LBHNC (HND)",
            "qwen3",
            block_size=128,
            num_blocks=16,
            backend="FLASH_ATTN",
            layout="LBHNC",
            prompt_lens=(200, 70, 5),
        ),
        Scenario(
            "mla-b128",
            "DeepSeek-V3-like MLA (kv_lora_rank 512 + rope 64 = 576), FLASHMLA (64-token kernel blocks) "
            "on SM90/SM100, TRITON_MLA elsewhere",
            "deepseek_v3",
            block_size=128,
            num_blocks=16,
            backend=MLA,
            prompt_lens=(200, 70, 5),
        ),
        Scenario(
            "eagle3-fa-b16",
            "dense Qwen3-like target (FLASH_ATTN, block 16) with a one-layer Eagle3 Llama draft",
            "qwen3",
            block_size=16,
            num_blocks=64,
            backend="FLASH_ATTN",
            draft="eagle3",
        ),
    )
}
SMALLEST = "fa-b16"
DEFAULT_ORDER = ("flashinfer-b128-k64", "fa-b16", "mla-b128", "fa-b128-lbhnc", "eagle3-fa-b16")
"""Most telling first: a run cut off by the time budget loses the least. Under the default
(token-major LBNHC) layout a split and an unsplit view of a block address a token at the
same bytes, so FlashInfer's #42846 shape shows in the registered-shape diff there and in the
data as well only under LBHNC (``flashinfer-b128-k64-lbhnc``, run it with ``--scenario``)."""


def mla_backend(capability: tuple[int, int]) -> str:
    """FLASHMLA needs SM90/SM100 (``FlashMLABackend.supports_compute_capability``)."""
    return "FLASHMLA" if capability[0] in (9, 10) else "TRITON_MLA"


def auto_dense_backend(capability: tuple[int, int]) -> str:
    """What the target release auto-selects for a bf16 GQA layer (``cuda._get_backend_priorities``).

    Used for an Eagle draft under MRv1, whose draft config auto-selects (the reference's
    ``layer_backend``); MRv2 keeps the target's ``--attention-backend``.
    """
    return "FLASHINFER" if capability[0] == 10 else "FLASH_ATTN"


def scenario_backend(scenario: Scenario, capability: tuple[int, int]) -> str:
    return mla_backend(capability) if scenario.backend == MLA else scenario.backend


def model_configs(scenario: Scenario, draft_method: str | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The target's (and draft's) ``config.json``."""
    if scenario.model == "qwen3":
        target = models.qwen3_config(scenario.num_layers)
    elif scenario.model == "deepseek_v3":
        target = models.deepseek_v3_config(scenario.num_layers)
    else:
        raise ValueError(f"scenario {scenario.name!r}: unknown model {scenario.model!r}")
    method = draft_method or scenario.draft
    draft = models.eagle_draft_config(target, method) if method else None
    return target, draft


def reference_case(scenario: Scenario, capability: tuple[int, int], draft_method: str | None = None) -> CaseConfig:
    """The reference case whose layers are the engine's (names as vLLM gives them)."""
    target, draft = model_configs(scenario, draft_method)
    backend = scenario_backend(scenario, capability)
    if scenario.model == "deepseek_v3":
        layers = uniform_layers(scenario.num_layers, kind="mla", backend=backend, head_size=models.mla_head_size(target))
    else:
        layers = uniform_layers(
            scenario.num_layers, backend=backend, num_kv_heads=target["num_key_value_heads"], head_size=target["head_dim"]
        )
    if draft is not None:
        layers += (
            LayerConfig(
                models.draft_layer_name(target),
                backend=auto_dense_backend(capability),
                num_kv_heads=draft["num_key_value_heads"],
                head_size=draft["head_dim"],
                is_draft=True,
            ),
        )
    return CaseConfig(
        name=f"gpu-{scenario.name}",
        layers=layers,
        block_size=scenario.block_size,
        num_blocks=scenario.num_blocks,
        layout=scenario.layout,
        capability=tuple(capability),
        attention_backend=backend,
        max_model_len=scenario.max_model_len,
        note=scenario.description,
    )


def prompts(lengths: tuple[int, ...], vocab: int = models.VOCAB) -> list[list[int]]:
    """Token-id prompts with distinct first tokens (no shared prefix, no prefix-cache hits)."""
    return token_prompts(lengths, vocab)


def run_id(scenario: str, runner: str) -> str:
    return f"{scenario}-{runner}"


def build_run_spec(
    scenario: Scenario | str,
    runner: str,
    capability: tuple[int, int],
    *,
    draft_method: str | None = None,
    check_calls: int = 3,
    check_slots: int = 8,
) -> dict[str, Any]:
    """Everything ``run_one`` needs for one (scenario, runner): plain JSON."""
    if isinstance(scenario, str):
        scenario = get_scenario(scenario)
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
    if max(scenario.prompt_lens) + scenario.max_tokens > scenario.max_model_len:
        raise ValueError(f"scenario {scenario.name!r}: a prompt does not fit max_model_len")
    target, draft = model_configs(scenario, draft_method)
    case = reference_case(scenario, capability, draft_method)
    backend = scenario_backend(scenario, capability)
    env = {"VLLM_USE_V2_MODEL_RUNNER": RUNNER_ENV[runner]}
    if scenario.layout:
        env["VLLM_KV_CACHE_LAYOUT"] = scenario.layout
    engine = {
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "bfloat16",
        "block_size": scenario.block_size,
        "num_gpu_blocks_override": scenario.num_blocks,
        "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "max_model_len": scenario.max_model_len,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 1024,
        "seed": 0,
        "attention_config": {"backend": backend},
    }
    method = draft_method or scenario.draft
    speculative = {"method": method, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS} if method else None
    return {
        "run_id": run_id(scenario.name, runner),
        "scenario": scenario.name,
        "description": scenario.description,
        "runner": runner,
        "capability": list(capability),
        "backend": backend,
        "case": case.to_dict(),
        "models": {"target": target, "draft": draft},
        "env": env,
        "engine": engine,
        "speculative": speculative,
        "prompts": prompts(scenario.prompt_lens),
        "max_tokens": scenario.max_tokens,
        "connector": {"class": CONNECTOR_CLASS, "module": CONNECTOR_MODULE},
        "check": {"check_calls": check_calls, "check_slots": check_slots},
    }


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}") from None


__all__ = [
    "DEFAULT_ORDER",
    "RUNNERS",
    "SCENARIOS",
    "SMALLEST",
    "Scenario",
    "auto_dense_backend",
    "build_run_spec",
    "get_scenario",
    "mla_backend",
    "prompts",
    "reference_case",
    "run_id",
]
