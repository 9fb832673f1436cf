"""The communicator: "start a mean all-reduce of these buffers, hand me something to wait on".

The algorithms only ever need that one collective, so it is all the interface has; tests swap
in a fake that simulates N workers in one process (tests/helpers/fake_comm.py).

GPU status: the CUDA path below (side stream, events) follows the NCCL semantics documented in
torch 2.13 (``Work.wait`` makes the *current* stream wait on the NCCL stream; ProcessGroupNCCL
makes its stream wait on the caller's current stream before the kernel). It has NOT been run on
a GPU yet: CI and the development machine are CPU-only. The gloo path is tested on 2 processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class Handle(Protocol):
    def wait(self) -> None:
        """Block until the result is in the buffers (on CUDA: order the current stream after it)."""

    def is_completed(self) -> bool: ...

    # time.perf_counter() when the collective was launched
    launched_at: float

    @property
    def comm_seconds(self) -> float:
        """Launch to completion of the collective; valid after ``wait``."""

    @property
    def exposed_seconds(self) -> float:
        """Time the caller was held up in ``wait`` (on CUDA: the compute stream's stall)."""


class Communicator(Protocol):
    rank: int
    world_size: int

    def start_mean(self, buckets: Sequence[Tensor], weight: float | None = None) -> Handle:
        """Start a non-blocking all-reduce that leaves ``sum_j weight_j * bucket_j`` in every rank's buckets.

        ``weight`` is this rank's share (the shares of all ranks sum to one); ``None`` means 1/N,
        the plain mean. The buckets must not be touched until the handle's ``wait`` returns.
        """

    def broadcast(self, buckets: Sequence[Tensor], src: int) -> None:
        """Blocking: every rank's buckets take rank ``src``'s (recovery after non-finite values)."""

    def destroy(self) -> None:
        """Release the process group (or whatever carries the collectives)."""


class CommunicationError(RuntimeError):
    """A collective of ours failed: a peer died, hung past the group's timeout, or the link broke."""


def _failed(err: BaseException) -> CommunicationError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CommunicationError(
        f"all-reduce on the model-averaging group failed (a worker died, stalled past the group's "
        f"timeout, or the network failed): {first}"
    )


def _share(weight: float | None, world_size: int) -> float:
    return 1.0 / world_size if weight is None else float(weight)


class _CpuHandle:
    def __init__(self, works: list[dist.Work], launched: float) -> None:
        self._works = works
        self.launched_at = launched
        self._completed: float | None = None
        self._exposed = 0.0
        remaining = [len(works)]

        def on_done(_future: object) -> None:
            # Runs on gloo's thread when the last bucket lands: the true completion time, which
            # is what "communication hidden" is measured against (wait() may come much later).
            remaining[0] -= 1
            if remaining[0] == 0:
                self._completed = time.perf_counter()

        for work in works:
            work.get_future().then(on_done)

    def wait(self) -> None:
        start = time.perf_counter()
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as err:  # DistBackendError and gloo's own errors are RuntimeErrors
            raise _failed(err) from err
        end = time.perf_counter()
        self._exposed = end - start
        if self._completed is None:  # the callback may trail wait() by a hair
            self._completed = end

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    @property
    def comm_seconds(self) -> float:
        assert self._completed is not None, "comm_seconds is known only after wait()"
        return self._completed - self.launched_at

    @property
    def exposed_seconds(self) -> float:
        return self._exposed


class _CudaHandle:
    def __init__(self, works: list[dist.Work], comm_stream: torch.cuda.Stream, launched: torch.cuda.Event) -> None:
        self._works = works
        self._comm_stream = comm_stream
        self._launched = launched
        self.launched_at = time.perf_counter()
        self._landed = torch.cuda.Event(enable_timing=True)
        self._stall_start = torch.cuda.Event(enable_timing=True)
        self._stall_end = torch.cuda.Event(enable_timing=True)

    def wait(self) -> None:
        compute = torch.cuda.current_stream(self._comm_stream.device)
        with torch.cuda.stream(self._comm_stream):
            for work in self._works:
                work.wait()  # the comm stream now waits on NCCL's internal stream, not the CPU
            self._landed.record(self._comm_stream)
        # The merge runs on the compute stream: it must not read the buckets before they land.
        self._stall_start.record(compute)
        compute.wait_event(self._landed)
        self._stall_end.record(compute)

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    @property
    def comm_seconds(self) -> float:
        self._landed.synchronize()
        return self._launched.elapsed_time(self._landed) / 1000.0

    @property
    def exposed_seconds(self) -> float:
        self._stall_end.synchronize()
        return self._stall_start.elapsed_time(self._stall_end) / 1000.0


class TorchDistCommunicator:
    """All-reduce on a process group of its own.

    Lightning's collectives (``self.log(sync_dist=True)``, barriers, ``reduce_boolean_decision``)
    stay on the default group, so they never queue behind a model-sized all-reduce in flight,
    nor interleave with it (Lightning PR #9446 moved model averaging out of the optimizer step
    for exactly that data race).
    """

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device
        # High priority so the pack and the launch are not starved behind queued compute kernels.
        self._stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None

    @classmethod
    def on_new_group(cls, device: torch.device, backend: str | None = None, timeout: timedelta | None = None):
        """Create the dedicated group; a collective call, every rank must make it in the same order."""
        group = dist.new_group(backend=backend, timeout=timeout)
        return cls(group, device)

    def start_mean(self, buckets: Sequence[Tensor], weight: float | None = None) -> Handle:
        share = _share(weight, self.world_size)
        if self._stream is None:
            launched = time.perf_counter()
            for bucket in buckets:
                bucket.mul_(share)
            try:
                works = [dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.group, async_op=True) for b in buckets]
            except RuntimeError as err:
                raise _failed(err) from err
            return _CpuHandle(works, launched)

        compute = torch.cuda.current_stream(self.device)
        # The buckets were packed on the compute stream: the side stream must not read them earlier.
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            launched = torch.cuda.Event(enable_timing=True)
            launched.record(self._stream)
            for bucket in buckets:
                bucket.mul_(share)
            works = [dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.group, async_op=True) for b in buckets]
        return _CudaHandle(works, self._stream, launched)

    def broadcast(self, buckets: Sequence[Tensor], src: int) -> None:
        try:
            for bucket in buckets:
                dist.broadcast(bucket, src=dist.get_global_rank(self.group, src), group=self.group)
        except RuntimeError as err:
            raise _failed(err) from err

    def destroy(self) -> None:
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)
        self.group = None
