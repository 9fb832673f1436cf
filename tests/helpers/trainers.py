"""A quiet single-process CPU Trainer for the tests that fit in the pytest process itself."""

import pytorch_lightning as pl


def single_cpu_trainer(**kwargs) -> pl.Trainer:
    settings = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        **kwargs,
    }
    return pl.Trainer(**settings)
