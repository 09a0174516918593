"""State layers built as vLLM's own mixer classes (``LayerConfig.mixer``): the reference's model of
each class's state (``reference.state_mixers``, vLLM 0.33.0's ``mamba_utils.py`` calculators), the
case fields that describe them, and how bad ones are refused."""

from __future__ import annotations

import json
import math

import pytest

from reference import backends as bk
from reference.config import STATE_MIXERS, CaseConfig, LayerConfig, StateMixer, uniform_layers
from reference.derive import derive, raw_spec
from reference.errors import ConfigError, StartupError
from reference.state_mixers import state_dtypes, state_shapes
from suites.named_cases import CASES

MIXER_CASES = ("mamba2-mixer-hybrid", "mamba2-mixer-tp2-one-group", "qwen3-next-gdn-hybrid", "kimi-k3-kda-hybrid",
               "glm5next-kda-hybrid")


def _case(mixer: StateMixer, **case: object) -> CaseConfig:
    layer = LayerConfig("model.layers.1.linear_attn", kind="mamba", backend=STATE_MIXERS[mixer.kind][0], mixer=mixer)
    return CaseConfig("mixer", uniform_layers(1, num_kv_heads=2, head_size=64) + (layer,), **case)  # type: ignore[arg-type]


# --- the state each class computes --------------------------------------------------------------


@pytest.mark.parametrize(("mixer", "tp", "shapes"), [
    # Mamba-2: conv over x, B and C (heads * head_dim + 2 * groups * state); SSM (heads, head_dim, state).
    (StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=2, state_size=16), 1, ((3, 192), (8, 16, 16))),
    (StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=2, state_size=16), 2, ((3, 96), (4, 16, 16))),
    # One group at TP 2 is replicated to every head shard: 2 groups' B and C, halved.
    (StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=1, state_size=16), 2, ((3, 96), (4, 16, 16))),
    (StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=1, state_size=16, conv_kernel=2), 1, ((1, 160), (8, 16, 16))),
    # GDN: conv over q, k (key heads) and v (value heads); recurrent (value heads, value dim, key dim).
    (StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=16), 1, ((3, 192), (4, 32, 16))),
    (StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=16), 2, ((3, 96), (2, 32, 16))),
    # KDA: conv over q, k and v of num_heads x head_dim each; a square recurrent state per head.
    (StateMixer("kimi_k3_kda", num_heads=4, head_dim=32), 1, ((3, 384), (4, 32, 32))),
    (StateMixer("glm5next_kda", num_heads=4, head_dim=32, conv_kernel=3), 4, ((2, 96), (1, 32, 32))),
])
def test_state_shapes_per_rank(mixer: StateMixer, tp: int, shapes: tuple) -> None:
    assert state_shapes(mixer, tp) == shapes


@pytest.mark.parametrize(("kind", "conv", "ssm", "expected"), [
    ("mamba2", "auto", "auto", ("bfloat16", "bfloat16")),
    ("mamba2", "auto", "float32", ("bfloat16", "float32")),
    ("gated_delta_net", "float16", "auto", ("float16", "float16")),
    # KDA's recurrent state is float32 unless asked for bfloat16 (kda_state_dtype).
    ("kimi_k3_kda", "auto", "auto", ("bfloat16", "float32")),
    ("glm5next_kda", "auto", "bfloat16", ("bfloat16", "bfloat16")),
])
def test_state_dtypes(kind: str, conv: str, ssm: str, expected: tuple[str, str]) -> None:
    mixer = next(l.mixer for case in CASES.values() for l in case.layers if l.mixer is not None and l.mixer.kind == kind)
    assert state_dtypes(mixer, "bfloat16", conv, ssm) == expected


@pytest.mark.parametrize("name", MIXER_CASES)
def test_named_mixer_cases_pad_their_state_to_the_attention_page(name: str) -> None:
    case = CASES[name]
    d = derive(case)
    mixer_layer = next(l for l in case.layers if l.mixer is not None)
    spec = raw_spec(case, mixer_layer, bk.get_backend(mixer_layer.backend))
    content = sum(math.prod(s) * {"bfloat16": 2, "float32": 4}[t] for s, t in zip(spec.shapes, spec.dtypes))
    assert spec.shapes == state_shapes(mixer_layer.mixer, case.tensor_parallel_size)
    assert spec.state_content_size_bytes == content
    attention = next(g for g in d.groups if g.spec.kind.name != "MAMBA")
    state = next(g for g in d.groups if g.spec.kind.name == "MAMBA")
    # The negotiation pads the state page to the attention page (mamba_page_size_padded).
    assert state.spec.page_size_bytes == spec.page_size_bytes == attention.spec.page_size_bytes > content


