"""The outer round (``core.outer.OuterRound``: theta, a Nesterov outer SGD) on a real device,
against the same computation on the CPU in plain tensors, at overlap 0, 1 and the whole period,
over NCCL and gloo (the ``comm`` fixture's world-size-1 groups; two ranks through the Trainer,
and over NCCL with a GPU each, are test_cuda_trainer's).

The round runs as CoCoD's does: the snapshot and Delta on the compute stream, the scale and the
all-reduce on the side stream after it, and the outer step and the merge on the compute stream
ordered after the landing by an event (NCCL) without the host waiting. Sleeps on either stream
open the windows a missing dependency would let the other stream through.
"""

import functools
import time

import pytest
import torch

from lightning_cocod.core.outer import OuterRound
from tests.gpu.conftest import DEVICE
from tests.gpu.test_cuda_comm import cycles_for

pytestmark = pytest.mark.timeout(120)

TAU, ROUNDS, SHARE, LR, MOMENTUM, SIZE = 3, 4, 0.9, 0.7, 0.9, 1 << 20
NESTEROV = functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM, nesterov=True)


def outer_rule(x, steps, overlap):
    """In float64 on the CPU: the live tensor, theta and the momentum after every round of
    ``steps`` (a list of TAU increments per round), the snapshot before step TAU - overlap
    (after the last at overlap 0), Delta scaled by the one rank's share SHARE."""
    x, theta, buffer = x.double(), x.double(), None
    for increments in steps:
        snapshot = None
        for k, increment in enumerate(increments):
            if k == TAU - overlap:
                snapshot = x.clone()
            x = x + increment.double()
        snapshot = x.clone() if snapshot is None else snapshot
        delta = SHARE * (theta - snapshot)
        buffer = delta if buffer is None else MOMENTUM * buffer + delta
        theta = theta - LR * (delta + MOMENTUM * buffer)
        x = theta + (x - snapshot)
    return x, theta, buffer


def _begin(round_, comm, index, cycles):
    if index % 2 == 0:
        with torch.cuda.stream(comm._stream):  # delays the landing: the merge must wait for it
            torch.cuda._sleep(cycles)
    else:
        torch.cuda._sleep(cycles)  # delays the snapshot: the side stream must not read it earlier
    round_.begin()


@pytest.mark.parametrize("overlap", [0, 1, TAU])
def test_the_outer_round_on_cuda_is_the_rule_in_plain_tensors(comm, overlap):
    cycles = cycles_for(0.05)
    g = torch.Generator().manual_seed(0)
    x_host = torch.randn(SIZE, generator=g)
    steps = [[0.01 * torch.randn(SIZE, generator=g) for _ in range(TAU)] for _ in range(ROUNDS)]
    x = x_host.to(DEVICE)
    round_ = OuterRound([x], comm, NESTEROV, weight=SHARE)
    for index, increments in enumerate(steps):
        for k, increment in enumerate(increments):
            if k == TAU - overlap:
                _begin(round_, comm, index, cycles)
            x.add_(increment.to(DEVICE))
        if overlap == 0:
            _begin(round_, comm, index, cycles)
        round_.finish()
    want_x, want_theta, want_momentum = outer_rule(x_host, steps, overlap)
    theta = round_.theta.buckets
    momentum = [round_.optimizer.state[b]["momentum_buffer"] for b in theta]
    # The outer state lives beside the model: no host round trip in any round.
    assert all(t.device == DEVICE for t in [*theta, *momentum])
    # float32 on the device against float64: a few roundings of values near 1 per round.
    for got, want in [(x, want_x), (torch.cat(theta), want_theta), (torch.cat(momentum), want_momentum)]:
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("comm", ["nccl"], indirect=True)  # gloo's landing is on the host by design
def test_the_outer_step_is_queued_behind_the_landing_while_the_host_goes_on(comm):
    x = torch.zeros(SIZE, device=DEVICE)
    round_ = OuterRound([x], comm, NESTEROV)
    cycles = cycles_for(0.5)
    for _ in range(2):  # the first round pays the set-up; the second is timed
        torch.cuda.synchronize()
        x_host = x.cpu().double()
        x.add_(1.0)
        with torch.cuda.stream(comm._stream):  # the landing comes 0.5 s after the launch
            torch.cuda._sleep(cycles)
        round_.begin()
        started = time.perf_counter()
        round_.finish()
        queued = time.perf_counter() - started
        # Still in flight when finish returned: a host wait (an .item(), a synchronize, a CPU
        # step) in the outer step would have held the host until the landing.
        assert not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
    assert queued < 0.1
    # The second round from theta = x_host (the first round's merge left x = theta): Delta = -1.
    # Nesterov's first buffer was the first round's Delta, also -1.
    buffer = MOMENTUM * -1.0 + -1.0
    theta = x_host - LR * (-1.0 + MOMENTUM * buffer)
    torch.testing.assert_close(x.cpu().double(), theta, rtol=0, atol=1e-5)
