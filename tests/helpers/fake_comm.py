"""N simulated workers in one process, behind the core's Communicator interface.

Each worker's ``start_mean`` records its weighted contribution (``broadcast``: the source's values); a handle's ``wait`` needs all N
contributions to that collective (it raises otherwise, as a real deadlock would hang) and writes
the weighted sum into the waiting worker's buckets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from lightning_cocod.core.comm import bucket_bytes, ring_bytes


class FakeCluster:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.contributions: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.comms = [FakeComm(self, rank) for rank in range(world_size)]
        self.log: list[tuple[str, int, int]] = []  # (event, rank, collective index)


class FakeComm:
    handle_class: type[FakeHandle]  # set below FakeHandle: what a collective's wait does

    def __init__(self, cluster: FakeCluster, rank: int) -> None:
        self.cluster = cluster
        self.rank = rank
        self.world_size = cluster.world_size
        self._issued = 0

    def _issue(self, buckets, contribution):
        index = self._issued
        self._issued += 1
        self.cluster.contributions.setdefault(index, {})[self.rank] = contribution
        self.cluster.log.append(("launch", self.rank, index))
        return self.handle_class(self, index, list(buckets))

    def start_mean(self, buckets, weight=None):
        share = 1.0 / self.world_size if weight is None else weight
        return self._issue(buckets, [b * share for b in buckets])

    def broadcast(self, buckets, src):
        # A sum of src's values and zeros: weighting the others by 0 would keep their NaN.
        mine = [b.clone() if self.rank == src else torch.zeros_like(b) for b in buckets]
        self._issue(buckets, mine).wait()

    def destroy(self) -> None:
        pass


class FakeHandle:
    comm_seconds = 0.0
    exposed_seconds = 0.0
    blocked_seconds = 0.0
    launched_at = 0.0

    codec_seconds = 0.0

    def __init__(self, comm: FakeComm, index: int, buckets: list[torch.Tensor]) -> None:
        self.comm, self.index, self.buckets = comm, index, buckets
        self.done = False
        # What a ring all-reduce of the buckets would send, as a real exact round counts it.
        self.bytes_sent = self.bytes_received = ring_bytes(bucket_bytes(buckets), comm.world_size)

    def is_completed(self) -> bool:
        return len(self.comm.cluster.contributions[self.index]) == self.comm.world_size

    def figures_ready(self) -> bool:
        return self.done

    def wait(self) -> None:
        if not self.is_completed():
            raise RuntimeError(
                f"rank {self.comm.rank} waits on collective {self.index} not issued by every rank"
            )
        parts = self.comm.cluster.contributions[self.index]
        for i, bucket in enumerate(self.buckets):
            bucket.copy_(sum(parts[r][i] for r in sorted(parts)))
        self.done = True
        self.comm.cluster.log.append(("wait", self.comm.rank, self.index))


class BlockingHandle(FakeHandle):
    """Waits (up to 30 s) for every rank's contribution: workers on threads, a blocking average."""

    def wait(self) -> None:
        deadline = time.monotonic() + 30
        while not self.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001)
        super().wait()


FakeComm.handle_class = FakeHandle


class BlockingComm(FakeComm):
    handle_class = BlockingHandle


class BlockingCluster(FakeCluster):
    def __init__(self, world_size: int) -> None:
        super().__init__(world_size)
        self.comms = [BlockingComm(self, rank) for rank in range(world_size)]


def run_ranks_in_threads(worker: Callable[[int], None], world: int, timeout: float = 60) -> None:
    """``worker(rank)`` on a thread per rank (so that a blocking average waits for the others);
    the first rank's failure is raised here, and a rank still running at the deadline fails."""
    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            worker(rank)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    assert not hung, f"rank(s) {hung} still ran after {timeout} s"
