"""A vLLM that lacks what the drivers import: one line, exit 5, the connector not blamed."""

from __future__ import annotations

import pytest

from gpu_impl import vllm_api


def test_the_installed_vllm_provides_everything_its_drivers_import() -> None:
    """The 0.33.0-API drivers run here; the generation-1 driver does not (its API is gone)."""
    for driver in ("layout", "nixl", "mooncake"):
        assert vllm_api.missing_api(driver) == [], driver
    assert "vllm.v1.core.kv_cache_utils.get_kv_cache_groups" in vllm_api.missing_api("gen1")


@pytest.fixture
def undrivable(monkeypatch, tmp_path):
    monkeypatch.setenv("KVCONFORM_VLLM_LOG", str(tmp_path / "vllm.log"))
    monkeypatch.setattr(vllm_api, "missing_api", lambda driver="layout": ["vllm.v1.core.kv_cache_planning"])


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--case", "flashinfer-b128-k64"],
        ["check", "--connector", "gpu_impl.connectors.nixl:NixlAdapter", "--case", "flashinfer-b128-k64"],
        ["check", "--connector", "gpu_impl.connectors.mooncake:MooncakeAdapter", "--case", "flashinfer-b128-k64"],
    ],
    ids=["run", "check-nixl", "check-mooncake"],
)
def test_an_undrivable_vllm_is_nothing_ran_in_one_line(undrivable, argv, capsys) -> None:
    from conformance.cli import main

    assert main(argv) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing ran" in err[0] and "vllm.v1.core.kv_cache_planning" in err[0], err
