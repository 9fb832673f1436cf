"""Batch-side augmentation and normalisation, vectorised over the batch.

These run in ``on_after_batch_transfer``, i.e. on the training device on whole batches, so that a
GPU is not left waiting on per-image CPU transforms. Randomness comes from torch's default
generator of the tensor's device (seeded by ``pytorch_lightning.seed_everything``) unless a
``generator`` on that device is given. Nothing here makes the host wait for the device: random
numbers are drawn there, and no value is read back.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor


def random_flip(x: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Mirrors each image of an N x C x H x W batch left-right with probability ``p``."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pads each side by ``padding`` and takes a random crop of the original size per image.

    Same distribution as torchvision's ``RandomCrop(size, padding)``: offsets uniform in
    [0, 2 * padding] on each axis. One gather for the whole batch instead of a per-image loop.
    """
    if padding == 0:
        return x
    if padding < 0:
        raise ValueError(f"random_crop: padding={padding} is invalid; accepted: an int >= 0")
    n, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (2, n), device=x.device, generator=generator)
    batch, row_steps, col_steps = _positions(x.device, n, h, w)
    rows = offsets[0, :, None] + row_steps  # N x H
    cols = offsets[1, :, None] + col_steps  # N x W
    # The advanced indices are split by the channel slice, so their broadcast shape (N, H, W) comes
    # first and channels last; permute back to N x C x H x W.
    out = padded[batch, :, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


@lru_cache(maxsize=16)
def _positions(device: torch.device, n: int, h: int, w: int) -> tuple[Tensor, Tensor, Tensor]:
    # The same every step: made once per device and batch shape rather than launched each time.
    batch = torch.arange(n, device=device)[:, None, None]
    return batch, torch.arange(h, device=device), torch.arange(w, device=device)


def normalize(x: Tensor, mean: Sequence[float] | Tensor, std: Sequence[float] | Tensor) -> Tensor:
    """Float32 ``(x / 255 - mean) / std`` per channel for uint8 ``x``; a float ``x`` is taken as
    already in [0, 1]. ``mean``/``std`` may be tensors already on the device, to skip a host copy."""
    channels = x.shape[1]
    mean = torch.as_tensor(mean, dtype=torch.float32, device=x.device)
    std = torch.as_tensor(std, dtype=torch.float32, device=x.device)
    if mean.numel() != channels or std.numel() != channels:
        raise ValueError(
            f"normalize: mean/std have {mean.numel()}/{std.numel()} values for {channels} channels"
        )
    out = x.float()
    if x.dtype == torch.uint8:
        out = out / 255.0
    return (out - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
