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

from lightning_cocod.methods import METHODS

# Where a user imports the classes of each namespace from (``lightning_cocod.pl`` is also the top level).
HOMES = {"pytorch_lightning": "lightning_cocod", "lightning.pytorch": "lightning_cocod.lightning"}
# The registry names of each method: (suffix, start_method).
VARIANTS = (("", "popen"), ("_spawn", "spawn"), ("_fork", "fork"), ("_notebook", "fork"))


def register(registry: Any, strategies: dict[str, type], where: str = "") -> None:
    """Add the names of each method ("cocod", "cocod_spawn", ...) to ``registry``, for its class in
    ``strategies`` (by method name); names already there are left alone (re-imports, tests)."""
    for name, strategy in strategies.items():
        for suffix, start_method in VARIANTS:
            if name + suffix not in registry:
                registry.register(
                    name + suffix,
                    strategy,
                    start_method=start_method,
                    description=f"{METHODS[name].description}{where} (start_method '{start_method}')",
                )


def install(package: str, home: str) -> dict[str, type]:
    """One class per method of the table, its mixin + ``package``'s DDPStrategy, living in module
    ``home`` (where pickling, e.g. by ``*_spawn`` launchers, finds it again), registered in
    ``package``'s registry; returns them by class name."""
    strategies = importlib.import_module(f"{package}.strategies")
    classes, by_method = {}, {}
    for entry in METHODS.values():
        module, _, logic_name = entry.mixin.partition(":")
        logic, name = getattr(importlib.import_module(module), logic_name), entry.strategy_class
        attributes = {
            "__module__": home,
            "__qualname__": name,
            "__doc__": logic.__doc__,
            "strategy_name": entry.name,
            "namespace": package,
        }
        classes[name] = by_method[entry.name] = type(name, (logic, strategies.DDPStrategy), attributes)
    register(strategies.StrategyRegistry, by_method)
    return classes
