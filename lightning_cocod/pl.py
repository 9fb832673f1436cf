"""The strategies as ``pytorch_lightning`` classes, registered in its StrategyRegistry on import
(``lightning_cocod``'s top level re-exports them). For ``lightning.pytorch``, see
``lightning_cocod.lightning``."""

from lightning_cocod._namespaces import install, trainer_mixins

_classes = install("pytorch_lightning", __name__, trainer_mixins("pytorch_lightning"), "StrategyRegistry")
CoCoDStrategy, LocalSGDStrategy = _classes["CoCoDStrategy"], _classes["LocalSGDStrategy"]
PipeSGDStrategy, SSGDStrategy = _classes["PipeSGDStrategy"], _classes["SSGDStrategy"]
DiLoCoStrategy = _classes["DiLoCoStrategy"]

__all__ = ["CoCoDStrategy", "DiLoCoStrategy", "LocalSGDStrategy", "PipeSGDStrategy", "SSGDStrategy"]
