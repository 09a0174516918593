"""Reproduce: MRv1 computes a token slot mapping for a circular-buffer KV cache group (GLM-5-next's
kpool tail ring, CircularBufferSpec) whose block-table row is one ring block wide, so a position past
the row's width reads another request's block-table entries (and, from the last rows, past the table).

vLLM 0.33.0, CPU only (Triton interpreter): vllm + torch + stdlib. Exits 1 while the ring group gets
slots read from another request's row, 0 once MRv1 leaves the ring group without a slot mapping (as
MRv2 does: CircularBufferSpec.uses_slot_mapping is False) or bounds the read.

MRv1 builds its block tables in vllm/v1/worker/gpu_model_runner.py may_reinitialize_input_batch:
SlotMappingMode.NONE only for KVCacheSpecKind.MAMBA, TOKEN_TO_KV_SLOT for every other group, the ring
included, whose width is CircularBufferSpec.max_num_blocks_per_req = 1 (widened to 128 tokens by
get_block_table_width). The slot-mapping kernel (vllm/v1/worker/block_table.py, the load of
block_table_ptr + row_offset + virtual_block_indices) masks by token, not by column.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import vllm.v1.utils  # noqa: E402

vllm.v1.utils.PIN_MEMORY = False  # no pinned host memory without a GPU (hardware, not layout)
from vllm.v1.worker.block_table import MultiGroupBlockTable, SlotMappingMode  # noqa: E402

RING = 4  # Glm5NextTailCache's ring for index_kpool 4 and no drafts
tables = MultiGroupBlockTable(
    max_num_reqs=2, max_num_batched_tokens=64, pin_memory=False, device=torch.device("cpu"),
    block_sizes=[64, RING], max_num_blocks=[64, 1],  # MLA group: max_model_len 4096; the ring: one block
    slot_mapping_modes=[SlotMappingMode.TOKEN_TO_KV_SLOT] * 2,  # what may_reinitialize_input_batch gives a ring
)
ring = tables[1]
width = ring.max_num_blocks_per_req
tables.add_row(([10, 11, 12, 13], [7]), 0)  # request 0: ring block 7
tables.add_row(([20], [9]), 1)  # request 1: ring block 9
tables.commit_block_table(2)

position = RING * width + 2  # one ring width past request 0's row
tables.compute_slot_mapping(1, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([position]))
slot = int(ring.slot_mapping.gpu[0])
print(f"ring row width {width} blocks ({RING * width} tokens); request 0's token at position {position}: "
      f"ring slot {slot} (block {slot // RING}); request 0's ring block is 7, request 1's is 9")
sys.exit(1 if slot >= 0 and slot // RING != 7 else 0)
