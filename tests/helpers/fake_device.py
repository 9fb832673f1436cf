"""A simulated GPU and host on one clock, with CUDA's ordering rules, behind the calls of
``lightning_cocod.core.comm.DeviceClock`` (the CUDA path's timing, tested without a GPU).

Times are seconds. The host is at ``timeline.host``; each stream finishes its queued work at
its ``tail``. Work queued at host time h starts no earlier than h and no earlier than the end of
what its stream already holds; an event completes when its stream reaches it. Collectives are
fake works: an NCCL one lands on the device timeline a fixed time after the stream that launched
it reaches the launch; a gloo one completes on the host clock (its future) and copies back.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future

import torch


class FakeStream:
    def __init__(self, timeline: FakeTimeline, name: str) -> None:
        self.timeline, self.name, self.tail = timeline, name, 0.0

    def wait_stream(self, other: FakeStream) -> None:
        self.tail = max(self.tail, other.tail)

    def wait_event(self, event: FakeEvent) -> None:
        assert event.time is not None, "waiting on an event never recorded"
        self.tail = max(self.tail, event.time)


class FakeEvent:
    def __init__(self, timeline: FakeTimeline, blocking: bool = False) -> None:
        self.timeline, self.blocking, self.time = timeline, blocking, None

    def record(self, stream: FakeStream) -> None:
        self.time = stream.tail = max(stream.tail, self.timeline.host)

    def query(self) -> bool:
        return self.time is not None and self.time <= self.timeline.host

    def synchronize(self) -> None:
        assert self.time is not None, "synchronizing on an event never recorded"
        if self.time > self.timeline.host:
            self.timeline.syncs += 1
        self.timeline.advance_to(self.time)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.query() and end.query(), "elapsed_time of events the device has not reached"
        return (end.time - self.time) * 1000.0


class FakeTimeline:
    def __init__(self) -> None:
        self.host = 0.0
        self.compute = FakeStream(self, "compute")
        self.current = self.compute
        self.syncs = 0  # how often the host had to wait for the device to reach an event
        self._pending: list[tuple[float, object]] = []  # (host time, callback or future to settle)

    # -- DeviceClock --
    def current_stream(self) -> FakeStream:
        return self.current

    def new_stream(self) -> FakeStream:
        return FakeStream(self, "side")

    def new_event(self, blocking: bool = False) -> FakeEvent:
        return FakeEvent(self, blocking)

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream):
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def now(self) -> float:
        return self.host

    def host_time_at(self, event: FakeEvent) -> Future:
        future: Future = Future()
        self.at(event.time, lambda: future.set_result(event.time))
        return future

    def close(self) -> None:
        pass

    # -- driving the simulation --
    def at(self, when: float, action) -> None:
        if when <= self.host:
            action()
        else:
            self._pending.append((when, action))

    def advance_to(self, when: float) -> None:
        """The host moves on to ``when`` (never back), settling what falls due on the way at the
        time it falls due (a callback reading ``now`` sees its own time)."""
        while True:
            due = [p for p in self._pending if p[0] <= when]
            if not due:
                break
            first = min(due, key=lambda p: p[0])
            self._pending.remove(first)
            self.host = max(self.host, first[0])
            first[1]()
        self.host = max(self.host, when)

    def advance(self, seconds: float) -> None:
        self.advance_to(self.host + seconds)

    def kernel(self, seconds: float, stream: FakeStream | None = None) -> None:
        """Queue ``seconds`` of device work on ``stream`` (default: the current stream)."""
        stream = stream or self.current
        stream.tail = max(stream.tail, self.host) + seconds


class _FakeWork:
    def __init__(self, timeline: FakeTimeline, seconds: float) -> None:
        self.timeline = timeline
        # Both backends start once the launching stream has reached the launch.
        self.start = max(timeline.current.tail, timeline.host)
        self.done = self.start + seconds
        self.host_waits = 0

    def get_future(self) -> torch.futures.Future:
        """Completes when the host reaches the collective's end, as gloo's thread would mark it."""
        future = torch.futures.Future()
        self.timeline.at(self.done, lambda: future.set_result(None))
        return future


class FakeNcclWork(_FakeWork):
    def is_completed(self) -> bool:
        return self.done <= self.timeline.host

    def wait(self) -> None:
        # ProcessGroupNCCL: the current stream waits on NCCL's stream; the host goes on.
        self.timeline.current.tail = max(self.timeline.current.tail, self.done)


class FakeGlooWork(_FakeWork):
    """``orders``: which stream ``wait`` orders after the copy back, the one current at the wait
    (torch up to 2.x) or the one current at the launch (later ProcessGroupGloo)."""

    def __init__(
        self, timeline: FakeTimeline, seconds: float, copy_back: float = 0.0, orders: str = "current"
    ) -> None:
        super().__init__(timeline, seconds)
        self.copy_back, self.orders = copy_back, orders
        self.launch_stream = timeline.current

    def is_completed(self) -> bool:
        return self.done <= self.timeline.host

    def wait(self) -> None:
        # The host blocks until gloo's thread is done, then a stream is ordered after the copy
        # back to the device.
        self.host_waits += 1
        self.timeline.advance_to(self.done)
        stream = self.timeline.current if self.orders == "current" else self.launch_stream
        stream.tail = max(stream.tail, self.done + self.copy_back)
