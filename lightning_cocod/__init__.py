"""CoCoD-SGD and its baselines as PyTorch Lightning strategies.

``import lightning_cocod`` registers the strategy names in ``pytorch_lightning``'s registry
(not ``lightning.pytorch``'s, which is a different object), so that afterwards
``Trainer(strategy="cocod")`` works; so do "local_sgd", "pipe_sgd" and "ssgd", each also with
"_spawn", "_fork" (and "_notebook" for ours) launcher variants.
"""

from pytorch_lightning.strategies import StrategyRegistry as _StrategyRegistry

from lightning_cocod.strategies import (
    CoCoDStrategy,
    LocalSGDStrategy,
    NonFiniteError,
    PipeSGDStrategy,
    RendezvousError,
    SyncStrategyBase,
    WorkerLostError,
    register_strategies,
)

register_strategies(_StrategyRegistry)

__version__ = "0.1.0"
__all__ = [
    "CoCoDStrategy",
    "LocalSGDStrategy",
    "NonFiniteError",
    "PipeSGDStrategy",
    "RendezvousError",
    "SyncStrategyBase",
    "WorkerLostError",
    "register_strategies",
]
