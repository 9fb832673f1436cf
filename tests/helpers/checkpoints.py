"""Damage done to a checkpoint file the way a bad disk or a careless copy does it."""

from pathlib import Path

import torch


def flip_byte_inside(path: Path, tensor: torch.Tensor) -> None:
    """Flip one bit in the middle of ``tensor``'s bytes as the file stores them (torch itself,
    which does not check the zip's CRC, loads the file with the altered value)."""
    data = bytearray(path.read_bytes())
    raw = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    at = data.find(raw)
    assert at >= 0 and data.find(raw, at + 1) < 0, "the tensor's bytes must be in the file exactly once"
    data[at + len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(data))
