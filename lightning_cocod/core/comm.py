"""The communicator: "start a mean all-reduce of these buffers, hand me something to wait on".

The algorithms only ever need that one collective, so it is all the interface has; tests swap
in a fake that simulates N workers in one process (tests/helpers/fake_comm.py).

On CUDA the pack and the launch run on a side stream, and the figures are the collective's own:
with NCCL it lands on the device's timeline (``Work.wait`` makes the *current* stream wait on
NCCL's stream without blocking the host, so an event recorded behind it marks the landing);
gloo on CUDA tensors runs on gloo's host thread and lands when its future completes. Either
way the exposed wait is the compute stream's stall at the merge, timed with events, and
``figures_ready`` says when the figures can be read without making the host wait for the GPU.
The timing logic is tested on a simulated device timeline (tests/core/test_comm_cuda_timing.py);
the GPU tests (tests/gpu/) run it on a real device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class Handle(Protocol):
    def wait(self) -> None:
        """Block until the result is in the buckets (on CUDA: order the current stream after it)."""

    def figures_ready(self) -> bool:
        """Whether ``comm_seconds``, ``exposed_seconds`` and ``launched_at`` can be read now without
        making the host wait (on CUDA they come from events the device may not have reached yet;
        read them a round later). False before ``wait``."""

    # time.perf_counter() when the collective started (on CUDA: when the device reached its launch)
    launched_at: float

    # Host seconds spent inside ``wait`` (on CPU and gloo the wait itself; with NCCL about zero)
    blocked_seconds: float

    @property
    def comm_seconds(self) -> float:
        """Launch to completion of the collective; valid after ``wait``."""

    @property
    def exposed_seconds(self) -> float:
        """Time the caller was held up in ``wait`` (on CUDA: the compute stream's stall)."""

    # What this rank put on the wire and took off it (an exact round: a ring all-reduce's share,
    # ``ring_bytes``; a compressed one counts its encoded chunks), and the seconds spent encoding
    # and decoding (0 for an exact round); valid once ``figures_ready``.
    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...

    @property
    def codec_seconds(self) -> float: ...


def ring_bytes(nbytes: int, world_size: int) -> int:
    """What each rank sends (and receives) in a ring all-reduce of ``nbytes``: 2 (N - 1) / N of it."""
    return 2 * (world_size - 1) * nbytes // max(world_size, 1)


def bucket_bytes(buckets: Sequence[Tensor]) -> int:
    return sum(b.numel() * b.element_size() for b in buckets)


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


@contextmanager
def failures_named() -> Iterator[None]:
    """A collective that fails in the block raises CommunicationError, with its first line.
    DistBackendError and gloo's own errors are RuntimeErrors."""
    try:
        yield
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CommunicationError(
            f"all-reduce on the model-averaging group failed (a worker died, stalled past the group's "
            f"timeout, or the network failed): {first}"
        ) from err


class _Completion:
    """When the last of ``works`` completed, on the host clock ``now``: their futures' callbacks
    run on gloo's thread as each lands, so this is the true completion time, which is what
    "communication hidden" is measured against (``wait`` may come much later)."""

    def __init__(self, works: Sequence[Any], now: Callable[[], float]) -> None:
        self.at: float | None = None

        def on_done(_all: torch.futures.Future) -> None:
            if self.at is None:
                self.at = now()

        torch.futures.collect_all([work.get_future() for work in works]).then(on_done)

    def settle(self, waited_until: float) -> None:
        """After ``wait`` returned: the callback may trail it by a hair."""
        if self.at is None:
            self.at = waited_until


class _CpuHandle:
    def __init__(self, works: list[dist.Work], launched: float, wire_bytes: int) -> None:
        self.bytes_sent = self.bytes_received = wire_bytes
        self.codec_seconds = 0.0
        self._works = works
        self.launched_at = launched
        self.blocked_seconds = 0.0
        self._completion = _Completion(works, time.perf_counter)
        self._waited = False

    def wait(self) -> None:
        start = time.perf_counter()
        with failures_named():
            for work in self._works:
                work.wait()
        end = time.perf_counter()
        self.blocked_seconds = end - start
        self._completion.settle(end)
        self._waited = True

    def figures_ready(self) -> bool:
        return self._waited

    @property
    def comm_seconds(self) -> float:
        assert self._completion.at is not None, "comm_seconds is known only after wait()"
        return self._completion.at - self.launched_at

    @property
    def exposed_seconds(self) -> float:
        return self.blocked_seconds


class DeviceClock(Protocol):
    """The streams, events and host clock the CUDA path orders and times its work with.

    ``CudaClock`` is torch.cuda; tests drive a simulated timeline through the same calls
    (tests/helpers/fake_device.py), so the timing logic is checked where there is no GPU.
    Streams offer ``wait_stream``/``wait_event``; events ``record``/``query``/``synchronize``/
    ``elapsed_time`` (milliseconds), as ``torch.cuda.Stream``/``Event`` do.
    """

    def current_stream(self) -> Any: ...

    def new_stream(self) -> Any: ...

    def new_event(self, blocking: bool = False) -> Any: ...

    def use_stream(self, stream: Any) -> AbstractContextManager: ...

    def now(self) -> float: ...

    def host_time_at(self, event: Any) -> Future:
        """Resolves to the host time (``now``) at which the device reached ``event``."""

    def close(self) -> None: ...


class CudaClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._watcher: ThreadPoolExecutor | None = None

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        # High priority so the pack and the launch are not starved behind queued compute kernels.
        return torch.cuda.Stream(self.device, priority=-1)

    def new_event(self, blocking: bool = False) -> torch.cuda.Event:
        # A blocking event puts a thread that synchronizes on it to sleep instead of spinning.
        return torch.cuda.Event(enable_timing=True, blocking=blocking)

    def use_stream(self, stream: torch.cuda.Stream) -> AbstractContextManager:
        return torch.cuda.stream(stream)

    def now(self) -> float:
        return time.perf_counter()

    def host_time_at(self, event: torch.cuda.Event) -> Future:
        # One thread sleeps until the device gets there (Event.synchronize releases the GIL).
        if self._watcher is None:
            self._watcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cocod-launch-watch")

        def reached() -> float:
            event.synchronize()
            return time.perf_counter()

        return self._watcher.submit(reached)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.shutdown(wait=False)
            self._watcher = None


class _DeviceHandle:
    """What both CUDA paths share: the merge, on the compute stream, is ordered after the landing,
    and that stream's stall (events on either side of the ordering) is the exposed wait.

    The start is the host time at which the device reached the launch (a watcher thread), not
    the time the host queued it: a host running steps ahead of the GPU would otherwise count
    its lead as communication.
    """

    def __init__(
        self, clock: DeviceClock, works: list[Any], launched: Any, queued_at: float, wire_bytes: int
    ) -> None:
        self.bytes_sent = self.bytes_received = wire_bytes
        self.codec_seconds = 0.0
        self._clock, self._works, self._launched = clock, works, launched
        self._started = clock.host_time_at(launched)
        self._queued_at = queued_at
        self._stall = (clock.new_event(), clock.new_event())
        self._waited = False
        self.blocked_seconds = 0.0

    def _order_after_landing(self, compute: Any) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        compute = self._clock.current_stream()
        stall_start, stall_end = self._stall
        stall_start.record(compute)
        began = self._clock.now()
        with failures_named():
            self._order_after_landing(compute)
        self.blocked_seconds = self._clock.now() - began
        stall_end.record(compute)
        self._waited = True

    def figures_ready(self) -> bool:
        # The compute stream passed stall_end only after the landing: every event is done then.
        return self._waited and self._stall[1].query() and self._started.done()

    @property
    def launched_at(self) -> float:
        return self._started.result() if self._started.done() else self._queued_at

    @property
    def exposed_seconds(self) -> float:
        stall_start, stall_end = self._stall
        stall_end.synchronize()
        return stall_start.elapsed_time(stall_end) / 1000.0


class _StreamLandedHandle(_DeviceHandle):
    """NCCL: the collective lands on the device's timeline, marked by ``landed`` on the side
    stream right after the launch (``Work.wait`` there orders the side stream after NCCL's stream
    without blocking the host), so launch to landing is the collective's own time."""

    def __init__(
        self,
        clock: DeviceClock,
        works: list[Any],
        launched: Any,
        landed: Any,
        queued_at: float,
        wire_bytes: int,
    ) -> None:
        super().__init__(clock, works, launched, queued_at, wire_bytes)
        self._landed = landed

    def _order_after_landing(self, compute: Any) -> None:
        compute.wait_event(self._landed)

    @property
    def comm_seconds(self) -> float:
        self._landed.synchronize()
        return self._launched.elapsed_time(self._landed) / 1000.0


class _HostLandedHandle(_DeviceHandle):
    """gloo on CUDA tensors: the all-reduce runs on gloo's host thread (copies to and from pinned
    memory around it), and ``Work.wait`` blocks the host, so it is called only at finish. The
    collective is done when its future completes, on the host clock, like ``_CpuHandle``.

    Which stream ``Work.wait`` orders after the copy back differs between torch versions (the
    current one, or the one current at the launch): called with the side stream current, both
    mean the side stream, and the compute stream then waits for that.
    """

    def __init__(
        self,
        clock: DeviceClock,
        works: list[Any],
        launched: Any,
        queued_at: float,
        side: Any,
        wire_bytes: int,
    ) -> None:
        super().__init__(clock, works, launched, queued_at, wire_bytes)
        self._side = side
        self._completion = _Completion(works, clock.now)

    def _order_after_landing(self, compute: Any) -> None:
        with self._clock.use_stream(self._side):
            for work in self._works:
                work.wait()
        self._completion.settle(self._clock.now())
        compute.wait_stream(self._side)

    @property
    def comm_seconds(self) -> float:
        assert self._completion.at is not None, "comm_seconds is known only after wait()"
        return max(0.0, self._completion.at - self._started.result())


def start_on_device(
    clock: DeviceClock,
    side: Any,
    buckets: Sequence[Tensor],
    share: float,
    all_reduce: Callable[[Tensor], Any],
    lands_on_stream: bool,
    world_size: int,
) -> Handle:
    """Scale and all-reduce ``buckets`` (over ``world_size`` ranks, for the bytes it counts) from
    the side stream ``side``; returns the handle.

    With ``lands_on_stream`` (NCCL) the side stream then waits for the collective, so nothing
    queued on it later runs before this round has landed: queue there only what may wait for it.
    """
    compute = clock.current_stream()
    wire = ring_bytes(bucket_bytes(buckets), world_size)
    # The buckets were packed on the compute stream: the side stream must not read them earlier.
    side.wait_stream(compute)
    with clock.use_stream(side):
        launched = clock.new_event(blocking=True)
        launched.record(side)
        queued_at = clock.now()
        for bucket in buckets:
            bucket.mul_(share)
        works = [all_reduce(bucket) for bucket in buckets]
        if not lands_on_stream:
            return _HostLandedHandle(clock, works, launched, queued_at, side, wire)
        with failures_named():
            for work in works:
                work.wait()  # orders the side stream after NCCL's; the host does not block
        landed = clock.new_event()
        landed.record(side)
    return _StreamLandedHandle(clock, works, launched, landed, queued_at, wire)


def device_backend(group: dist.ProcessGroup | None, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors on ``group`` ("cpu:gloo,cuda:nccl" -> "nccl")."""
    backend = str(dist.get_backend(group)).lower()
    for part in backend.split(","):
        kind, _, name = part.partition(":")
        if name and kind.strip() == device.type:
            return name.strip()
    return backend


class TorchDistCommunicator:
    """All-reduce on a process group of its own.

    Lightning's collectives (``self.log(sync_dist=True)``, barriers, ``reduce_boolean_decision``)
    stay on the default group, so they never queue behind a model-sized all-reduce in flight,
    nor interleave with it (Lightning PR #9446 moved model averaging out of the optimizer step
    for exactly that data race).

    On CUDA the pack and the launch run on a side stream; ``clock`` replaces torch.cuda there
    (tests). NCCL lands on the device's timeline, gloo on CUDA tensors on the host's.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, device: torch.device, clock: DeviceClock | None = None
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = device
        self._clock = clock if clock is not None else CudaClock(device) if device.type == "cuda" else None
        self._stream = self._clock.new_stream() if self._clock is not None else None
        self.lands_on_stream = self._clock is not None and device_backend(group, device) == "nccl"

    @classmethod
    def on_new_group(cls, device: torch.device, backend: str | None = None, timeout: timedelta | None = None):
        """Create the dedicated group; a collective call, every rank must make it in the same order."""
        group = dist.new_group(backend=backend, timeout=timeout)
        return cls(group, device)

    def _all_reduce(self, bucket: Tensor) -> dist.Work:
        with failures_named():
            return dist.all_reduce(bucket, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def start_mean(self, buckets: Sequence[Tensor], weight: float | None = None) -> Handle:
        share = 1.0 / self.world_size if weight is None else float(weight)
        if self._clock is None:
            launched = time.perf_counter()
            for bucket in buckets:
                bucket.mul_(share)
            wire = ring_bytes(bucket_bytes(buckets), self.world_size)
            return _CpuHandle([self._all_reduce(b) for b in buckets], launched, wire)
        return start_on_device(
            self._clock, self._stream, buckets, share, self._all_reduce, self.lands_on_stream, self.world_size
        )

    def broadcast(self, buckets: Sequence[Tensor], src: int) -> None:
        with failures_named():
            for bucket in buckets:
                dist.broadcast(bucket, src=dist.get_global_rank(self.group, src), group=self.group)

    def destroy(self) -> None:
        if self._clock is not None:
            self._clock.close()
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group(self.group)
        self.group = None
