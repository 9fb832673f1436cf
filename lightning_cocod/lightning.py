"""The strategies as ``lightning.pytorch`` classes (the ``lightning`` package), registered in its
StrategyRegistry on import:

    import lightning.pytorch as L
    from lightning_cocod.lightning import CoCoDStrategy

    L.Trainer(strategy=CoCoDStrategy(tau=8))   # or strategy="cocod" after `import lightning_cocod`
"""

from lightning_cocod.strategies.namespaces import install

_classes = install("lightning.pytorch", __name__)
CoCoDStrategy, LocalSGDStrategy = _classes["CoCoDStrategy"], _classes["LocalSGDStrategy"]
PipeSGDStrategy, SSGDStrategy = _classes["PipeSGDStrategy"], _classes["SSGDStrategy"]

__all__ = ["CoCoDStrategy", "LocalSGDStrategy", "PipeSGDStrategy", "SSGDStrategy"]
