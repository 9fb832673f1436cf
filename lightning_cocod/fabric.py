"""The loop API (``lightning_cocod.loop``) as Lightning Fabric strategies, registered in Fabric's
strategy registry when ``import lightning_cocod`` runs::

    fabric = Fabric(strategy="cocod", accelerator="cpu", devices=2)   # or CoCoDFabricStrategy(tau=8)
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)                  # the rounds hook the optimizer
    ... your loop: fabric.backward(loss); optimizer.step(); optimizer.zero_grad() ...
    with fabric.strategy.loop.averaged():                              # evaluate the workers' average
        evaluate(model)
    fabric.strategy.loop.close()                                       # merge, every rank the same weights

These are the ``lightning_fabric`` classes; the ``lightning.fabric`` ones are in
``lightning_cocod.lightning`` (see ``fabric_strategy``).
"""

from lightning_cocod._namespaces import install
from lightning_cocod.fabric_strategy import FABRIC_REGISTRY, IN_A_LOOP, fabric_mixins

_classes = install("lightning_fabric", __name__, fabric_mixins(), FABRIC_REGISTRY, IN_A_LOOP)
CoCoDFabricStrategy, LocalSGDFabricStrategy = (
    _classes["CoCoDFabricStrategy"],
    _classes["LocalSGDFabricStrategy"],
)
PipeSGDFabricStrategy, DiLoCoFabricStrategy = (
    _classes["PipeSGDFabricStrategy"],
    _classes["DiLoCoFabricStrategy"],
)

__all__ = ["CoCoDFabricStrategy", "DiLoCoFabricStrategy", "LocalSGDFabricStrategy", "PipeSGDFabricStrategy"]
