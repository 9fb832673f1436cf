"""CoCoD-SGD and its baselines as PyTorch Lightning strategies.

``import lightning_cocod`` makes the names "cocod", "diloco", "local_sgd", "pipe_sgd" and "ssgd" (each also
with "_spawn", "_fork" and "_notebook" launcher variants) resolvable by ``Trainer(strategy=...)``
of ``pytorch_lightning`` and of ``lightning.pytorch``, whichever is imported, before or after it.
The classes: ``lightning_cocod.CoCoDStrategy`` & co. are ``pytorch_lightning`` strategies (also in
``lightning_cocod.pl``); the ``lightning.pytorch`` ones are in ``lightning_cocod.lightning``.
Fabric's registries (``lightning_fabric``, ``lightning.fabric``) get "cocod", "diloco",
"local_sgd" and "pipe_sgd" the same way. A training loop of your own: ``lightning_cocod.CoCoD`` & co. (``loop``).

Importing the package imports no Lightning: the names above are loaded on first use.
"""

from __future__ import annotations

from lightning_cocod import _moved
from lightning_cocod._lazy import lazy_attributes
from lightning_cocod._registration import register_in_every_namespace

register_in_every_namespace()
_moved.install()

__version__ = "0.1.0"
_LAZY = {
    "CoCoD": "lightning_cocod.loop",
    "DiLoCo": "lightning_cocod.loop",
    "LocalSGD": "lightning_cocod.loop",
    "PipeSGD": "lightning_cocod.loop",
    "CoCoDStrategy": "lightning_cocod.pl",
    "DiLoCoStrategy": "lightning_cocod.pl",
    "LocalSGDStrategy": "lightning_cocod.pl",
    "PipeSGDStrategy": "lightning_cocod.pl",
    "SSGDStrategy": "lightning_cocod.pl",
    "SyncStrategyBase": "lightning_cocod.strategies.base",
    "NonFiniteError": "lightning_cocod.rounds.health",
    "Preempted": "lightning_cocod.strategies.reliability",
    "PREEMPTED_EXIT_CODE": "lightning_cocod.strategies.reliability",
    "RendezvousError": "lightning_cocod.strategies.reliability",
    "WorkerLostError": "lightning_cocod.strategies.reliability",
    "CheckpointError": "lightning_cocod.rounds.checkpoint",
}
__all__ = [  # noqa: RUF022 - loaded lazily from _LAZY
    "CheckpointError",
    "CoCoD",
    "CoCoDStrategy",
    "DiLoCo",
    "DiLoCoStrategy",
    "LocalSGD",
    "LocalSGDStrategy",
    "NonFiniteError",
    "PREEMPTED_EXIT_CODE",
    "PipeSGD",
    "PipeSGDStrategy",
    "Preempted",
    "RendezvousError",
    "SSGDStrategy",
    "SyncStrategyBase",
    "WorkerLostError",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
