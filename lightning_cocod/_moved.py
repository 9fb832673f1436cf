"""Module paths that moved when the rounds got a layer of their own: importing an old one fails
in one line naming where it went, instead of a bare ModuleNotFoundError."""

from __future__ import annotations

import importlib.abc
import sys

MOVED = {
    "lightning_cocod.strategies.rounds": "lightning_cocod.rounds",
    "lightning_cocod.strategies.health": "lightning_cocod.rounds.health",
    "lightning_cocod.strategies.checkpointing": "lightning_cocod.rounds.checkpoint",
    "lightning_cocod.strategies.fabric": "lightning_cocod.fabric_strategy",
    "lightning_cocod.strategies.namespaces": "lightning_cocod._namespaces",
}


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name in MOVED:
            raise ModuleNotFoundError(f"{name} moved to {MOVED[name]}: import it from there", name=name)


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
