"""Run ONE (scenario, runner) in this process: the real ``vllm.LLM`` on a CUDA GPU.

    python -m gpu_impl.cuda.run_one RUN_SPEC.json REPORT.json

``RUN_SPEC.json`` is ``gpu_impl.cuda.scenarios.build_run_spec``'s output. This process
sets the environment (``VLLM_USE_V2_MODEL_RUNNER``, ``VLLM_KV_CACHE_LAYOUT``, offline,
in-process engine core) before importing vLLM, writes the tiny model directories,
starts ``vllm.LLM(load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
kv_transfer_config=<CheckingConnector>, ...)``, generates a few tokens for token-id
prompts, shuts the engine down and writes the report: the spec, timings, outputs and
what the connector recorded (``worker``: registered tensors + data checks;
``scheduler``: block ids). The report is written before the engine starts and after
every stage, so a kill leaves the stage it reached. Exit status: 0 when the engine ran
(whatever the checks found), 1 when it failed (``error`` in the report), 4 on bad usage.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_impl.tiny_llm import shutdown_engine_core

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True, default=repr))
    os.replace(tmp, path)


def prepare_env(spec: dict[str, Any]) -> dict[str, str]:
    """The environment for this run (set before vLLM is imported); returns what was set."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The engine core in this process: one process to time out, and the worker-side
        # connector writes its record from here.
        "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
    }
    env.update({k: str(v) for k, v in spec.get("env", {}).items()})
    if "VLLM_KV_CACHE_LAYOUT" not in spec.get("env", {}):
        os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
    os.environ.update(env)
    # The engine imports the connector by module path.
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return env


def engine_kwargs(spec: dict[str, Any], workdir: Path, record_dir: Path) -> dict[str, Any]:
    """``LLM(**kwargs)`` for the spec: model dirs written under ``workdir``."""
    from gpu_impl.cuda.models import write_model_dir

    kwargs: dict[str, Any] = dict(spec["engine"])
    kwargs["model"] = str(write_model_dir(workdir / "target", spec["models"]["target"]))
    if spec.get("speculative"):
        draft_dir = write_model_dir(workdir / "draft", spec["models"]["draft"])
        kwargs["speculative_config"] = dict(spec["speculative"], model=str(draft_dir))
    extra = {
        "record_dir": str(record_dir),
        "record_tag": spec["run_id"],
        "check_case_name": spec["case"].get("name"),
        "check_runner": spec["runner"],
        **spec.get("check", {}),
    }
    kwargs["kv_transfer_config"] = {
        "kv_connector": spec["connector"]["class"],
        "kv_connector_module_path": spec["connector"]["module"],
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    return kwargs


def read_records(record_dir: Path) -> dict[str, Any]:
    """What the connector wrote: ``worker``/``scheduler`` (first of each) and all of them."""
    out: dict[str, Any] = {"workers": [], "schedulers": []}
    if record_dir.is_dir():
        for path in sorted(record_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                out.setdefault("record_errors", []).append(f"{path.name}: {exc}")
                continue
            out.setdefault(data.get("role", "unknown") + "s", []).append(data)
    out["worker"] = out["workers"][0] if out["workers"] else None
    out["scheduler"] = out["schedulers"][0] if out["schedulers"] else None
    return out


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as exc:  # noqa: BLE001
        info["vllm"] = f"? ({exc})"
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    return info


def run(spec: dict[str, Any], report_path: Path, workdir: Path) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"run_id": spec.get("run_id"), "spec": spec, "ok": False, "stage": "env", "timings": {}}
    report["env_set"] = prepare_env(spec)
    _write(report_path, report)
    record_dir = workdir / "records"
    record_dir.mkdir(parents=True, exist_ok=True)
    llm = None
    try:
        report["stage"] = "import"
        from vllm import LLM, SamplingParams

        report["timings"]["import_s"] = round(time.monotonic() - t0, 2)
        kwargs = engine_kwargs(spec, workdir, record_dir)
        report["engine_kwargs"] = {k: v for k, v in kwargs.items() if k != "kv_transfer_config"}
        report["stage"] = "start"
        _write(report_path, report)
        t1 = time.monotonic()
        llm = LLM(**kwargs)
        report["timings"]["start_s"] = round(time.monotonic() - t1, 2)
        # Only now: initializing CUDA here first would make a multiprocess engine core spawn.
        report["device"] = device_info()
        report["stage"] = "generate"
        _write(report_path, report)
        t2 = time.monotonic()
        params = SamplingParams(max_tokens=int(spec["max_tokens"]), temperature=0.0, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params, use_tqdm=False)
        report["timings"]["generate_s"] = round(time.monotonic() - t2, 2)
        report["outputs"] = [
            {"prompt_len": len(o.prompt_token_ids or []), "token_ids": list(o.outputs[0].token_ids)} for o in outputs
        ]
        report["ok"] = True
        report["stage"] = "done"
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        report["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
        report["traceback"] = traceback.format_exc()[-10000:]
    finally:
        if "device" not in report:
            try:
                report["device"] = device_info()
            except Exception as exc:  # noqa: BLE001
                report["device"] = {"error": f"{type(exc).__name__}: {exc}"}
        report.update(read_records(record_dir))
        report["timings"]["total_s"] = round(time.monotonic() - t0, 2)
        # Before the shutdown: a hang there must not lose what the run recorded.
        _write(report_path, report)
        if llm is not None:
            t3 = time.monotonic()
            shutdown_engine_core(llm)  # the process exits right after
            report["timings"]["shutdown_s"] = round(time.monotonic() - t3, 2)
            _write(report_path, report)
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m gpu_impl.cuda.run_one RUN_SPEC.json REPORT.json", file=sys.stderr)
        return 4
    spec = json.loads(Path(argv[0]).read_text())
    report_path = Path(argv[1])
    report_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"kvconform-gpu-{spec.get('run_id', 'run')}-") as tmp:
        return run(spec, report_path, Path(tmp))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM may leave non-daemon threads behind after shutdown: do not wait for them.
    os._exit(code)
