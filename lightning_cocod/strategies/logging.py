"""Puts each round's communication figures into the LightningModule's logger."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


class CommStatsLogger(Callback):
    """Installed by our strategies themselves; logs through ``pl_module.log`` so the user's logger
    receives the figures at ``log_every_n_steps`` like any other step metric.

    Logged: the last finished round's communication time (launch to completion), exposed wait,
    payload bytes and share hidden, the share hidden over the whole run so far, and the period.
    """

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        stats = getattr(trainer.strategy, "comm_stats", None)
        if stats is None or not stats.rounds:
            return
        last = stats.rounds[-1]
        figures = {
            "comm/round_seconds": last.comm_seconds,
            "comm/exposed_seconds": last.exposed_seconds,
            "comm/bytes": float(last.nbytes),
            "comm/hidden_fraction": last.hidden_fraction,
            "comm/hidden_fraction_total": stats.hidden_fraction,
        }
        if hasattr(trainer.strategy, "tau"):
            figures["comm/tau"] = float(trainer.strategy.tau)
        pl_module.log_dict(
            figures,
            on_step=True,
            on_epoch=False,
            batch_size=1,
        )
