"""Standalone reproduction: HF3FSKVConnector saves/loads the wrong tokens under a kernel split.

vLLM 0.33.0. Needs only vllm, torch and the standard library; runs on CPU in well under a minute
(most of it is ``import vllm``; the connector's Triton kernels run in the Triton interpreter):

    python docs/findings/repro_hf3fs_logical_ids_on_kernel_blocks.py
    python docs/findings/repro_hf3fs_logical_ids_on_kernel_blocks.py --with-suggested-fix

(The script sets TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES='' itself when they are unset; they
must be in place before torch/triton/vLLM are imported, so it does that first.)

Exit status: 1 when the bug is present (the page saved for logical block b does not hold logical
block b's tokens, or loading into logical block b writes pool slots outside block b), 0 when save
and load both move exactly logical block b.

What is real (vLLM's own code, unchanged):
  * FlashInferBackend.get_supported_kernel_block_sizes + select_common_block_size: the 128 -> 64
    kernel-block choice prepare_kernel_block_sizes makes off SM100;
  * compute_layout_strides, KVCacheConfig and allocate_kv_cache(..., kernel_block_sizes=[64]):
    exactly the kernel-granular [B*2, H, 64, C] view GPUModelRunner.initialize_kv_cache_tensors
    passes to connector.register_kv_caches();
  * HF3FSKVConnector._setup_kv_cache_config (what register_kv_caches runs first: the page shape,
    local_block_size = shape[2], the layer pointer table), _generate_block_hashes (the 3FS keys,
    one per cache_config.block_size tokens) and _gather_or_scatter_kv_caches with the
    kv_cache_gather_kernel / kv_cache_scatter_kernel Triton kernels: the calls
    _handle_save_task ("gather") and _handle_load_task ("scatter") make for each block.

What is faked, and why:
  * HF3FSKVConnector.__init__ is not run (the object is made with __new__): it needs a full
    VllmConfig (model_config, kv_transfer_config), connects a metadata client to the 3FS metadata
    server and installs SIGINT/SIGTERM handlers. The repro sets the two attributes the code under
    test reads from it: _kv_caches (what register_kv_caches stores) and _block_size
    (= vllm_config.cache_config.block_size, hf3fs_connector.py:482).
  * The 3FS file and metadata server are not involved: the bug is entirely in which pool slots
    the gather/scatter address, before a page reaches the file and after it comes back. The
    "saved page" is the staging buffer the gather fills (what batch_write would put in 3FS);
    the "loaded page" is a buffer handed to the scatter (what batch_read would return).
  * No GPU: the "GPU" pool is a CPU float32 tensor (exact token positions up to 2**24) and
    async_tensor_h2d must not pin memory (vllm.utils.torch_utils.PIN_MEMORY = False).
  * A small layer (1 KV head x head_size 64, so 128 content elements per token) keeps the
    interpreted kernels fast; the addressing does not depend on head count or head size.
"""

from __future__ import annotations

import os
import sys

# Before torch/triton/vLLM are imported: run HF3FS's Triton kernels on CPU in the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

import vllm  # noqa: E402
import vllm.utils.torch_utils as torch_utils  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs import hf3fs_connector as hf  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hf3fs.utils import (  # noqa: E402
    gather_scatter_helper,
)
from vllm.v1.attention.backends.flashinfer import FlashInferBackend  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache, select_common_block_size  # noqa: E402

LAYER = "model.layers.0.self_attn.attn"
NUM_BLOCKS = 4
BLOCK_SIZE = 128  # --block-size 128 (cache_config.block_size)
LAYOUT = KVCacheLayout.LBNHC  # the default (NHD) layout resolved for FlashInfer off SM100
LOADED = -1.0  # marker value of the page a 3FS prefix hit reads back


def apply_suggested_fix() -> None:
    """The suggested upstream fix, as a monkeypatch: a 3FS page is one *logical* block
    (cache_config.block_size tokens), addressed by global token position; the kernels keep
    shape[2] as tokens_per_block, so token t lands in kernel block t // shape[2]."""
    original_setup = hf.HF3FSKVConnector._setup_kv_cache_config

    def _setup_kv_cache_config(self):
        original_setup(self)
        kernel_block_size = self._local_block_size
        assert self._block_size % kernel_block_size == 0
        self._bytes_per_page = self._bytes_per_page // kernel_block_size * self._block_size
        self._shape_per_page[2] = self._block_size

    def _gather_or_scatter_kv_caches(self, block_ids, block_buffers, operation):
        op = (gather_scatter_helper.gather_kv_caches if operation == "gather"
              else gather_scatter_helper.scatter_kv_caches)
        for buffer_tensor, block_id in zip(block_buffers, block_ids):
            start_idx = block_id * self._block_size  # logical id x logical block size
            token_indices = list(range(start_idx, start_idx + self._block_size))
            op(self._kvcache_ptrs, self._local_total_tokens, buffer_tensor, token_indices,
               self._local_block_size, self._num_heads, self._content_dim,
               self._kv_cache_strides)

    hf.HF3FSKVConnector._setup_kv_cache_config = _setup_kv_cache_config
    hf.HF3FSKVConnector._gather_or_scatter_kv_caches = _gather_or_scatter_kv_caches


