"""vLLM 0.33.0's MoRIIO connector worker driven on CPU (gpu_impl.connectors.moriio): its real
registration (shape-pattern inference, one shared RDMA region), handshake and READ
planning, with mori.io, RDMA and ZMQ faked.

MoRIIO registers the pool as one page-aligned region, which on ROCm vLLM pads and aligns
for it; the byte-level checks here use a pool allocated that way (``_rocm_pool``). A plain
CPU pool is unsupported, and the geometry refusals come before that point."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.kvconform_vllm,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (validate_registration builds CPU tensors)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm 0.33.0 importable (pip install 'kvconform[vllm]')"),
    pytest.mark.skipif(importlib.util.find_spec("msgpack") is None,
                       reason="vLLM's moriio_connector.py imports msgpack (pip install msgpack)"),
]

MORIIO = "gpu_impl.connectors.moriio:MoRIIOAdapter"
PAGE = 4096
ACCEPTED = ["nixl-dense-fa", "dense-fa-b128-lhbnc", "dense-fa-b128-blhnc", "mla-gqa-draft-b64", "swa-hybrid-padded",
            "fp8-fa-b16", "cpu-attn-b32"]


def _rocm_pool(derivation, misalign: int = 0):
    """The reference's views in a pool as ROCm's ``allocate_kv_cache`` gives MoRIIO: size
    rounded up to whole pages, storage starting on a page (``misalign`` bytes off it)."""
    import numpy as np
    import torch

    views = derivation.registered
    nbytes = -(-next(iter(views.values())).storage_nbytes // PAGE) * PAGE
    raw = np.zeros(nbytes + 2 * PAGE, dtype=np.int8)
    start = (-raw.ctypes.data) % PAGE + misalign
    pool = torch.from_numpy(raw[start:start + nbytes])  # the storage starts at this address
    caches = {}
    for name, v in views.items():
        dtype = getattr(torch, v.dtype)
        typed = pool if dtype == torch.int8 else pool.view(dtype)
        caches[name] = typed.as_strided(v.shape, v.stride, v.storage_offset)
    return raw, pool, caches


def _register(case, runner: str, **pool):
    from conformance.connectors.validate import make_context
    from gpu_impl.connectors.moriio import MoRIIOAdapter
    from reference.derive import derive

    d = derive(case, runner)
    raw, base_pool, caches = _rocm_pool(d, **pool)
    adapter = MoRIIOAdapter(make_context(d))
    adapter.register(caches)
    return d, (raw, base_pool), caches, adapter


def _check_bytes(d, pool, caches, adapter) -> list[str]:
    """Every (layer, block): the reads MoRIIO plans are the block's bytes; and a round trip."""
    from conformance.connectors.roundtrip import check_round_trip
    from reference import intervals

    base = pool.data_ptr()
    bad = []
    for layer in d.registered:
        for b in range(d.num_blocks):
            got = intervals.merge((a, a + n) for a, n in adapter.descriptors(layer, b))
            want = intervals.merge((base + a, base + z) for a, z in d.block_bytes(layer, b).page.runs())
            if got != want:
                bad.append(f"{layer} block {b}: {[(a - base, z - base) for a, z in got][:3]} != {[(a - base, z - base) for a, z in want][:3]}")
    trip = check_round_trip(adapter, d, caches, 1, 2)
    return bad + [f.line() for f in trip.findings] + ([] if trip.status == "pass" else [f"round trip {trip.status}: {trip.detail}"])


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_accepted_layouts_move_their_blocks(runner):
    """On a ROCm-shaped pool the READ plan of each logical block is exactly its bytes,
    whatever the layout (LBHNC/LBNHC, per-head LHBNC, packed BLHNC rows, MLA + GQA draft,
    padded SWA pages, fp8, CPU_ATTN planes), and a block round-trips through the RDMA reads."""
    from suites.named_cases import get_case

    for name in ACCEPTED:
        d, (_, pool), caches, adapter = _register(get_case(name), runner)
        assert adapter.kernel_block_size == d.kernel_block_sizes[0], name
        assert _check_bytes(d, pool, caches, adapter) == [], name
    # One region over the whole pool, registered once (shared backing), every layer's session into it.
    d, (_, pool), _, adapter = _register(get_case("dense-fa-b128-blhnc"), runner)
    (region,) = adapter.engine.registered
    assert (region.data, region.size) == (pool.data_ptr(), pool.numel())
    # LHBNC: one read per (head, block) segment; per-head segments are 128 tokens x 256 x 2 bytes.
    _, _, _, adapter = _register(get_case("dense-fa-b128-lhbnc"), runner)
    reads = adapter.descriptors("model.layers.0.self_attn.attn", 1)
    assert len(reads) == 8 and {n for _, n in reads} == {128 * 256 * 2}


