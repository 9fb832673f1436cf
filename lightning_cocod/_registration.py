"""``import lightning_cocod`` makes "cocod" & co. resolvable in every Lightning namespace, without
importing Lightning itself.

A strategy name must be in a namespace's StrategyRegistry before its ``Trainer`` is built, and
the namespaces (``pytorch_lightning``, ``lightning.pytorch``, and Fabric's ``lightning_fabric`` and
``lightning.fabric``) have registries of their own.
Importing both up front would cost every ``import lightning_cocod`` (and every command-line call,
``--help`` included) several seconds. So: a namespace already imported gets our classes now; one
imported later gets them the moment its package has finished executing, through a finder that
wraps its loader once. Nothing else about the import changes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings
from typing import Any

# The Lightning package of a namespace, and the module of ours that holds its classes.
# (``lightning.fabric`` is complete whenever ``lightning.pytorch`` is: the ``lightning`` package imports both.)
NAMESPACES = {
    "pytorch_lightning": "lightning_cocod.pl",
    "lightning.pytorch": "lightning_cocod.lightning",
    "lightning_fabric": "lightning_cocod.fabric",
}

_lock = threading.RLock()
_waiting: set[str] = set()


def _fully_imported(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def _install(package: str) -> None:
    with _lock:
        _waiting.discard(package)
    try:
        importlib.import_module(NAMESPACES[package])
    except Exception as err:  # noqa: BLE001 - never break the user's import of Lightning
        warnings.warn(f"lightning_cocod could not register its strategies in {package}: {err}", stacklevel=2)


class _LoaderThenRegister:
    """The package's own loader, followed by our registration; every other attribute is the loader's."""

    def __init__(self, loader: Any, package: str) -> None:
        self._loader, self._package = loader, package

    def __getattr__(self, name: str) -> Any:  # create_module among others
        return getattr(self._loader, name)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _install(self._package)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        with _lock:
            if fullname not in _waiting:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenRegister(spec.loader, fullname)
                return spec
        return None


_finder = _RegisterAfterImport()


def register_in_every_namespace() -> None:
    """Idempotent: call it as often as you like."""
    for package in NAMESPACES:
        if _fully_imported(package):
            _install(package)
        else:
            with _lock:
                _waiting.add(package)
    with _lock:
        if _waiting and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