def test_a_float16_kda_state_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(StartupError, match="KDA recurrent state supports only auto, float32, and bfloat16; got float16"):
        derive(CASES["kda-fp16-state-refused"])


# --- the case description ----------------------------------------------------------------------


@pytest.mark.parametrize("name", MIXER_CASES)
def test_mixer_cases_round_trip_through_json(name: str) -> None:
    case = CASES[name]
    data = json.loads(case.to_json())
    assert "mamba_shapes" not in json.dumps(data["layers"])
    assert CaseConfig.from_json(case.to_json()) == case


def test_a_case_at_the_default_state_dtypes_keeps_its_json() -> None:
    assert "mamba_cache_dtype" not in CASES["mamba-hybrid"].to_json()
    assert '"mamba_ssm_cache_dtype":"bfloat16"' in CASES["glm5next-kda-hybrid"].to_json()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["layers"][1].update(mamba_shapes=[[3, 4]]), "computes its own state; drop mamba_shapes"),
    (lambda d: d["layers"][1].update(backend="MAMBA2_ATTN"), "runs on GDN_ATTN (Glm5NextLinearAttention names it), not 'MAMBA2_ATTN'"),
    (lambda d: d["layers"][1]["mixer"].update(kind="mamba3"), "mixer kind 'mamba3' is not one of"),
    (lambda d: d["layers"][1]["mixer"].update(rank=2), "mixer: unknown field(s) ['rank']"),
    (lambda d: d["layers"][1]["mixer"].update(n_groups=2), "mixer 'glm5next_kda': n_groups 2 is not one of its fields"),
    (lambda d: d["layers"][1]["mixer"].pop("head_dim"), "mixer 'glm5next_kda' needs head_dim"),
    (lambda d: d["layers"][1]["mixer"].update(conv_kernel=1), "mixer conv_kernel 1 must be an integer >= 2"),
    (lambda d: d["layers"][1].update(mixer=[4, 32]), "mixer [4, 32] must be an object"),
    (lambda d: d["layers"][1].update(kind="full", backend="FLASH_ATTN"), "a mixer is only for kind 'mamba', not 'full'"),
    (lambda d: d.update(tensor_parallel_size=8), "mixer num_heads 4 is not divisible by tensor_parallel_size 8"),
    (lambda d: d.update(mamba_ssm_cache_dtype="fp8"), "mamba_ssm_cache_dtype 'fp8' is not one of auto, float32"),
    (lambda d: d.update(generation=1, vllm_version="0.25.0"), "a mixer layer needs generation 2"),
])
def test_bad_mixer_input_is_one_line_naming_the_value(change, message: str) -> None:
    data = json.loads(_case(StateMixer("glm5next_kda", num_heads=4, head_dim=32)).to_json())
    change(data)
    with pytest.raises(ConfigError) as info:
        CaseConfig.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_mamba2_groups_must_split_its_heads_and_its_tp_shards() -> None:
    with pytest.raises(ConfigError, match="num_heads 8 must be a multiple of n_groups 3"):
        StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=3, state_size=16)
    # MambaMixer2.__init__'s own assertions, predicted as vLLM refusing to start.
    with pytest.raises(StartupError, match="If tensor parallel world size does not divide num_groups, then num_groups "
                                           "must equal 1."):
        derive(_case(StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=2, state_size=16), tensor_parallel_size=4))
    with pytest.raises(StartupError, match="Tensor parallel world size must divide num heads."):
        derive(_case(StateMixer("mamba2", num_heads=8, head_dim=16, n_groups=1, state_size=16), tensor_parallel_size=16))


