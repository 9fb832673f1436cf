"""One rank of a gloo all_reduce of rank-valued tensors; a script, a module, or a function target."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def write_result(result) -> None:
    # What lightning_cocod.launch.write_result does, without importing the package (and with it
    # Lightning, seconds per rank).
    Path(os.environ["COCOD_RESULT_PATH"]).write_text(json.dumps(result))


def allreduce_rank(*_tags: str) -> dict:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    tensor = torch.full((4,), float(rank + 1))
    dist.all_reduce(tensor)
    result = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "sum": tensor.tolist(),
        "net_ns": os.readlink("/proc/self/ns/net"),
        "local_rank": int(os.environ["LOCAL_RANK"]),
    }
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    write_result(allreduce_rank(*sys.argv[1:]))
