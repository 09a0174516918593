"""The installed release's backend classes against ``reference.gen1``'s facts for that
release: every generation-1 backend the reference models that loads on this machine must
give the shape, NHD/HND stride orders and kernel block sizes the reference says it gives
at the installed version (``gpu_impl.vllm_cpu.backend_facts`` reads them off the classes).
A release whose facts changed fails here, naming the backend and the fact, before any
case is compared."""

from __future__ import annotations

import pytest

from reference import backends as bk
from reference.config import CaseConfig, LayerConfig
from reference.errors import NotModeledError, StartupError
from reference.gen1 import gen1_kernel_block_sizes, gen1_kv_cache_shape, gen1_spec, gen1_stride_order
from installed_release import installed_version

MODELED = tuple(name for name, info in bk.BACKENDS.items() if info.gen1 is not None)


@pytest.mark.parametrize("backend", MODELED)
def test_backend_class_gives_the_reference_facts_of_this_release(backend: str) -> None:
    __tracebackhide__ = True
    from gpu_impl.vllm_cpu.backend_facts import PROBE, backend_facts
    from gpu_impl.vllm_cpu.backends import size_repr

    mla = "MLA" in backend
    facts = backend_facts(backend, mla=mla)
    if facts.problem is not None and facts.shape is None and not facts.stride_order:
        pytest.skip(f"{backend} does not load on this machine: {facts.problem}")
    version = installed_version()
    heads, head_size = (1, PROBE["mla_head_size"]) if mla else (PROBE["num_kv_heads"], PROBE["head_size"])
    try:
        want_shape = gen1_kv_cache_shape(backend, PROBE["num_blocks"], PROBE["block_size"], heads, head_size,
                                           vllm_version=version)
    except NotModeledError as exc:
        pytest.skip(f"reference.gen1 has no facts for {backend} at vLLM {version}: {exc}")
    except StartupError:
        want_shape = None
    assert facts.shape == want_shape, f"vLLM {version} {backend}.get_kv_cache_shape: {facts.shape} (reference: {want_shape})"
    for layout in ("NHD", "HND"):
        got = facts.stride_order[layout] or tuple(range(len(want_shape or facts.shape or ())))  # no order: identity
        want = gen1_stride_order(backend, layout, vllm_version=version)
        assert got == want, f"vLLM {version} {backend} stride order under {layout}: {got} (reference: {want})"
    if facts.kernel_block_sizes is not None:
        case = CaseConfig(name="facts", layers=(LayerConfig("l0", kind="mla" if mla else "full", backend=backend,
                                                            num_kv_heads=heads, head_size=head_size),),
                          block_size=PROBE["block_size"], generation=1, vllm_version=version)
        want_kernel = tuple(str(size_repr(s)) for s in gen1_kernel_block_sizes(backend, gen1_spec(case, case.layers[0], backend),
                                                                          case.capability, version))
        assert facts.kernel_block_sizes == want_kernel, (
            f"vLLM {version} {backend}.get_supported_kernel_block_sizes: {facts.kernel_block_sizes} (reference: {want_kernel})")