def test_a_models_state_layers_share_one_mixer() -> None:
    gdn = StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=32)
    kda = StateMixer("glm5next_kda", num_heads=4, head_dim=32)
    layers = uniform_layers(1, num_kv_heads=2, head_size=64) + (
        LayerConfig("model.layers.1.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
        LayerConfig("model.layers.2.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=kda),
    )
    with pytest.raises(ConfigError, match=r"built as \['gated_delta_net', 'glm5next_kda'\]; a model's state layers share one mixer"):
        CaseConfig("two-mixers", layers)
    stand_in = LayerConfig("model.layers.2.mixer", kind="mamba", backend="GDN_ATTN", mamba_shapes=((3, 64),))
    with pytest.raises(ConfigError, match=r"\['gated_delta_net', 'stand-in'\]"):
        CaseConfig("mixer-and-stand-in", layers[:2] + (stand_in,))


# --- the block-size negotiation (update_block_size_for_backend) -----------------------------------


def test_a_state_that_outgrows_the_attention_page_raises_the_block_size() -> None:
    from reference.derive import hybrid_block_size

    case = CASES["gdn-state-raises-block-size"]
    # Attention: 2 KV heads x 256 x (K, V) x bf16 = 2048 bytes a token; the GDN state 1097728 bytes.
    assert hybrid_block_size(case) == (16 * -(-1097728 // (16 * 2048)), 544 * 2048)
    d = derive(case)
    assert {g.spec.block_size for g in d.groups if g.spec.kind.name != "MAMBA"} == {544}
    assert {g.spec.page_size_bytes for g in d.groups} == {544 * 2048}


def test_an_mla_hybrid_aligns_its_block_to_128() -> None:
    from reference.derive import hybrid_block_size

    case = CASES["kimi-k3-kda-mla-b64"]
    assert case.block_size == 64 and hybrid_block_size(case) == (128, 128 * 576 * 2)
    # The same state beside GQA attention keeps its block: only MLA models align to 128.
    assert hybrid_block_size(CASES["kimi-k3-kda-hybrid"])[0] == 64


def test_align_mode_gives_the_state_the_attention_block() -> None:
    case = CASES["mamba-hybrid-align"].with_(mamba_block_size=4096)
    (state,) = [g for g in derive(case).groups if g.spec.kind.name == "MAMBA"]
    assert state.spec.block_size == case.block_size



# --- Qwen4-exp: Gated DeltaNet layers and a PLE short conv, two state layouts of one model ----------------


def _qwen4_exp(ple: StateMixer, **case: object) -> CaseConfig:
    gdn = StateMixer("gated_delta_net", num_heads=4, head_dim=32, num_k_heads=2, head_k_dim=32)
    layers = uniform_layers(1, num_kv_heads=2, head_size=64) + (
        LayerConfig("model.layers.1.linear_attn", kind="mamba", backend="GDN_ATTN", mixer=gdn),
        LayerConfig("model.layers.1.ple", kind="mamba", backend="PLE_SHORT_CONV_ATTN", mixer=ple),
    )
    return CaseConfig("qwen4", layers, **case)  # type: ignore[arg-type]


@pytest.mark.parametrize(("ple", "tp", "shapes"), [
    # One conv state of (kernel - 1) x ngram_size inputs over hidden_size x hc_count channels.
    (StateMixer("qwen4_exp_ple", hidden_size=512, hc_count=4, ngram_size=3), 1, ((9, 2048),)),
    (StateMixer("qwen4_exp_ple", hidden_size=64, hc_count=2, ngram_size=2, conv_kernel=3), 1, ((4, 128),)),
    # Replicated, not sharded: every TP rank holds the whole state.
    (StateMixer("qwen4_exp_ple", hidden_size=512, hc_count=4, ngram_size=3), 4, ((9, 2048),)),
])
def test_the_ple_conv_state_is_dilated_and_tp_replicated(ple: StateMixer, tp: int, shapes: tuple) -> None:
    assert state_shapes(ple, tp) == shapes
    assert state_dtypes(ple, "bfloat16", "auto", "float32") == ("bfloat16",)  # no SSM state to take float32
    assert state_dtypes(ple, "bfloat16", "float32", "auto") == ("float32",)
    case = _qwen4_exp(ple, tensor_parallel_size=tp if tp <= 2 else 2)
    spec = raw_spec(case, case.layers[-1], bk.get_backend("PLE_SHORT_CONV_ATTN"))
    assert spec.tp_replicated and not raw_spec(case, case.layers[1], bk.get_backend("GDN_ATTN")).tp_replicated


def test_the_larger_of_qwen4_exps_two_states_sets_the_block() -> None:
    """get_mamba_specs_from_config reports both states; the negotiation takes the larger page (here the PLE's: the
    checkpoint's 2048 x 4 channels, 9 inputs), against the model's own attention (the QSA layer's 2 x 256 GQA page,
    not its indexer's ring, which registers first), and pads both states to the attention page."""
    from reference.derive import hybrid_block_size

    case = CASES["qwen4-exp-gdn-ple-b64"]
    ple_page, attention_per_token = 9 * 8192 * 2, 2 * 256 * 2 * 2
    assert ple_page > 9728 and ple_page > 64 * attention_per_token
    assert hybrid_block_size(case) == (128, 128 * attention_per_token)
    d = derive(case)
    states = [g for g in d.groups if g.spec.kind.name == "MAMBA" or "mamba" in str(g.spec)]
    assert {g.spec.page_size_bytes for g in states} == {128 * attention_per_token}
    tp2 = CASES["qwen4-exp-gdn-ple-tp2"]  # the GDN state halves, the PLE's does not; one KV head a rank
    assert hybrid_block_size(tp2) == (192, 192 * attention_per_token // 2)


def test_a_whole_state_and_a_sharded_one_are_never_one_bucket() -> None:
    """MambaSpec.is_uniform_with_collection compares tp_replicated: with equal (padded) pages the GDN layers and the
    PLE conv still pack as two buckets, the GDN layers' groups first (vLLM orders them so)."""
    d = derive(CASES["qwen4-exp-gdn-ple-b64"])
    names = [g.layer_names for g in d.groups]
    assert names[:3] == [("model.layers.0.linear_attn",), ("model.layers.1.linear_attn",), ("model.layers.0.ple",)]


def test_qwen4_exps_mixers_are_a_pair_and_the_ple_never_alone() -> None:
    ple = StateMixer("qwen4_exp_ple", hidden_size=64, hc_count=4, ngram_size=3)
    assert [l.mixer.kind for l in _qwen4_exp(ple).layers if l.mixer] == ["gated_delta_net", "qwen4_exp_ple"]
    alone = uniform_layers(1, num_kv_heads=2, head_size=64) + (
        LayerConfig("model.layers.1.ple", kind="mamba", backend="PLE_SHORT_CONV_ATTN", mixer=ple),)
    with pytest.raises(ConfigError, match="a 'qwen4_exp_ple' mixer needs 'gated_delta_net' mixer layers beside it "
                                          r"\(its model, Qwen4ExpForCausalLM, reports both states\)"):
        CaseConfig("ple-alone", alone)
    kda = StateMixer("glm5next_kda", num_heads=4, head_dim=32)
    with pytest.raises(ConfigError, match=r"built as \['glm5next_kda', 'qwen4_exp_ple'\].*one of the pairs "
                                          r"gated_delta_net \+ qwen4_exp_ple \(Qwen4ExpForCausalLM\)"):
        CaseConfig("kda-and-ple", alone + (LayerConfig("model.layers.2.linear_attn", kind="mamba", backend="GDN_ATTN",
                                                       mixer=kda),))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.update(num_heads=4), "mixer 'qwen4_exp_ple': num_heads 4 is not one of its fields"),
    (lambda m: m.pop("hc_count"), "mixer 'qwen4_exp_ple' needs hc_count"),
    (lambda m: m.update(hidden_size=0), "mixer hidden_size 0 must be a positive integer"),
    (lambda m: m.update(ngram_size="3"), "mixer ngram_size '3' must be a positive integer"),
])
def test_bad_ple_input_is_one_line_naming_the_value(change, message: str) -> None:
    data = json.loads(_qwen4_exp(StateMixer("qwen4_exp_ple", hidden_size=64, hc_count=4, ngram_size=3)).to_json())
    change(data["layers"][-1]["mixer"])
    with pytest.raises(ConfigError) as info:
        CaseConfig.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_ngram_size_below_two_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(StartupError, match="ngram_size must be >= 2, got 1") as info:
        derive(_qwen4_exp(StateMixer("qwen4_exp_ple", hidden_size=64, hc_count=4, ngram_size=1)))
    assert info.value.where == "Qwen4ExpNGramEmbedding.__init__"


def test_a_ple_wider_than_the_mixer_bound_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"hidden_size 32768 x hc_count 4 = 131072 channels; expected at most 65536"):
        StateMixer("qwen4_exp_ple", hidden_size=32768, hc_count=4, ngram_size=3)
    with pytest.raises(ConfigError, match=r"its conv state \(\(conv_kernel - 1\) x ngram_size = 4294836225 inputs of 2\)"):
        StateMixer("qwen4_exp_ple", hidden_size=2, hc_count=1, ngram_size=65535, conv_kernel=65536)