def span(positions: list[int]) -> str:
    if not positions:
        return "nothing"
    if positions == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}..{positions[-1]} ({len(positions)} slots)"
    return f"{len(positions)} scattered slots"


def main() -> int:
    with_fix = "--with-suggested-fix" in sys.argv[1:]
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        print("needs TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES='' (unset them or set them so)")
        return 2
    torch_utils.PIN_MEMORY = False  # no CUDA: async_tensor_h2d must not pin the token indices

    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.float32
    )
    # FlashInfer off SM100 advertises [16, 32, 64] kernel blocks (no current VllmConfig here =
    # not SM100), so the runner views each 128-token block as two 64-token kernel blocks.
    kernel_block_size = select_common_block_size(BLOCK_SIZE, [FlashInferBackend], [spec])
    ratio = BLOCK_SIZE // kernel_block_size
    layer_stride, block_stride, *_ = compute_layout_strides(spec, NUM_BLOCKS, 1, LAYOUT)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=NUM_BLOCKS * spec.page_size_bytes, layers=[LAYER],
                                        layer_stride=layer_stride, block_stride=block_stride)],
        kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)],
    )
    # What GPUModelRunner.initialize_kv_cache_tensors hands to register_kv_caches().
    kv_caches = allocate_kv_cache(
        kv_cache_config, torch.device("cpu"), LAYOUT, kernel_block_sizes=[kernel_block_size]
    )
    cache = kv_caches[LAYER]
    # Every element holds its pool token slot: kernel block k, row n = slot k * 64 + n, which is
    # slot s of logical block s // 128.
    n_kernel, _, kbs, _ = cache.shape
    slots = torch.arange(n_kernel * kbs, dtype=cache.dtype).view(n_kernel, 1, kbs, 1)
    cache.copy_(slots.expand_as(cache))

    print(f"vLLM {vllm.__version__}: FlashInfer kernel block size for --block-size {BLOCK_SIZE}: "
          f"{kernel_block_size} (ratio {ratio})")
    print(f"registered view {LAYER}: shape {tuple(cache.shape)} over {NUM_BLOCKS} logical blocks "
          f"of {BLOCK_SIZE} tokens")

    if with_fix:
        apply_suggested_fix()
        print("(running with the suggested fix applied)")

    conn = hf.HF3FSKVConnector.__new__(hf.HF3FSKVConnector)  # see the docstring: no __init__
    conn._block_size = BLOCK_SIZE  # __init__: vllm_config.cache_config.block_size
    conn._kv_caches = kv_caches  # register_kv_caches: self._kv_caches = kv_caches
    conn._setup_kv_cache_config()  # register_kv_caches' first step
    print(f"HF3FS: local_block_size {conn._local_block_size}, page shape {conn._shape_per_page}, "
          f"{conn._bytes_per_page} B per 3FS page; keys hash {conn._block_size}-token blocks")

    # A 256-token prompt in logical blocks [0, 1]: its second 3FS key covers tokens 128..255.
    prompt = list(range(1000, 1000 + 2 * BLOCK_SIZE))
    keys = conn._generate_block_hashes(prompt, 0)
    print(f"keys for the 256-token prompt: {len(keys)} (key 1 = md5 of key 0 + prompt tokens "
          f"128..255)")

    # Save (wait_for_save -> _handle_save_task): logical block 1 under key 1.
    b = 1
    page = torch.full(conn._shape_per_page, float("nan"), dtype=cache.dtype)
    conn._gather_or_scatter_kv_caches([b], [page], "gather")
    saved = [int(v) for v in page[0, 0, :, 0].tolist()]
    want_saved = list(range(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE))
    print(f"save of logical block {b} (key {keys[b][:8]}...): page holds pool slots "
          f"{span(saved)}; logical block {b} is slots {span(want_saved)}")

    # Load (start_load_kv -> _handle_load_task): a later request with that prefix hits key 1 in
    # 3FS and was allocated logical block 3; the page read back is scattered into it.
    d = 3
    before = cache.clone()
    loaded = torch.full(conn._shape_per_page, LOADED, dtype=cache.dtype)
    conn._gather_or_scatter_kv_caches([d], [loaded], "scatter")
    changed = (cache != before).any(dim=-1).any(dim=1).flatten()  # per pool slot
    written = changed.nonzero().flatten().tolist()
    want_written = list(range(d * BLOCK_SIZE, (d + 1) * BLOCK_SIZE))
    foreign = sorted(set(written) - set(want_written))
    owners = sorted({s // BLOCK_SIZE for s in foreign})
    print(f"load into logical block {d}: wrote pool slots {span(written)}; logical block {d} is "
          f"slots {span(want_written)}")
    where = f" (in logical block(s) {owners})" if owners else ""
    print(f"  slots written outside block {d}: {len(foreign)}{where}; "
          f"slots of block {d} left unloaded: {len(set(want_written) - set(written))}")

    if saved != want_saved or written != want_written:
        print("BUG PRESENT: _gather_or_scatter_kv_caches indexed the kernel-granular view with "
              f"logical block ids (kernel block b = half of logical block b // {ratio}, instead of "
              f"tokens [b*{BLOCK_SIZE}, (b+1)*{BLOCK_SIZE}))")
        return 1
    print(f"OK: save and load moved exactly logical blocks {b} and {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
