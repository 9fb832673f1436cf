"""Our strategies as classes of a Lightning namespace.

``pytorch_lightning`` and ``lightning.pytorch`` (the ``lightning`` package) are two separate class
hierarchies with two separate strategy registries: a Trainer of one rejects a strategy built on
the other's DDPStrategy. The logic of each method is a mixin over no Lightning class
(``CoCoDMethod``, ...); here each is put on top of a namespace's DDPStrategy, so the code exists
once and each namespace gets classes of its own: ``lightning_cocod.pl`` (also the package's top
level) and ``lightning_cocod.lightning``.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_cocod._registration import NAMESPACES
from lightning_cocod.strategies.base import StrategyCommon
from lightning_cocod.strategies.cocod import CoCoDMethod
from lightning_cocod.strategies.local_sgd import LocalSGDMethod
from lightning_cocod.strategies.pipe_sgd import PipeSGDMethod
from lightning_cocod.strategies.ssgd import SSGDMethod

METHODS: tuple[type[StrategyCommon], ...] = (CoCoDMethod, LocalSGDMethod, PipeSGDMethod, SSGDMethod)
__all__ = ["METHODS", "NAMESPACES", "build", "install", "register", "strategy_name"]


def strategy_name(method: type) -> str:
    return method.__name__.removesuffix("Method") + "Strategy"


def build(package: str, home: str) -> dict[str, type]:
    """One class per method, ``<Method>`` + ``package``'s DDPStrategy, living in module ``home``
    (where pickling, e.g. by ``*_spawn`` launchers, finds it again)."""
    ddp = importlib.import_module(f"{package}.strategies").DDPStrategy
    classes = {}
    for method in METHODS:
        name = strategy_name(method)
        classes[name] = type(name, (method, ddp), {"__module__": home, "__qualname__": name, "__doc__": method.__doc__})
    return classes


def register(package: str, classes: dict[str, type]) -> None:
    """Add every name ("cocod", "cocod_spawn", ...) to ``package``'s registry; names already
    there are left alone (re-imports, tests)."""
    registry: Any = importlib.import_module(f"{package}.strategies").StrategyRegistry
    for cls in classes.values():
        cls.register_strategies(registry)


def install(package: str, home: str) -> tuple[type, ...]:
    """Build and register ``package``'s classes; returns them in the order of ``METHODS``."""
    classes = build(package, home)
    register(package, classes)
    return tuple(classes[strategy_name(method)] for method in METHODS)
