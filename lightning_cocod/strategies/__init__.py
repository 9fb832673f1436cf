"""The Lightning adapters: each method's logic as a Lightning mixin (over no Lightning class, see
``lightning_cocod._namespaces``), and their errors. The rounds they run are ``lightning_cocod.rounds``
(re-exported here, where they were first published).

``lightning_cocod.strategies.CoCoDStrategy`` & co. are the ``pytorch_lightning`` classes, loaded
on first use (``lightning_cocod.pl``).
"""

from __future__ import annotations

from lightning_cocod._lazy import lazy_attributes
from lightning_cocod.methods import METHODS
from lightning_cocod.rounds import CoCoDRounds, LocalSGDRounds, NonFiniteError, PipeSGDRounds, Rounds
from lightning_cocod.rounds.checkpoint import CheckpointError
from lightning_cocod.strategies.base import SyncStrategyBase
from lightning_cocod.strategies.cocod import CoCoDMethod
from lightning_cocod.strategies.common import StrategyCommon
from lightning_cocod.strategies.local_sgd import LocalSGDMethod
from lightning_cocod.strategies.pipe_sgd import PipeSGDMethod
from lightning_cocod.strategies.reliability import (
    PREEMPTED_EXIT_CODE,
    Preempted,
    RendezvousError,
    WorkerLostError,
)
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
