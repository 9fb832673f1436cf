"""A module path users could import before the rounds layer fails in one line naming its new home."""

import importlib

import pytest

import lightning_cocod  # noqa: F401 - installs the finder of moved paths

OLD_TO_NEW = [
    ("lightning_cocod.strategies.rounds", "lightning_cocod.rounds", "CoCoDRounds"),
    ("lightning_cocod.strategies.health", "lightning_cocod.rounds.health", "NonFiniteError"),
    ("lightning_cocod.strategies.checkpointing", "lightning_cocod.rounds.checkpoint", "CheckpointError"),
    ("lightning_cocod.strategies.fabric", "lightning_cocod.fabric_strategy", "FabricRounds"),
    ("lightning_cocod.strategies.namespaces", "lightning_cocod._namespaces", "install"),
]


@pytest.mark.parametrize("old, new, name", OLD_TO_NEW)
def test_an_old_module_path_names_where_it_went_and_that_holds_what_it_held(old, new, name):
    with pytest.raises(ModuleNotFoundError, match=rf"^{old} moved to {new}: import it from there$"):
        importlib.import_module(old)
    assert hasattr(importlib.import_module(new), name)


def test_the_modules_that_stayed_still_import():
    assert hasattr(importlib.import_module("lightning_cocod.strategies.cocod"), "CoCoDMethod")
