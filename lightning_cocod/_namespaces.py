"""Our strategies (Trainer and Fabric) as classes of a Lightning namespace.

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


def install(
    package: str,
    home: str,
    mixins: dict[str, tuple[str, type, dict[str, Any]]],
    registry: str,
    where: str = "",
) -> dict[str, type]:
    """One class per method: its mixin + ``package``'s DDPStrategy, living in module ``home``
    (where pickling, e.g. by ``*_spawn`` launchers, finds it again), registered in ``package``'s
    ``registry``; returns them by class name. ``mixins``: method name -> (class name, mixin, the
    class's own attributes). The Trainer strategies (``trainer_mixins``) and the Fabric ones
    (``fabric_strategy.fabric_mixins``) are both built here."""
    strategies = importlib.import_module(f"{package}.strategies")
    classes, by_method = {}, {}
    for method, (name, mixin, own) in mixins.items():
        attributes = {"__module__": home, "__qualname__": name, "__doc__": mixin.__doc__, **own}
        classes[name] = by_method[method] = type(name, (mixin, strategies.DDPStrategy), attributes)
    register(getattr(strategies, registry), by_method, where)
    return classes


def trainer_mixins(package: str) -> dict[str, tuple[str, type, dict[str, Any]]]:
    """The Trainer strategies' mixins, as the table of methods names them (loaded here, by name,
    so that this module imports none of them)."""
    mixins = {}
    for entry in METHODS.values():
        module, _, logic_name = entry.mixin.partition(":")
        logic = getattr(importlib.import_module(module), logic_name)
        mixins[entry.name] = (
            entry.strategy_class,
            logic,
            {"strategy_name": entry.name, "namespace": package},
        )
    return mixins
