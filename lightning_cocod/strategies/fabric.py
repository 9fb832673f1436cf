"""The loop API (``lightning_cocod.loop``) as a mixin over a Fabric namespace's DDPStrategy, with no
Lightning imported here: ``lightning_cocod.fabric`` (``lightning_fabric``) and
``lightning_cocod.lightning`` (``lightning.fabric``) build their classes with ``install``.
Each is Fabric's DDPStrategy without the DDP wrapper: the process set-up and launchers are
Fabric's, every step is the loop object's.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, ClassVar

import torch

from lightning_cocod.loop import LOOPS
from lightning_cocod.methods import METHODS
from lightning_cocod.strategies.base import broadcast_from_rank_zero
from lightning_cocod.strategies.namespaces import register
from lightning_cocod.strategies.reliability import parse_timeout

# Fabric's DDPStrategy options we pass on; the others are the algorithm's (the loop class's).
_PASSED_ON = (
    "accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision", "process_group_backend",
)


class _NothingToSkip:
    """Nothing is synchronised in backward (rounds average models, after optimizer steps), so
    ``fabric.no_backward_sync`` during gradient accumulation has nothing to skip."""

    def no_backward_sync(self, module: Any, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class FabricRounds:
    """Mixed in before a Fabric DDPStrategy class (see ``install``); ``loop_class`` is the algorithm."""

    loop_class: ClassVar[type]

    def __init__(self, *, timeout: Any = None, start_method: str = "popen", **options: Any) -> None:
        name = type(self).__name__
        passed = {k: options.pop(k) for k in _PASSED_ON if k in options}
        weight = options.pop("weight", None)
        # The options are checked now, as the Trainer strategies check theirs.
        self.loop_class.rounds_class(name, **options)
        self._loop_options = {"weight": weight, **options}
        super().__init__(timeout=parse_timeout(name, timeout), start_method=start_method, **passed)
        self._backward_sync_control = _NothingToSkip()
        self._module: torch.nn.Module | None = None
        self.loop: Any = None  # the loop object, once fabric.setup has the model and its optimizer

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        broadcast_from_rank_zero(module)  # no DistributedDataParallel wrapper
        self._module = module
        return module

    def setup_optimizer(self, optimizer: Any) -> Any:
        # fabric.setup(model, optimizer) comes here after setup_module, as fabric.setup_optimizers does.
        name = type(self).__name__
        if self.loop is not None:
            raise ValueError(f"{name} supports exactly one optimizer: a round counts the steps of one optimizer")
        if self._module is None:
            raise ValueError(f"{name}: set up the model before its optimizer, e.g. fabric.setup(model, optimizer)")
        self.loop = self.loop_class(self._module, optimizer, timeout=self._timeout, **self._loop_options).__enter__()
        return optimizer

    def teardown(self) -> None:
        if self.loop is not None:
            self.loop.close()
        super().teardown()


def install(package: str, home: str) -> dict[str, type]:
    """Build ``package``'s classes (living in module ``home``) and register their names
    ("cocod", "cocod_fork", ...) in its registry; names already there are left alone."""
    strategies = importlib.import_module(f"{package}.strategies")
    classes, by_method = {}, {}
    for name, loop in LOOPS.items():
        class_name = METHODS[name].strategy_class.replace("Strategy", "FabricStrategy")
        attributes = {"__module__": home, "__qualname__": class_name, "__doc__": loop.__doc__, "loop_class": loop}
        classes[class_name] = by_method[name] = type(class_name, (FabricRounds, strategies.DDPStrategy), attributes)
    register(strategies.STRATEGY_REGISTRY, by_method, where=", in a Fabric loop")
    return classes
