"""The methods' rounds (no Lightning), their logic as Lightning mixins (over no Lightning class, see
``namespaces``) and their errors.

``lightning_cocod.strategies.CoCoDStrategy`` & co. are the ``pytorch_lightning`` classes, loaded
on first use (``lightning_cocod.pl``).
"""

from __future__ import annotations

from lightning_cocod._lazy import lazy_attributes
from lightning_cocod.methods import METHODS
from lightning_cocod.strategies.base import SyncStrategyBase
from lightning_cocod.strategies.checkpointing import CheckpointError
from lightning_cocod.strategies.cocod import CoCoDMethod, CoCoDRounds
from lightning_cocod.strategies.common import StrategyCommon
from lightning_cocod.strategies.health import NonFiniteError
from lightning_cocod.strategies.local_sgd import LocalSGDMethod, LocalSGDRounds
from lightning_cocod.strategies.pipe_sgd import PipeSGDMethod, PipeSGDRounds
from lightning_cocod.strategies.reliability import (
    PREEMPTED_EXIT_CODE,
    Preempted,
    RendezvousError,
    WorkerLostError,
)
from lightning_cocod.strategies.rounds import Rounds
from lightning_cocod.strategies.ssgd import SSGDMethod

__getattr__, __dir__ = lazy_attributes(
    __name__, {entry.strategy_class: "lightning_cocod.pl" for entry in METHODS.values()}
)


__all__ = [
    "PREEMPTED_EXIT_CODE",
    "CheckpointError",
    "CoCoDMethod",
    "CoCoDRounds",
    "CoCoDStrategy",
    "LocalSGDMethod",
    "LocalSGDRounds",
    "LocalSGDStrategy",
    "NonFiniteError",
    "PipeSGDMethod",
    "PipeSGDRounds",
    "PipeSGDStrategy",
    "Preempted",
    "RendezvousError",
    "Rounds",
    "SSGDMethod",
    "SSGDStrategy",
    "StrategyCommon",
    "SyncStrategyBase",
    "WorkerLostError",
]
