"""``suites/kv_cache_kinds.py`` against the installed vLLM: the table lists exactly the KV cache
spec classes and the layer classes with their own ``get_kv_cache_spec`` that vLLM ships (read
from its source, nothing imported), and a driven spec class is what the driver observes for its
named case (the group spec class vLLM built)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from suites.kv_cache_kinds import INVENTORY, INVENTORY_RELEASE
from suites.named_cases import CASES

_LAYER_TREES = ("models", "model_executor", "v1/attention")
"""Where layer classes live; the runners' and workers' own ``get_kv_cache_spec`` (collecting the
layers' specs) are not layers."""


def _vllm_root() -> Path:
    import vllm

    return Path(vllm.__file__).parent


@pytest.fixture(scope="module")
def installed_release() -> str:
    import vllm

    version = vllm.__version__
    if not version.startswith(INVENTORY_RELEASE):
        pytest.skip(f"the table is read off vLLM {INVENTORY_RELEASE}; vLLM {version} is installed")
    return version


def _classes_in(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]


def test_the_table_lists_every_layer_class_with_its_own_get_kv_cache_spec(installed_release: str) -> None:
    root = _vllm_root()
    found = set()
    for tree in _LAYER_TREES:
        for path in sorted((root / tree).rglob("*.py")):
            for cls in _classes_in(path):
                if any(isinstance(b, ast.FunctionDef) and b.name == "get_kv_cache_spec" for b in cls.body):
                    found.add((path.relative_to(root).as_posix(), cls.name))
    listed = {(c.path, c.name) for c in INVENTORY if c.role == "layer"}
    assert found - listed == set(), f"vLLM {installed_release} layer classes the table does not list"
    assert listed - found == set(), f"rows vLLM {installed_release} no longer has"


def test_the_table_lists_every_spec_class(installed_release: str) -> None:
    path = _vllm_root() / "v1" / "kv_cache_interface.py"
    classes = {cls.name: {ast.unparse(b) for b in cls.bases} for cls in _classes_in(path)}
    # KVCacheSpec and everything that derives from it, transitively.
    specs = {"KVCacheSpec"}
    grew = True
    while grew:
        more = {name for name, bases in classes.items() if bases & specs} - specs
        specs |= more
        grew = bool(more)
    listed = {c.name for c in INVENTORY if c.role == "spec"}
    assert specs == listed, (sorted(specs - listed), sorted(listed - specs))


@pytest.mark.parametrize(
    "row",
    [c for c in INVENTORY if c.role == "spec" and c.driven != "no" and c.name.endswith("Spec")],
    ids=lambda c: c.name,
)
def test_a_driven_spec_class_is_what_vllm_builds_for_its_named_case(row, installed_release: str) -> None:
    from gpu_impl.vllm_cpu.planning import observe

    observation = observe(CASES[row.named_case], "mrv1")
    if observation.error is not None:
        assert row.name == "SlidingWindowMLASpec", observation.error  # the one row whose case is a refusal
        assert "sliding_window" in observation.error
        return
    if row.name == "EncoderOnlyAttentionSpec":
        # The runners build it themselves, for the layers' metadata builders (MRv1 appends it to its own copy
        # of the config): no KV cache group is planned, every encoder-only layer has a builder.
        assert observation.groups == () and observation.tensors == (), observation.groups
        layers = {l.name for l in CASES[row.named_case].layers if l.kind == "encoder_only"}
        assert set(observation.builder_kernel_block_sizes or {}) == layers, observation.builder_kernel_block_sizes
        return
    # The group's class, or (in a UniformTypeKVCacheSpecs group) one of its layers' own.
    built = {g.spec_type for g in observation.groups} | {t for g in observation.groups for t in g.layer_spec_types}
    assert row.name in built, sorted(built)


def test_the_findings_repro_shows_sliding_window_mla_promotion_raising() -> None:
    """docs/findings/repro_swa_mla_promotion_bounded_replay.py, as a reader runs it: exit 1 with vLLM's
    TypeError (``bounded_replay`` passed to ``MLAAttentionSpec`` when the hybrid manager is off). Once vLLM
    drops the field in the promotion this fails: then the finding is fixed and DeepSeek V4's SWA cache can
    be promoted."""
    import subprocess
    import sys
    from pathlib import Path

    repro = Path(__file__).resolve().parents[2] / "docs" / "findings" / "repro_swa_mla_promotion_bounded_replay.py"
    done = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "unexpected keyword argument 'bounded_replay'" in done.stdout, done.stdout


def test_the_findings_repro_shows_deepseek_v4_planning_dividing_by_zero() -> None:
    """docs/findings/repro_dsv4_zero_byte_stride_alignment.py, as a reader runs it: exit 1 with vLLM's
    ZeroDivisionError (an HCA cache's 0-byte kernel-block stride alignment at --block-size 48). Once vLLM refuses
    such a block size instead, this fails: update the finding and the expectation dsv4-zero-byte-stride-alignment."""
    import subprocess
    import sys
    from pathlib import Path

    repro = Path(__file__).resolve().parents[2] / "docs" / "findings" / "repro_dsv4_zero_byte_stride_alignment.py"
    done = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "raised ZeroDivisionError" in done.stdout, done.stdout
