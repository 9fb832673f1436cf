"""What a checkpoint needs beyond Lightning's own to resume a run of ours exactly.

The weights are identical on every rank at a checkpoint (it is a synchronisation point), but
each worker's optimizer state (momentum stays local) and random state are its own: rank 0
gathers them into ``checkpoint[STATE_KEY]["ranks"]`` and each rank takes its own back on resume.
The file is written to a temporary name and renamed, so a crash mid-write never leaves a
truncated checkpoint where the last good one was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STATE_KEY = "lightning_cocod"


def rng_state() -> dict[str, Any]:
    # torch's generators drive the on-device augmentation. Tensors only, so the checkpoint
    # still loads with torch.load(weights_only=True).
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_to_rank_zero(obj: Any, world_size: int) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (None elsewhere); a collective on the default group."""
    if world_size == 1 or not dist.is_initialized():
        return [obj]
    gathered: list[Any] | None = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def atomic_save(checkpoint_io: Any, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
    path = str(filepath)
    if "://" in path:  # remote storage: no rename there, the backend's own semantics apply
        checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        return
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        checkpoint_io.save_checkpoint(checkpoint, tmp, storage_options=storage_options)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
