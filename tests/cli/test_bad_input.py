"""Bad input at the CLI's boundary: one line naming the value and what was expected, exit 4,
before anything runs (a table, one row per input; run as a user would, in a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli import kvconform

TYPO_CASE = {"name": "typo", "block_size": 16, "num_blocks": 4,
             "layers": [{"name": "model.layers.0.self_attn.attn", "backend": "FOO", "num_kv_heads": 8, "head_size": 128}]}
BAD_WINDOW = {"name": "bad-window", "block_size": 16, "num_blocks": 4,
              "layers": [{"name": "model.layers.0.self_attn.attn", "kind": "sliding_window", "sliding_window": 0}]}


def _file(tmp_path: Path, content: object) -> str:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(content))
    return str(path)


ROWS = [
    # (id, args (CASE: a case file with `case`), the words the one line must hold)
    ("invalid-case-beside-a-good-one", ["run", "--case", "flashinfer-b128-k64", "--case", "CASE"], TYPO_CASE,
     ["case 'typo' is invalid", "unknown attention backend 'FOO'"]),
    ("invalid-case-reference-only", ["run", "--reference-only", "--case", "CASE"], TYPO_CASE, ["'FOO'"]),
    ("schedules-negative", ["run", "--schedules", "-1"], None, ["'-1' is not a number of schedules per case from 0 to 100"]),
    ("schedules-not-a-number", ["run", "--schedules", "two"], None, ["'two' is not a number of schedules"]),
    ("schedules-unbounded", ["run", "--schedules", "1000"], None, ["'1000' is not a number of schedules"]),
    ("zero-sliding-window", ["run", "--reference-only", "--case", "CASE"], BAD_WINDOW, ["sliding"]),
    ("explain-negative-block", ["explain", "flashinfer-b16", "--block", "-1"], None,
     ["--block", "'-1' is not a logical block id (an integer from 0 to"]),
    ("explain-block-past-the-pool", ["explain", "flashinfer-b16", "--block", "99999"], None,
     ["--block 99999 is outside case flashinfer-b16's pool: logical block ids are 0 to 7"]),
    ("explain-block-not-a-number", ["explain", "flashinfer-b16", "--block", "1e3"], None, ["'1e3' is not a logical block id"]),
    ("inline-case-invalid", ["run", "--reference-only", "--case", json.dumps(TYPO_CASE)], None,
     ["case 'typo' is invalid", "unknown attention backend 'FOO'"]),
    ("case-name-too-long-for-a-file", ["run", "--reference-only", "--case", "y" * 400], None, ["unknown case 'yyy"]),
    ("replay-report-name-too-long-for-a-file", ["replay", "x" * 400], None,
     ["report 'xxx", "... (400 characters)' cannot be a file"]),
    ("workers-unbounded", ["run", "--reference-only", "--workers", "100000"], None,
     ["'100000' is not a number of workers from 1 to 64 or 'auto'"]),
    ("workers-zero", ["run", "--reference-only", "--workers", "0"], None, ["'0' is not a number of workers"]),
    ("seed-negative", ["run", "--reference-only", "--seed", "-4"], None, ["--seed", "'-4' is not a seed"]),
    ("seed-past-64-bits", ["run", "--reference-only", "--seed", str(2**64)], None, ["is not a seed (an integer from 0 to"]),
]


@pytest.mark.parametrize(("args", "case", "words"), [pytest.param(a, c, w, id=i) for i, a, c, w in ROWS])
def test_bad_input_is_one_line_and_exit_4(tmp_path: Path, args: list[str], case: object, words: list[str]) -> None:
    args = [_file(tmp_path, case) if a == "CASE" else a for a in args]
    out = kvconform(*args)
    assert out.returncode == 4, (out.returncode, out.stdout[-1500:], out.stderr[-1500:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert " pass" not in out.stdout  # nothing ran before the refusal


MODULE_ROWS = [
    ("planning-malformed-json", "gpu_impl.vllm_cpu.planning", ['{"name": 1'], "malformed case JSON"),
    ("planning-unknown-runner", "gpu_impl.vllm_cpu.planning",
     ['{"name": "x", "layers": [{"name": "a"}]}', "mrv3"], "runner 'mrv3' is not one of mrv1, mrv2"),
    ("planning-missing-file", "gpu_impl.vllm_cpu.planning", ["@/nonexistent/case.json"], "No such file"),
    ("block-tables-malformed-json", "gpu_impl.vllm_cpu.block_tables", ["{bad"], "not JSON"),
]


@pytest.mark.parametrize(("module", "args", "words"), [pytest.param(m, a, w, id=i) for i, m, a, w in MODULE_ROWS])
def test_replay_entry_points_refuse_bad_input_in_one_line(module: str, args: list[str], words: str) -> None:
    """The `python -m` replay lines printed on failures: bad input is one line and exit 4."""
    import subprocess
    import sys

    from test_cli import ROOT

    out = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 4, (out.returncode, out.stderr[-1500:])
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in out.stderr, out.stderr


def _case(**fields: object) -> dict:
    layer = {"name": "model.layers.0.self_attn.attn"}
    layer.update(fields.pop("layer", {}))  # type: ignore[arg-type]
    return {"name": "bad", "block_size": 16, "num_blocks": 4, "layers": [layer], **fields}


FIELD_ROWS = [
    ("block-size-true", _case(block_size=True), "block size True"),
    ("block-size-huge", _case(block_size=10**12), "block size 1000000000000 must be an integer from 1 to 16777216"),
    ("max-model-len-zero", _case(max_model_len=0), "max_model_len 0"),
    ("num-blocks-huge", _case(num_blocks=10**15), "num_blocks 1000000000000000"),
    ("memory-negative", _case(num_blocks=None, kv_cache_memory_bytes=-5), "kv_cache_memory_bytes -5"),
    ("mamba-block-size-float", _case(mamba_block_size=1.5), "mamba_block_size 1.5"),
    ("case-name-empty", _case(name=""), "case name ''"),
    ("vllm-version-number", _case(vllm_version=3), "vllm_version 3"),
    ("layers-not-a-list", {"name": "bad", "layers": {"a": 1}}, "must be a list of layer objects"),
    ("layer-name-empty", _case(layer={"name": ""}), "layer name ''"),
    ("head-size-v-negative", _case(layer={"head_size_v": -1}), "head_size_v -1"),
    ("heads-bool", _case(layer={"num_kv_heads": True}), "num_kv_heads True"),
    ("sliding-window-text", _case(layer={"kind": "sliding_window", "sliding_window": "x"}), "sliding_window 'x'"),
    ("is-draft-text", _case(layer={"is_draft": "yes"}), "is_draft 'yes'"),
    ("mamba-shape-negative", _case(layer={"kind": "mamba", "backend": "MAMBA2_ATTN", "mamba_shapes": [[-1]]}),
     "mamba_shapes"),
    ("mamba-shape-huge", _case(layer={"kind": "mamba", "backend": "MAMBA2_ATTN", "mamba_shapes": [[2**20, 2**20]]}),
     "expected at most"),
    ("capability-bool", _case(capability=[True, 0]), "capability"),
    # The kinds of issue 24: what each needs, and what only one kind may carry.
    ("rswa-without-window", _case(layer={"kind": "rswa"}), "kind 'rswa' needs rswa_window > 0"),
    ("rswa-window-text", _case(layer={"kind": "rswa", "rswa_window": "x"}), "rswa_window 'x'"),
    ("rswa-window-on-full", _case(layer={"rswa_window": 64}), "rswa_window 64 is only for kind 'rswa'"),
    ("indexer-on-another-backend", _case(layer={"kind": "mla_indexer", "head_size": 132}),
     "kind 'mla_indexer' runs on DEEPSEEK_V32_INDEXER"),
    ("indexer-fp8", _case(layer={"kind": "mla_indexer", "backend": "DEEPSEEK_V32_INDEXER", "cache_dtype": "fp8"}),
     "cache_dtype 'fp8' must be 'auto'"),
    ("hidden-state-fp8", _case(layer={"kind": "hidden_state", "backend": "CACHE_ONLY_ATTN", "cache_dtype": "fp8"}),
     "kind 'hidden_state' cache_dtype 'fp8'"),
    ("ring-without-kpool", _case(layer={"kind": "circular_buffer", "backend": "KPOOL_TAIL"}),
     "kind 'circular_buffer' needs index_kpool >= 2"),
    ("ring-kpool-one", _case(layer={"kind": "circular_buffer", "backend": "KPOOL_TAIL", "index_kpool": 1}),
     "needs index_kpool >= 2 (Glm5NextTailCache asserts index_kpool > 1), got 1"),
    ("kpool-on-full", _case(layer={"index_kpool": 4}), "index_kpool 4 is only for kinds 'circular_buffer', 'mla_indexer', "
     "'qsa_compressed_key', 'qsa_key_state', 'dsv4_attention', 'dsv4_indexer', 'dsv4_compressor_state', not 'full'"),
    ("family-unknown", _case(layer={"family": "kimi_k4"}), "family 'kimi_k4' is not one of kimi_k3"),
    ("family-wrong-kind", _case(layer={"family": "kimi_k3"}), "family 'kimi_k3' builds kind(s) mla (MultiHeadLatentAttention), not 'full'"),
    ("family-own-backend", _case(layer={"family": "minimax_m3", "name": "model.layers.0.self_attn.attn"}),
     "family 'minimax_m3' runs on MINIMAX_M3_SPARSE (MiniMaxM3SparseAttention picks it), not 'FLASH_ATTN'"),
    ("family-needs-its-index-cache", _case(layer={"family": "minimax_m3", "backend": "MINIMAX_M3_SPARSE",
                                                  "name": "model.layers.0.self_attn.attn"}),
     "builds its indexer's key cache too: list a 'minimax_indexer' layer named 'model.layers.0.self_attn.attn.index_cache' right before it"),
    ("dsv4-plain-cache", _case(layer={"kind": "dsv4_swa", "backend": "DEEPSEEK_SPARSE_SWA", "num_kv_heads": 1,
                                      "head_size": 512, "sliding_window": 128}),
     "kind 'dsv4_swa' is modeled in the fp8_ds_mla format only (FlashMLA's); cache_dtype 'auto' must be 'fp8_ds_mla'"),
    ("dsv4-heads", _case(layer={"kind": "dsv4_swa", "backend": "DEEPSEEK_SPARSE_SWA", "num_kv_heads": 2,
                                "head_size": 512, "sliding_window": 128, "cache_dtype": "fp8_ds_mla"}),
     "stores one latent vector per state; num_kv_heads 2 must be 1"),
    ("dsv4-swa-no-window", _case(layer={"kind": "dsv4_swa", "backend": "DEEPSEEK_SPARSE_SWA", "num_kv_heads": 1,
                                        "head_size": 512, "cache_dtype": "fp8_ds_mla"}),
     "kind 'dsv4_swa' needs sliding_window > 0"),
    ("dsv4-ratio", _case(layer={"kind": "dsv4_attention", "backend": "FLASHMLA_SPARSE_DSV4", "num_kv_heads": 1,
                                "head_size": 512, "cache_dtype": "fp8_ds_mla", "index_kpool": 8}),
     "needs index_kpool, the compress ratio, one of 4, 128; got 8"),
    ("dsv4-indexer-ratio", _case(layer={"kind": "dsv4_indexer", "backend": "DEEPSEEK_V4_INDEXER", "num_kv_heads": 1,
                                        "head_size": 132, "cache_dtype": "fp8_ds_mla", "index_kpool": 128}),
     "belongs to the C4 layers only; index_kpool 128 must be 4"),
    ("dsv4-own-backend", _case(layer={"kind": "dsv4_compressor_state", "num_kv_heads": 1, "head_size": 1024,
                                      "cache_dtype": "fp8_ds_mla", "index_kpool": 128}),
     "kind 'dsv4_compressor_state' runs on CompressorBackend"),
    ("dsv41-ratio", _case(layer={"kind": "dsv4_attention", "family": "deepseek_v41", "backend": "FLASHMLA_SPARSE_DSV41",
                                 "num_kv_heads": 1, "head_size": 512, "cache_dtype": "fp8_ds_mla", "index_kpool": 4,
                                 "name": "model.layers.0.attn"}),
     "(DeepSeek V4.1) needs index_kpool, the layer's compress ratio, one of 1, 2; got 4"),
    ("dsv41-name", _case(layer={"kind": "dsv4_swa", "family": "deepseek_v41", "backend": "DEEPSEEK_SPARSE_SWA",
                                "num_kv_heads": 1, "head_size": 512, "cache_dtype": "fp8_ds_mla", "sliding_window": 128}),
     "(DeepSeek V4.1) is named as its decoder layer registers it, '{...}.layers.{i}.attn.swa_cache'"),
    ("dsv41-no-backend-named", _case(layer={"kind": "dsv4_swa", "family": "deepseek_v41", "backend": "DEEPSEEK_SPARSE_SWA",
                                            "num_kv_heads": 1, "head_size": 512, "cache_dtype": "fp8_ds_mla",
                                            "sliding_window": 128, "name": "model.layers.0.attn.swa_cache"}),
     "attention_backend None must be 'FLASHMLA_SPARSE_DSV41' for DeepSeek V4.1"),
    ("dsv41-indexer-alone", _case(attention_backend="FLASHMLA_SPARSE_DSV41",
                                  layer={"kind": "dsv4_indexer", "family": "deepseek_v41", "backend": "DEEPSEEK_V41_INDEXER",
                                         "num_kv_heads": 1, "head_size": 132, "cache_dtype": "fp8_ds_mla", "index_kpool": 1,
                                         "name": "model.layers.0.attn.indexer.k_cache"}),
     "DeepSeek V4.1's indexer keys and compressor rings belong to a kv source"),
    ("ring-on-another-backend", _case(layer={"kind": "circular_buffer", "index_kpool": 4}),
     "kind 'circular_buffer' runs on KPOOL_TAIL"),
    ("ring-fp8", _case(layer={"kind": "circular_buffer", "backend": "KPOOL_TAIL", "index_kpool": 4, "cache_dtype": "fp8"}),
     "kind 'circular_buffer' stores bf16"),
    ("step5-without-side-caches", _case(layer={"family": "step5", "backend": "STEP5_DSA", "head_size": 192}),
     "family 'step5' (Step5Attention with DSA) is named '{prefix}.attn' and builds its CSA side caches after it: list "
     "'step5_summary' 'model.layers.0.self_attn.attn.sparse_summary_cache' and 'step5_csa_ring'"),
    ("step5-summary-alone", _case(layer={"kind": "step5_summary", "backend": "STEP5_CSA_SUMMARY", "num_kv_heads": 1,
                                         "head_size": 256, "name": "model.layers.0.self_attn.attn.sparse_summary_cache"}),
     "kind 'step5_summary' is built by a Step5 DSA layer"),
    ("step5-summary-width", _case(layer={"kind": "step5_summary", "backend": "STEP5_CSA_SUMMARY", "num_kv_heads": 1,
                                         "head_size": 128}),
     "stores one 256-byte FP8 summary per eight tokens: num_kv_heads 1 must be 1, head_size 128 must be 256"),
    ("step5-ring-fp8", _case(layer={"kind": "step5_csa_ring", "backend": "STEP5_CSA_TAIL_RING", "num_kv_heads": 1,
                                    "head_size": 512, "cache_dtype": "fp8"}),
     "kind 'step5_csa_ring' keeps its own dtype and blocks: cache_dtype 'fp8' must be 'auto'"),
]


@pytest.mark.parametrize(("case", "words"), [pytest.param(c, w, id=i) for i, c, w in FIELD_ROWS])
def test_every_case_field_is_validated(tmp_path: Path, case: dict, words: str) -> None:
    """Through `explain` (no vLLM needed) and `run --reference-only`: one line, exit 4, bounded memory."""
    for command in (["explain"], ["run", "--reference-only", "--case"]):
        out = kvconform(*command, _file(tmp_path, case))
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 4 and len(lines) == 1 and words in lines[0], (command, out.returncode, out.stderr[-800:])


ADAPTERS = '''
import itertools, sys

class ExitsInRegister:
    def register(self, caches):
        sys.exit(0)
    def descriptors(self, layer, block):
        return []

class Endless:
    def register(self, caches):
        self.caches = caches
    def descriptors(self, layer, block):
        return ((0, 1) for _ in itertools.count())

class NegativeLength:
    def register(self, caches):
        self.caches = caches
    def descriptors(self, layer, block):
        return [(0, 16), (32, -8)]

class FloatLength:
    def register(self, caches):
        self.caches = caches
    def descriptors(self, layer, block):
        return [(0, 16.5)]
'''

CONNECTOR_ROWS = [
    # (id, module source, connector spec, exit code, words in the output)
    ("exits-at-import", "import sys\nsys.exit(0)\n", "exits_at_import:X", 4, "importing it raised SystemExit: 0"),
    ("syntax-error", "def (:\n", "syntax_error:X", 4, "importing it raised SyntaxError"),
    ("raises-at-import", "raise RuntimeError('boom')\n", "raises_at_import:X", 4, "importing it raised RuntimeError: boom"),
    ("exits-in-register", ADAPTERS, "adapters:ExitsInRegister", 1, "register raised SystemExit"),
    ("endless-descriptors", ADAPTERS, "adapters:Endless", 1, "more than 65536"),
    ("negative-length", ADAPTERS, "adapters:NegativeLength", 1, "length -8 in (32, -8)"),
    ("float-length", ADAPTERS, "adapters:FloatLength", 1, "length 16.5"),
]


@pytest.mark.parametrize(("source", "spec", "code", "words"),
                         [pytest.param(s, c, e, w, id=i) for i, s, c, e, w in CONNECTOR_ROWS])
def test_a_misbehaving_connector_adapter_is_reported(tmp_path: Path, source: str, spec: str, code: int,
                                                     words: str) -> None:
    """`kvconform check`: an adapter that fails on import is a usage error (exit 4); one that
    exits, loops or returns bad descriptors is a divergence (exit 1) with bounded memory."""
    import importlib.util
    import os

    if importlib.util.find_spec("torch") is None:
        pytest.skip("kvconform check builds CPU tensors: needs torch")
    (tmp_path / f"{spec.split(':')[0]}.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = kvconform("check", "--connector", spec, "--case", "flashinfer-b16", env=env)
    assert out.returncode == code, (out.returncode, out.stdout[-1500:], out.stderr[-1500:])
    assert words in (out.stderr if code == 4 else out.stdout), (out.stdout[-1500:], out.stderr[-800:])
    if code == 4:
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_largest_valid_case_is_explained_in_bounded_time_and_size(tmp_path: Path) -> None:
    """Bounds keep every command's memory bounded: the largest case the validators accept
    is explained (text and picture) in a few seconds, with a picture of a few kilobytes."""
    from reference.config import MAX_BLOCKS, MAX_HEADS, MAX_TOKENS

    case = {"name": "largest", "block_size": MAX_TOKENS, "num_blocks": MAX_BLOCKS,
            "layers": [{"name": "model.layers.0.self_attn.attn", "num_kv_heads": MAX_HEADS, "head_size": 256}]}
    page = tmp_path / "largest.html"
    out = kvconform("explain", _file(tmp_path, case), "--html", str(page))
    assert out.returncode == 0, out.stderr[-1500:]
    assert page.stat().st_size < 100_000


@pytest.mark.parametrize("args", [
    ["run", "--reference-only", "--case", "flashinfer-b16", "--json", "/nonexistent-dir/r.json"],
    ["report", "reports/vllm-0.33.0-cpu-named-cases.json", "--markdown", "/nonexistent-dir/r.md"],
    ["report", "reports/vllm-0.33.0-cpu-named-cases.json", "--html", "/"],
    ["check", "--connector", "conformance.connectors.examples:ReferenceAdapter", "--json", "/nonexistent-dir/c.json"],
], ids=["run-json", "report-markdown", "report-html-is-a-directory", "check-json"])
def test_an_unwritable_output_is_refused_before_work_starts(args: list[str]) -> None:
    out = kvconform(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 4 and len(lines) == 1, (out.returncode, out.stderr[-800:])
    assert "/nonexistent-dir" in lines[0] or "is a directory" in lines[0], lines[0]
    assert out.stdout == ""  # nothing ran


@pytest.mark.parametrize("version", ["", "latest", "0.21", "1.0.0; rm -rf /"])
def test_release_env_refuses_a_bad_version_in_one_line(version: str) -> None:
    import subprocess

    from test_cli import ROOT

    out = subprocess.run(["bash", "scripts/release_env.sh", version], cwd=ROOT, capture_output=True, text=True, timeout=30)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 4 and len(lines) == 1 and "usage: bash scripts/release_env.sh VERSION" in lines[0], out.stderr


def _report_with_a_numbered_case() -> dict:
    """A published report whose one divergence names its case with a number (schema: a string)."""
    report = json.loads((Path(__file__).resolve().parents[2] / "reports" / "vllm-0.33.0-cpu-named-cases.json").read_text())
    runner = report["results"][0]["runners"]["mrv1"]
    runner["status"] = "fail"
    runner["divergences"] = [{"kind": "layout", "case": 7, "runner": "mrv1", "field": "layout", "expected": "LBNHC",
                              "observed": "LBHNC", "message": "m", "expected_by": None}]
    return report


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("args", "content", "words"), [
    (["replay", "FILE"], DEEP, "nested too deep"),
    (["report", "FILE"], DEEP, "nested too deep"),
    (["replay", "FILE"], "REPORT", "divergences[0].case: 7 is an integer, expected string"),
    (["report", "FILE"], "REPORT", "divergences[0].case: 7 is an integer, expected string"),
    (["replay", "FILE"], "[1, 2]", "$: [1, 2] is an array, expected object"),
    (["explain", "FILE"], DEEP, "case JSON nested too deep"),
    (["run", "--reference-only", "--case", "FILE"], DEEP, "case JSON nested too deep"),
    (["run", "--case", "flashinfer-b16", "--expectations", "TOML"], "x = " + DEEP + "\n", "TOML nested too deep"),
], ids=["replay-deep", "report-deep", "replay-wrong-type", "report-wrong-type", "replay-not-an-object", "explain-deep-case",
        "run-deep-case", "deep-expectations"])
def test_every_file_read_is_validated_whole(tmp_path: Path, args: list[str], content: str, words: str) -> None:
    """Reports, case files and expectations files are input: one line, exit 4, never an internal
    error, never exit 0 (a report is checked against report.schema.json before any of it is used)."""
    text = json.dumps(_report_with_a_numbered_case()) if content == "REPORT" else content
    path = tmp_path / ("e.toml" if "TOML" in args else "f.json")
    path.write_text(text)
    out = kvconform(*[str(path) if a in ("FILE", "TOML") else a for a in args])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 4 and len(lines) == 1, (out.returncode, out.stderr[-800:])
    assert words in lines[0] and "internal error" not in lines[0], lines[0]
