"""The one Trainer builder of the package's tools (the app, the benchmark, the demo, the step
timer): each passes what it decides; the rest are the quiet defaults that all of them want."""

from __future__ import annotations

from typing import Any

# The workers' output goes to files under the launchers, and each tool prints its own progress
# line: Lightning's bar, its model table and a sanity-check pass would only add noise and time.
QUIET = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}


def build_trainer(namespace: str = "pytorch_lightning", **kwargs: Any) -> Any:
    """``<namespace>.Trainer(**QUIET | kwargs)``: ``pytorch_lightning`` or ``lightning.pytorch``."""
    import importlib

    import lightning_cocod  # noqa: F401 - registers the strategy names before the Trainer resolves one

    return importlib.import_module(namespace).Trainer(**{**QUIET, **kwargs})