def test_kernel_split_and_sd_conv_state_are_refused(monkeypatch, request):
    """H4: the standardized 4-D path wants shape[2] == the spec's block (num_states), so a
    kernel-split view is refused at registration, naming the layer and its shape; a Mamba
    model needs the DS conv-state layout (vLLM's default is SD)."""
    from suites.named_cases import get_case
    from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_common import MoRIIOError
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

    # The default layout, whatever an earlier caller of the per-process cache saw.
    monkeypatch.delenv("VLLM_SSM_CONV_STATE_LAYOUT", raising=False)
    get_conv_state_layout.cache_clear()
    request.addfinalizer(get_conv_state_layout.cache_clear)

    for name in ("flashinfer-b128-k64", "flashinfer-b128-k64-hnd"):
        for runner in ("mrv1", "mrv2"):
            with pytest.raises(ValueError, match=r"^Unsupported MoRIIO K/V cache shape for layer "
                                                 r"model\.layers\.0\.self_attn\.attn: \(8, 8, 64, 256\)$") as info:
                _register(get_case(name), runner)
            assert info.traceback[-1].path.name == "moriio_layout.py"
    with pytest.raises(MoRIIOError, match="requires the DS .* VLLM_SSM_CONV_STATE_LAYOUT=DS"):
        _register(get_case("mamba-hybrid"), "mrv1")


def test_ds_hybrid_reads_conv_projections_and_ssm(monkeypatch, request):
    """A Mamba-2 hybrid in the DS layout: each state slot is read as the conv state's three
    sub-projections (x, B, C, split by derive_mamba_conv_split) and the SSM state."""
    from reference.config import CaseConfig, LayerConfig, uniform_layers
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

    # The deployment's switch; vLLM caches the layout per process (functools.lru_cache), so
    # the cache is cleared now and again after the test (the env is restored by then).
    monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", "DS")
    get_conv_state_layout.cache_clear()
    request.addfinalizer(get_conv_state_layout.cache_clear)
    # conv (dim, rows) = (160, 3): x = 4 heads x 32 = 128 columns, B = C = 16; ssm (4, 32, 16).
    mixers = tuple(LayerConfig(f"model.layers.{i}.mixer", kind="mamba", backend="MAMBA2_ATTN",
                               mamba_shapes=((160, 3), (4, 32, 16))) for i in (2, 3))
    case = CaseConfig("mamba-hybrid-ds", uniform_layers(2, num_kv_heads=2, head_size=64) + mixers, block_size=16, num_blocks=16)
    for runner in ("mrv1", "mrv2"):
        d, (_, pool), caches, adapter = _register(case, runner)
        assert _check_bytes(d, pool, caches, adapter) == []
        reads = adapter.descriptors("model.layers.2.mixer", 5)
        assert [n for _, n in reads] == [128 * 3 * 2, 16 * 3 * 2, 16 * 3 * 2, 4 * 32 * 16 * 2]


def test_plain_cpu_pool_is_unsupported_after_the_geometry_checks():
    """A pool off a page: the shared region cannot be formed (unsupported, not the
    connector's refusal); vLLM's own tensors in validate_registration: the kernel split is
    still reported as MoRIIO's refusal, with the raising line."""
    from conformance.connectors import validate_registration
    from gpu_impl.connectors import Undrivable
    from suites.named_cases import get_case

    with pytest.raises(Undrivable, match=r"starts 64 bytes into a 4096-byte page.*page-aligned RDMA region"):
        _register(get_case("nixl-dense-fa"), "mrv1", misalign=64)
    report = validate_registration(MORIIO, cases=["flashinfer-b128-k64"], runners=("mrv1", "mrv2"))
    assert [r.status for r in report.results] == ["refusal", "refusal"], report.format()
    assert all("moriio/moriio_layout.py:318" in r.detail for r in report.results), report.format()


def test_moriio_on_the_tensors_vllm_registers():
    """Through the runners' own registration (the pool page-aligned, as a device allocator's
    large allocations are): descriptors and the round trip through MoRIIO's own READ pass on
    a dense and a per-head-segmented case, and the kernel split is refused at registration."""
    from conformance.connectors import validate_registration

    report = validate_registration(MORIIO, cases=["nixl-dense-fa", "dense-fa-b128-lhbnc", "flashinfer-b128-k64"], runners=("mrv1",))
    got = {r.case: r for r in report.results}
    for case in ("nixl-dense-fa", "dense-fa-b128-lhbnc"):
        assert got[case].status == "pass" and got[case].round_trip == "pass" and got[case].tensors == "vllm", report.format()
    assert got["flashinfer-b128-k64"].status == "refusal", report.format()
    assert "moriio_layout.py" in got["flashinfer-b128-k64"].detail
