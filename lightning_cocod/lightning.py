"""The strategies as ``lightning.pytorch`` classes (the ``lightning`` package), and the Fabric
strategies as ``lightning.fabric`` ones (see ``lightning_cocod.fabric``), registered in their
registries on import:

    import lightning.pytorch as L
    from lightning_cocod.lightning import CoCoDStrategy

    L.Trainer(strategy=CoCoDStrategy(tau=8))   # or strategy="cocod" after `import lightning_cocod`
"""

from lightning_cocod._namespaces import install, trainer_mixins
from lightning_cocod.fabric_strategy import FABRIC_REGISTRY, IN_A_LOOP, fabric_mixins

_classes = install("lightning.pytorch", __name__, trainer_mixins("lightning.pytorch"), "StrategyRegistry")
_fabric_classes = install("lightning.fabric", __name__, fabric_mixins(), FABRIC_REGISTRY, IN_A_LOOP)
CoCoDStrategy, LocalSGDStrategy = _classes["CoCoDStrategy"], _classes["LocalSGDStrategy"]
PipeSGDStrategy, SSGDStrategy = _classes["PipeSGDStrategy"], _classes["SSGDStrategy"]
DiLoCoStrategy, DiLoCoFabricStrategy = _classes["DiLoCoStrategy"], _fabric_classes["DiLoCoFabricStrategy"]

CoCoDFabricStrategy, LocalSGDFabricStrategy = (
    _fabric_classes["CoCoDFabricStrategy"],
    _fabric_classes["LocalSGDFabricStrategy"],
)
PipeSGDFabricStrategy = _fabric_classes["PipeSGDFabricStrategy"]

__all__ = [
    "CoCoDFabricStrategy",
    "CoCoDStrategy",
    "DiLoCoFabricStrategy",
    "DiLoCoStrategy",
    "LocalSGDFabricStrategy",
    "LocalSGDStrategy",
    "PipeSGDFabricStrategy",
    "PipeSGDStrategy",
    "SSGDStrategy",
]
