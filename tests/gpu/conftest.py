"""Every test here needs a CUDA device: marked ``gpu`` and skipped without one (CI has none).
``bash scripts/gpu_check.sh`` runs them on a machine that has one."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_cocod.core.comm import TorchDistCommunicator

HERE = Path(__file__).resolve().parent
DEVICE = torch.device("cuda", 0)


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if Path(item.fspath).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(params=["nccl", "gloo"])
def comm(request):
    """A world-size-1 group on ``DEVICE``: NCCL lands on the device's timeline, gloo on the host's."""
    torch.cuda.set_device(DEVICE)
    options = {"device_id": DEVICE} if request.param == "nccl" else {}
    dist.init_process_group(request.param, store=dist.HashStore(), rank=0, world_size=1, **options)
    comm = TorchDistCommunicator.on_new_group(DEVICE, backend=request.param)
    assert comm.lands_on_stream == (request.param == "nccl")
    yield comm
    torch.cuda.synchronize()
    comm.destroy()
    dist.destroy_process_group()
