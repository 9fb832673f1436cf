"""The communicator's CUDA path on a real device: stream order and what the figures measure.

A world-size-1 group makes the all-reduce an identity, so any value that is wrong comes from the
ordering of streams, not from the other ranks. Long sleeps on one stream (``torch.cuda._sleep``)
open the windows a missing dependency would let another stream through.
"""

import time

import pytest
import torch

from lightning_cocod.core import CoCoDRound
from tests.gpu.conftest import DEVICE  # where the ``comm`` fixture's world-size-1 group runs

pytestmark = pytest.mark.timeout(120)


def cycles_for(seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``seconds``, measured here
    (roughly: the SM clock may change; tests time what they rely on)."""
    probe = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(5 * probe)  # the first call pays the set-up, and the clock ramps up
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * seconds / (start.elapsed_time(end) / 1000.0))


def figures_ready_soon(handle, within=1.0):
    """The watcher thread that times the launch wakes a moment after the device passes it."""
    deadline = time.perf_counter() + within
    while not handle.figures_ready() and time.perf_counter() < deadline:
        time.sleep(0.001)
    return handle.figures_ready()


def test_a_round_merges_exactly_with_sleeps_on_either_stream(comm):
    # share 0.9 with one rank: the average is 0.9 * snapshot, so each round ends at
    # x + (0.9 * snap - snap), x's local steps included; the same float32 operations on the CPU
    # give the expectation bit for bit.
    sleep = cycles_for(0.05)
    g = torch.Generator().manual_seed(0)
    x_host = torch.randn(1 << 20, generator=g)
    steps = [torch.randn(1 << 20, generator=g) for _ in range(3)]
    x = x_host.to(DEVICE)
    steps_dev = [s.to(DEVICE) for s in steps]
    round_ = CoCoDRound([x], comm, weight=0.9)
    expected = x_host.clone()
    for r in range(6):
        if r < 3:
            # Delays the side stream's scale and launch: the merge must wait for the landing.
            with torch.cuda.stream(comm._stream):
                torch.cuda._sleep(sleep)
        else:
            # Delays the pack on the compute stream: the side stream must wait before reading it.
            torch.cuda._sleep(sleep)
        x.add_(steps_dev[0])
        expected.add_(steps[0])
        round_.begin()
        snapshot = expected.clone()
        for s, s_dev in zip(steps[1:], steps_dev[1:]):  # the round's local steps
            x.add_(s_dev)
            expected.add_(s)
        round_.finish()
        expected.add_(snapshot * 0.9 - snapshot)
    assert torch.equal(x.cpu(), expected)


def test_comm_seconds_is_the_collective_not_the_round(comm):
    bucket = torch.randn(1 << 24, device=DEVICE)  # 64 MB
    cycles = cycles_for(0.3)
    torch.cuda.synchronize()
    started = time.perf_counter()
    handle = comm.start_mean([bucket])
    torch.cuda._sleep(cycles)  # the round's compute, queued after the launch
    time.sleep(0.3)  # and the host's time spent on it
    handle.wait()
    torch.cuda.synchronize()
    round_seconds = time.perf_counter() - started
    assert round_seconds > 0.3
    assert figures_ready_soon(handle)
    assert 0 < handle.comm_seconds < 0.25 * round_seconds
    assert handle.exposed_seconds < 0.01  # it landed long before the merge


def test_exposed_is_the_compute_streams_stall(comm):
    bucket = torch.randn(1 << 20, device=DEVICE)
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = cycles_for(0.2)
    with torch.cuda.stream(comm._stream):  # the collective cannot start before this sleep ends
        before.record()
        torch.cuda._sleep(cycles)
        after.record()
    handle = comm.start_mean([bucket])
    handle.wait()  # at once: the compute stream stalls until the landing
    torch.cuda.synchronize()
    slept = before.elapsed_time(after) / 1000.0
    assert figures_ready_soon(handle)
    assert 0.9 * slept < handle.exposed_seconds < slept + 0.05
    assert handle.comm_seconds < 0.5 * slept  # the wait before the launch is not the collective's
