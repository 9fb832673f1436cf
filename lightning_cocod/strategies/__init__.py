"""The four methods under one API, and their registration in Lightning's StrategyRegistry."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.strategies import DDPStrategy

from lightning_cocod.strategies.base import RendezvousError, SyncStrategyBase, WorkerLostError
from lightning_cocod.strategies.cocod import CoCoDStrategy
from lightning_cocod.strategies.health import NonFiniteError
from lightning_cocod.strategies.local_sgd import LocalSGDStrategy
from lightning_cocod.strategies.pipe_sgd import PipeSGDStrategy

STRATEGIES: tuple[type[SyncStrategyBase], ...] = (CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy)


def register_strategies(registry: Any) -> None:
    """Add our names to ``registry``; a name already there is left alone (re-imports, tests)."""
    for cls in STRATEGIES:
        cls.register_strategies(registry)
    # S-SGD is Lightning's own DDP (bucketed gradient all-reduce overlapped with backward), the
    # strongest honest synchronous baseline: only a name, so configs name the four methods alike.
    for name, start_method in (("ssgd", "popen"), ("ssgd_spawn", "spawn"), ("ssgd_fork", "fork")):
        if name not in registry:
            registry.register(
                name, DDPStrategy, description=f"S-SGD: Lightning's DDPStrategy (start_method '{start_method}')",
                start_method=start_method,
            )


__all__ = [
    "STRATEGIES",
    "CoCoDStrategy",
    "LocalSGDStrategy",
    "NonFiniteError",
    "PipeSGDStrategy",
    "RendezvousError",
    "SyncStrategyBase",
    "WorkerLostError",
    "register_strategies",
]
