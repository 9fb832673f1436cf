"""Isolation between tests that run training in the pytest process itself."""

import os

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def _isolated_process_group_and_wandb(monkeypatch):
    # A single-device fit in this process leaves a world-1 process group behind; a later test's
    # forked workers would inherit it and skip their own rendezvous.
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "disabled"))
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
