"""Compressed rounds on a real device (NCCL, and gloo staging through the host): the side stream
reads the buckets only after the compute stream wrote them, and the rounds give what the same
rounds give on the CPU. A world-size-1 group makes the collectives identities, so a wrong value
comes from the ordering of streams or the device's arithmetic, not from other ranks."""

import pytest
import torch
import torch.distributed as dist

from lightning_cocod.core.comm import TorchDistCommunicator
from lightning_cocod.core.compress import CompressedMean, make_codec
from tests.gpu.conftest import DEVICE
from tests.gpu.test_cuda_comm import cycles_for

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_device_rounds_match_the_cpu_rounds(comm, codec):
    torch.manual_seed(0)
    n = 3 * 2048 * 70 + 5  # several slices, and padding
    weights = torch.randn(n)
    on_cpu = CompressedMean(
        TorchDistCommunicator(dist.new_group(backend="gloo"), torch.device("cpu")), make_codec(codec)
    )
    on_device = CompressedMean(comm, make_codec(codec))
    sleep = cycles_for(0.05)
    for _ in range(4):
        weights += 0.01 * torch.randn(n)
        expected = weights.clone()
        on_cpu.start_mean([expected]).wait()
        bucket = torch.zeros(n, device=DEVICE)
        torch.cuda._sleep(sleep)  # the compute stream is busy: the copy below lands late
        bucket.copy_(weights.to(DEVICE, non_blocking=True))
        on_device.start_mean([bucket]).wait()
        got = bucket.cpu()  # on the compute stream, which the wait ordered after the round
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    on_cpu.close()
    on_device.close()
