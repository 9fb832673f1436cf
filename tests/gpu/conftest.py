"""Every test here needs a CUDA device: marked ``gpu`` and skipped without one (CI has none).
``bash scripts/gpu_check.sh`` runs them on a machine that has one."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if Path(item.fspath).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
