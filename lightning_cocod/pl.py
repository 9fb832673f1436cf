"""The strategies as ``pytorch_lightning`` classes, registered in its StrategyRegistry on import
(``lightning_cocod``'s top level re-exports them). For ``lightning.pytorch``, see
``lightning_cocod.lightning``."""

from lightning_cocod.strategies.namespaces import install

CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy, SSGDStrategy = install("pytorch_lightning", __name__)

__all__ = ["CoCoDStrategy", "LocalSGDStrategy", "PipeSGDStrategy", "SSGDStrategy"]
