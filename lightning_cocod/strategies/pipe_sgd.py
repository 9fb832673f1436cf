"""Pipe-SGD under the Trainer: ``rounds.PipeSGDRounds`` run from the hooks of ``SyncStrategyBase``."""

from __future__ import annotations

from typing import Any

from lightning_cocod.rounds.pipe_sgd import PipeSGDRounds
from lightning_cocod.strategies.base import SyncStrategyBase


class PipeSGDMethod(SyncStrategyBase):
    """Synchronous SGD with a pipeline of width two: ``x <- x - lr * mean_j grad_j(t-1)``.

    After backward of step t the local gradients are launched in a non-blocking all-reduce; the
    all-reduce of step t-1 is then waited on and its mean gradients are what the optimizer
    applies at step t. All workers apply the same gradients, so their models stay identical.

    The first step has no earlier gradient: it launches its own and updates nothing (its
    gradients are set to None, which torch optimizers skip: no update, no weight decay, no
    momentum). When fit ends the last launched gradients are waited on and not applied.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(PipeSGDRounds, **kwargs)
