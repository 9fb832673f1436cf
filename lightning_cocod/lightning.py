"""The strategies as ``lightning.pytorch`` classes (the ``lightning`` package), and the Fabric
strategies as ``lightning.fabric`` ones (see ``lightning_cocod.fabric``), registered in their
registries on import:

    import lightning.pytorch as L
    from lightning_cocod.lightning import CoCoDStrategy

    L.Trainer(strategy=CoCoDStrategy(tau=8))   # or strategy="cocod" after `import lightning_cocod`
"""

from lightning_cocod.strategies import fabric
from lightning_cocod.strategies.namespaces import install

_classes = install("lightning.pytorch", __name__)
_fabric_classes = fabric.install("lightning.fabric", __name__)
CoCoDStrategy, LocalSGDStrategy = _classes["CoCoDStrategy"], _classes["LocalSGDStrategy"]
PipeSGDStrategy, SSGDStrategy = _classes["PipeSGDStrategy"], _classes["SSGDStrategy"]

CoCoDFabricStrategy, LocalSGDFabricStrategy = (
    _fabric_classes["CoCoDFabricStrategy"],
    _fabric_classes["LocalSGDFabricStrategy"],
)
PipeSGDFabricStrategy = _fabric_classes["PipeSGDFabricStrategy"]

__all__ = [
    "CoCoDFabricStrategy",
    "CoCoDStrategy",
    "LocalSGDFabricStrategy",
    "LocalSGDStrategy",
    "PipeSGDFabricStrategy",
    "PipeSGDStrategy",
    "SSGDStrategy",
]
