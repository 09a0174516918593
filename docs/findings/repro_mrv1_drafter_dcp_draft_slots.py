"""Reproduce: under decode context parallelism (DCP), MRv1's Eagle drafter addresses its
draft-step tokens without DCP, so each rank writes them at another token's slot.

vLLM 0.33.0, CPU only (Triton interpreter): vllm + torch + stdlib. Exits 1 while the bug
is present, 0 once the drafter's slots agree with the runner's own for the same tokens.

The runner's slot mapping (vllm/v1/worker/block_table.py, BlockTable.compute_slot_mapping)
spreads a virtual block of block_size * dcp_world_size tokens over the DCP ranks; the
drafter's (vllm/v1/spec_decode/utils.py, eagle_step_update_slot_mapping_and_metadata,
called per draft step from llm_base_proposer.py _update_positions_dependent_metadata when
num_speculative_tokens > 1) takes only the block table and the block size.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import vllm.v1.utils  # noqa: E402

vllm.v1.utils.PIN_MEMORY = False  # no pinned host memory without a GPU (hardware, not layout)
from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata  # noqa: E402
from vllm.v1.worker.block_table import BlockTable  # noqa: E402

BLOCK = 16
DCP_WORLD, DCP_RANK = 2, 0  # what get_dcp_group() answers on rank 0 of a DCP-2 group

table = BlockTable(block_size=BLOCK, max_num_reqs=2, max_num_blocks_per_req=8, max_num_batched_tokens=64,
                   pin_memory=False, device=torch.device("cpu"), cp_kv_cache_interleave_size=1)
table.dcp_world_size, table.dcp_rank = DCP_WORLD, DCP_RANK
table.append_row([3, 5, 7], 0)
table.commit_block_table(1)


def runner_slot(position: int) -> int:
    """The slot the runner's own slot mapping gives the token at ``position`` on this rank."""
    table.compute_slot_mapping(1, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([position]))
    return int(table.slot_mapping.gpu[0])


# The target's forward ran positions 14 and 15; the drafter's next steps write 16, then 17.
positions = torch.tensor([15], dtype=torch.int64)
seq_lens = torch.tensor([16], dtype=torch.int32)
failed = False
for _ in range(2):
    out_positions = torch.zeros(1, dtype=torch.int64)
    out_slots = torch.zeros(1, dtype=torch.int64)
    eagle_step_update_slot_mapping_and_metadata(
        positions_1d=positions, block_table_tensor=table.get_device_tensor(1), seq_lens=seq_lens,
        block_size=BLOCK, max_model_len=1024, out_clamped_positions=out_positions, out_slot_mapping=out_slots)
    p = int(out_positions[0])
    want, got = runner_slot(p), int(out_slots[0])
    print(f"draft token at position {p}: runner's slot on DCP rank {DCP_RANK} is {want}, the drafter's {got}")
    failed |= want != got
    positions = out_positions
sys.exit(1 if failed else 0)
