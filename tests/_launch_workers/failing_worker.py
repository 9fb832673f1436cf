"""Rank 1 raises after joining the group; rank 0 is left waiting in a collective."""

import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="env://")
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.all_reduce(torch.ones(1))
