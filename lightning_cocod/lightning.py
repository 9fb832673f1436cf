"""The strategies as ``lightning.pytorch`` classes (the ``lightning`` package), registered in its
StrategyRegistry on import:

    import lightning.pytorch as L
    from lightning_cocod.lightning import CoCoDStrategy

    L.Trainer(strategy=CoCoDStrategy(tau=8))   # or strategy="cocod" after `import lightning_cocod`
"""

from lightning_cocod.strategies.namespaces import install

CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy, SSGDStrategy = install("lightning.pytorch", __name__)

__all__ = ["CoCoDStrategy", "LocalSGDStrategy", "PipeSGDStrategy", "SSGDStrategy"]
