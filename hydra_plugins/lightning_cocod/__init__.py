"""Hydra finds plugins under hydra_plugins.*, by their class's own module: cocod-train's sweeper."""

from lightning_cocod.app import preflight


class CocodSweeper(preflight.Sweeper):
    """``lightning_cocod.app.preflight.Sweeper`` (conf/hydra/sweeper/cocod.yaml selects it)."""
