"""A checkpoint of CUDA tensors: its integrity record is the same whether the file is read onto
the GPU (each rank's load) or onto the CPU (the app's checks), and an altered weight is refused
either way."""

import pytest
import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lightning_cocod import CheckpointError
from lightning_cocod.rounds.checkpoint import atomic_save, read_checkpoint, verify_checkpoint
from tests.helpers.checkpoints import flip_byte_inside

pytestmark = pytest.mark.timeout(120)

DEVICE = torch.device("cuda", 0)


def test_a_checkpoint_of_cuda_tensors_verifies_on_either_device_and_an_altered_one_on_neither(tmp_path):
    path = tmp_path / "last.ckpt"
    weights = torch.linspace(-1.0, 1.0, 1000, device=DEVICE)
    atomic_save(TorchCheckpointIO(), {"state_dict": {"w": weights}, "global_step": 3}, path)

    def onto_the_gpu(as_data):
        return torch.load(path, map_location=DEVICE, weights_only=as_data)

    loaded = read_checkpoint(path, onto_the_gpu)
    assert loaded["state_dict"]["w"].device == DEVICE and torch.equal(loaded["state_dict"]["w"], weights)
    verify_checkpoint(path)
    flip_byte_inside(path, weights)
    for check in (lambda: read_checkpoint(path, onto_the_gpu), lambda: verify_checkpoint(path)):
        with pytest.raises(CheckpointError, match="its entry 'state_dict' does not match"):
            check()
