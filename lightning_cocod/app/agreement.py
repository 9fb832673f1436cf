"""Every rank runs the same job: checked once the ranks have met, before they exchange anything.

Under torchrun and SLURM every rank composes its own config. Ranks given different seeds trained
on different data and the record said rank 0's seed; a different period, batch, step budget or
model made gloo abort one rank (SIGABRT) at the first mismatched collective, naming nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig

from lightning_cocod.app.identity import to_plain
from lightning_cocod.rounds.options import disagreement


class ConfigMismatch(RuntimeError):
    """Ranks that disagree on what must agree; the message names the key and both values."""


def must_agree(cfg: DictConfig) -> dict[str, Any]:
    """What every rank of one run must share, by the config key a user would correct: everything
    but a node's own paths (``root``) and how long a rank waits (``timeout``)."""
    values = {key: cfg[key] for key in ("run_id", "seed", "max_steps", "max_epochs")}
    for section in ("strategy", "data"):
        plain = to_plain(cfg[section])
        values.update({f"{section}.{k}": v for k, v in sorted(plain.items()) if k not in ("root", "timeout")})
    return values


class SameConfig(pl.Callback):
    """At setup (the ranks have met; the strategy has not yet broadcast the model), every rank
    gathers every rank's values and ends with the same ConfigMismatch if any differs."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        if trainer.world_size == 1 or not dist.is_available() or not dist.is_initialized():
            return
        shapes = json.dumps([(name, list(p.shape)) for name, p in pl_module.named_parameters()])
        digest = hashlib.sha256(shapes.encode()).hexdigest()[:12]
        mine = {**self.values, "model (a digest of its parameter shapes)": digest}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        if problem := disagreement(gathered):
            raise ConfigMismatch(problem)
