"""Module attributes loaded on first use (PEP 562), so that importing a package costs nothing
until one of its heavy names is needed."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_attributes(
    module_name: str, homes: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for module ``module_name``: ``homes`` maps each name to the
    module it is imported from; a loaded name is cached in the module."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
            setattr(sys.modules[module_name], name, value)
            return value
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module_name]), *homes})

    return __getattr__, __dir__
