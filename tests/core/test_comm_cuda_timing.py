"""The CUDA path's communication figures on a simulated device timeline (no GPU needed).

Each case sets when the all-reduce lands and when the round finishes, and checks the figures
against that timeline by hand: communication is launch to landing whatever the period, the
exposed wait is the compute stream's stall, and figures are readable without a host wait once
``figures_ready`` says so. tests/gpu/ repeats the essentials on a real device.
"""

import pytest
import torch
import torch.distributed as dist

from lightning_cocod.core.comm import TorchDistCommunicator, device_backend, start_on_device
from tests.helpers.fake_device import FakeGlooWork, FakeNcclWork, FakeTimeline


def launch(timeline, seconds, nccl=True, copy_back=0.0, buckets=None, orders="current"):
    side = timeline.new_stream()
    buckets = buckets if buckets is not None else [torch.ones(4)]
    if nccl:
        all_reduce = lambda bucket: FakeNcclWork(timeline, seconds)
    else:
        all_reduce = lambda bucket: FakeGlooWork(timeline, seconds, copy_back, orders)
    handle = start_on_device(timeline, side, buckets, 0.5, all_reduce, lands_on_stream=nccl, world_size=4)
    return handle, side


@pytest.mark.parametrize("nccl", [True, False], ids=["nccl", "gloo"])
def test_finish_long_after_landing_counts_the_collective_not_the_round(nccl):
    timeline = FakeTimeline()
    handle, _ = launch(timeline, 0.3, nccl)
    timeline.advance_to(1.0)  # the round's local steps
    handle.wait()
    assert handle.figures_ready()
    syncs = timeline.syncs
    assert handle.comm_seconds == pytest.approx(0.3)  # not 1.0, the round's length
    assert handle.exposed_seconds == 0.0
    assert handle.blocked_seconds == 0.0
    assert handle.launched_at == 0.0
    # A ring all-reduce of the 16-byte bucket over 4 ranks sends and takes 2 (4 - 1) / 4 of it.
    assert (handle.bytes_sent, handle.bytes_received, handle.codec_seconds) == (24, 24, 0.0)
    assert timeline.syncs == syncs and timeline.host == 1.0  # reading them made the host wait for nothing


@pytest.mark.parametrize("nccl", [True, False], ids=["nccl", "gloo"])
def test_finish_before_landing_exposes_the_rest_of_the_collective(nccl):
    timeline = FakeTimeline()
    handle, _ = launch(timeline, 0.3, nccl)
    timeline.advance_to(0.1)
    handle.wait()
    if nccl:
        # The host only queued the ordering: it is still at 0.1, the device stalls until 0.3.
        assert timeline.host == 0.1 and handle.blocked_seconds == 0.0
        assert not handle.figures_ready()
        timeline.advance_to(0.35)
        assert handle.figures_ready()
    else:
        # gloo's wait blocks the host until its thread is done.
        assert timeline.host == pytest.approx(0.3) and handle.blocked_seconds == pytest.approx(0.2)
        assert handle.figures_ready()
    assert handle.comm_seconds == pytest.approx(0.3)
    assert handle.exposed_seconds == pytest.approx(0.2)  # landing (0.3) - finish (0.1)


@pytest.mark.parametrize("orders", ["current", "launch"])
def test_gloo_merge_waits_for_the_copy_back_whichever_stream_wait_orders(orders):
    timeline = FakeTimeline()
    handle, _ = launch(timeline, 0.3, nccl=False, copy_back=0.02, orders=orders)
    timeline.advance_to(0.1)
    handle.wait()
    assert timeline.compute.tail == pytest.approx(0.32)  # the merge comes after the copy back
    assert handle.comm_seconds == pytest.approx(0.3)
    assert handle.exposed_seconds == pytest.approx(0.22)


@pytest.mark.parametrize("nccl", [True, False], ids=["nccl", "gloo"])
def test_a_host_ahead_of_the_device_counts_neither_its_lead_nor_queued_compute(nccl):
    timeline = FakeTimeline()
    timeline.kernel(0.5)  # compute queued before the launch: the pack runs after it
    handle, _side = launch(timeline, 0.3, nccl)
    timeline.kernel(0.5)  # the round's steps, queued while the host runs ahead
    timeline.advance_to(0.2)
    handle.wait()  # the device is busy until 1.0, long after the landing at 0.8
    timeline.advance_to(2.0)
    assert handle.figures_ready()
    assert handle.comm_seconds == pytest.approx(0.3)  # not 0.8 (from the host's launch)
    assert handle.launched_at == pytest.approx(0.5)  # when the device reached the launch
    assert handle.exposed_seconds == 0.0


@pytest.mark.parametrize("nccl", [True, False], ids=["nccl", "gloo"])
def test_stream_order_pack_then_collective_then_merge(nccl):
    timeline = FakeTimeline()
    timeline.kernel(0.4)  # packing the snapshot on the compute stream
    handle, side = launch(timeline, 0.3, nccl)
    handle.wait()
    # The compute stream (where the merge runs) waits for the collective to land.
    assert timeline.compute.tail == pytest.approx(0.7)
    timeline.advance_to(1.0)
    # The side stream waited for the pack before scaling the buckets and launching.
    assert handle.launched_at == pytest.approx(0.4) and handle.comm_seconds == pytest.approx(0.3)
    if nccl:
        # The side stream itself waits for the landing: work queued there later comes after it.
        assert side.tail == pytest.approx(0.7)


def test_figures_read_early_still_come_out_right_at_the_cost_of_a_host_wait():
    timeline = FakeTimeline()
    handle, _ = launch(timeline, 0.3, nccl=True)
    timeline.advance_to(0.1)
    handle.wait()
    assert not handle.figures_ready()
    assert handle.exposed_seconds == pytest.approx(0.2)
    assert timeline.syncs >= 1 and timeline.host == pytest.approx(0.3)


def test_the_buckets_are_scaled_by_the_share_on_the_side_stream():
    timeline, bucket = FakeTimeline(), torch.full((3,), 4.0)
    launch(timeline, 0.1, nccl=True, buckets=[bucket])
    assert bucket.tolist() == [2.0, 2.0, 2.0]


def test_the_backend_carrying_a_device_is_picked_from_a_mixed_group(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert device_backend(None, torch.device("cuda", 0)) == "nccl"
    assert device_backend(None, torch.device("cpu")) == "gloo"
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert device_backend(None, torch.device("cuda", 0)) == "gloo"


@pytest.mark.timeout(60)
def test_a_gloo_group_takes_the_host_landed_path_and_reduces():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    timeline = FakeTimeline()
    comm = TorchDistCommunicator(dist.group.WORLD, torch.device("cpu"), clock=timeline)
    assert not comm.lands_on_stream
    bucket = torch.tensor([1.0, 2.0, 4.0])
    handle = comm.start_mean([bucket], 0.25)
    handle.wait()
    assert bucket.tolist() == [0.25, 0.5, 1.0]  # one rank: its share of its own values
    assert handle.figures_ready() and handle.comm_seconds == 0.0 and handle.exposed_seconds == 0.0
    comm.destroy()
