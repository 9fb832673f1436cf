"""The update rules, over plain tensors and a communicator (no Lightning here).

CoCoD-SGD (Shen et al., IJCAI 2019, arXiv:1906.12043), one round on worker i:
    begin:   snap_i <- x_i;  start the all-reduce  avg <- sum_j p_j snap_j   (p_j = 1/N by default)
             ... tau local optimizer steps run while it is in flight ...
    finish:  wait;  x_i <- avg + (x_i - snap_i)
``progress`` (lambda) generalises the merge to x_i <- avg + lambda (x_i - snap_i): a worker keeps
only that share of its own progress since the round began (see ``CoCoDRound``).
Local-SGD averages the live model, blocking. Pipe-SGD all-reduces gradients one step stale.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_cocod._options import number
from lightning_cocod.core.comm import Communicator, Handle
from lightning_cocod.core.flat import FlatBuffer

# What CoCoDStrategy keeps of a round's progress unless told otherwise: the paper's rule. Keeping
# less helped on the MNIST-1D accuracy study (docs/accuracy/mnist1d-study.md) only where the learning rate was at its largest.
DEFAULT_PROGRESS = 1.0


def check_progress(owner: str, progress: object) -> float:
    """``progress`` as a float, or a one-line ValueError naming ``owner`` and what is accepted."""
    accepted = (
        "a positive number (1: the paper's merge; above 1 an outer step beyond the workers' mean "
        "progress, as with AdamW's local moments)"
    )
    return number(owner, "progress", progress, accepted, above=0.0)


class SnapshotRound(ABC):
    """What every snapshot round shares: the snapshot ``s`` of the live tensors at ``begin``, the
    buffer the all-reduce works in, and the one pending handle. A subclass says what the buffer
    holds (``_to_reduce``) and how the live tensors take the result (``finish``)."""

    def __init__(self, tensors: Sequence[Tensor], comm: Communicator, weight: float | None = None) -> None:
        self.tensors = list(tensors)
        self.comm = comm
        self.weight = weight
        self.snapshot = FlatBuffer(self.tensors)
        self.average = FlatBuffer(self.tensors)
        self.handle: Handle | None = None

    @property
    def pending(self) -> bool:
        return self.handle is not None

    @property
    def nbytes(self) -> int:
        return self.average.nbytes

    @abstractmethod
    def _to_reduce(self) -> None:
        """Fill ``average`` from the snapshot just taken."""

    def begin(self) -> Handle:
        if self.handle is not None:
            raise RuntimeError(
                f"{type(self).__name__}.begin() called while the previous round is still pending"
            )
        self.snapshot.pack(self.tensors)
        self._to_reduce()
        self.handle = self.comm.start_mean(self.average.buckets, self.weight)
        return self.handle

    def _landed(self, verb: str) -> Handle:
        if self.handle is None:
            raise RuntimeError(f"{type(self).__name__}.{verb}() called with no round pending")
        handle, self.handle = self.handle, None
        handle.wait()
        return handle

    def abandon(self) -> Handle:
        """Wait for the round's all-reduce and drop it: nothing is merged."""
        return self._landed("abandon")


class CoCoDRound(SnapshotRound):
    """A round in two verbs, ``begin`` and ``finish``, over persistent flat buffers.

    Memory: two flat copies of the tensors (the snapshot, and the buffer the all-reduce works
    in). The live tensors are never all-reduced: they change during the round.

    ``progress`` is the share lambda of its own progress a worker keeps at the merge,
    ``x_i <- avg + lambda (x_i - snap_i)``. The paper's rule is lambda = 1: the mean over workers
    is preserved, but each worker also keeps its own deviation from the others for one more
    round, so just before a merge the workers are two rounds of noise apart (Local-SGD: one), and
    a large learning rate makes them drift (see the MNIST-1D accuracy study (docs/accuracy/mnist1d-study.md)). lambda < 1 shrinks
    what separates the workers by that factor at every merge, at the price of moving the mean by
    only lambda of a round's progress: an outer learning rate, which helps where the inner one is
    too large for the period and costs accuracy elsewhere (docs/accuracy/mnist1d-study.md). lambda > 1 moves
    the mean further than the workers went, and separates them by as much more: where each
    worker's optimizer normalises its own steps (Adam's second moment, estimated on one worker's
    batch), the mean of N workers' steps is about 1/sqrt(N) of one step on their combined batch,
    and lambda = sqrt(N) restores it (docs/accuracy/language-model.md).
    """

    def __init__(
        self,
        tensors: Sequence[Tensor],
        comm: Communicator,
        weight: float | None = None,
        progress: float = DEFAULT_PROGRESS,
    ) -> None:
        super().__init__(tensors, comm, weight)
        self.progress = check_progress("CoCoDRound", progress)

    def _to_reduce(self) -> None:
        self.average.copy_(self.snapshot)

    def finish(self) -> Handle:
        handle = self._landed("finish")
        if self.progress != 1.0:
            # x <- avg + lambda (x - snap), in place on the live tensors.
            torch._foreach_sub_(self.tensors, self.snapshot.views)
            torch._foreach_mul_(self.tensors, self.progress)
            torch._foreach_add_(self.tensors, self.average.views)
            return handle
        # x + (avg - snap) rather than avg + (x - snap): the correction is exactly zero when the
        # average equals the snapshot, so one worker (or a first round from identical models)
        # leaves x bit for bit as plain SGD would.
        for average, snapshot in zip(self.average.buckets, self.snapshot.buckets, strict=True):
            average.sub_(snapshot)
        torch._foreach_add_(self.tensors, self.average.views)
        return handle

    def settle(self) -> Handle:
        """Wait for the round and leave its average to the exact one that follows (a synchronisation
        point): ``x <- (1 - lambda) snap + lambda x``, whose mean over the workers is the rule's
        ``avg + lambda (x - snap)`` with the exact mean of the snapshots, whatever the round's own
        average was (a compressed one carries the codec's error)."""
        handle = self._landed("settle")
        if self.progress != 1.0:
            torch._foreach_mul_(self.tensors, self.progress)
            torch._foreach_add_(self.tensors, self.snapshot.views, alpha=1.0 - self.progress)
        return handle


def average_blocking(
    tensors: Sequence[Tensor],
    scratch: FlatBuffer,
    comm: Communicator,
    weight: float | None = None,
    check: Callable[[list[Tensor]], None] | None = None,
    swap: bool = False,
) -> Handle:
    """x_i <- sum_j p_j x_j, waiting for the result (Local-SGD's step, and every consistency point).

    ``check`` sees the packed buckets before anything is sent (and may raise); with ``swap`` the
    tensors take the average and the scratch buffer keeps the values they had (evaluation).
    """
    scratch.pack(tensors)
    if check is not None:
        check(scratch.buckets)
    handle = comm.start_mean(scratch.buckets, weight)
    handle.wait()
    if swap:
        scratch.swap(tensors)
    else:
        scratch.unpack(tensors)
    return handle


class FiniteCheck:
    """Whether any element of ``buckets`` is NaN or infinite, asked now and read later.

    One sum per bucket: a sum is NaN or infinite whenever an element is, and reading a bucket
    once is about 20x cheaper than ``isfinite(b).all()``, which writes a mask as large as the
    model. Only when a sum is not finite (which finite values can also cause, by overflowing)
    does the exact check run. On a GPU the sums travel to the host in the background, so
    ``result`` read a step later never makes the host wait for the device; the buckets must not
    change in between.
    """

    def __init__(self, buckets: Sequence[Tensor]) -> None:
        self.buckets = [b for b in buckets if b.is_floating_point() and b.numel()]
        self._sums: Tensor | None = None
        self._copied: torch.cuda.Event | None = None
        if not self.buckets:
            return
        sums = torch.stack(
            [b.sum(dtype=torch.float64 if b.dtype == torch.float64 else torch.float32) for b in self.buckets]
        )
        if sums.is_cuda:
            self._sums = torch.empty(sums.shape, dtype=sums.dtype, pin_memory=True)
            self._sums.copy_(sums, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            self._sums = sums

    def result(self) -> bool:
        if self._sums is None:
            return False
        if self._copied is not None:
            self._copied.synchronize()
        if bool(torch.isfinite(self._sums).all()):
            return False
        return not bool(torch.stack([torch.isfinite(b).all() for b in self.buckets]).all())


def has_nonfinite(buckets: Sequence[Tensor]) -> bool:
    """Whether any element is NaN or infinite (see ``FiniteCheck``), answered now."""
    return FiniteCheck(buckets).result()


class GradientPipeline:
    """Pipe-SGD with a pipeline of width two: the update at step t uses the mean gradient of step t-1.

    ``exchange`` runs after backward: it launches this step's gradients and puts the previous
    step's mean gradients into ``.grad`` for the optimizer. Two flat buffers alternate so the
    launch never waits for the previous all-reduce.
    """

    def __init__(self, params: Sequence[Tensor], comm: Communicator) -> None:
        self.params = list(params)
        self.comm = comm
        self.buffers = (FlatBuffer(self.params), FlatBuffer(self.params))
        self.handle: Handle | None = None
        self._flip = 0

    @property
    def nbytes(self) -> int:
        return self.buffers[0].nbytes

    def exchange(self, check: Callable[[list[Tensor]], None] | None = None) -> tuple[Handle, Handle | None]:
        """Returns (launched now, waited on now); the latter is None on the first step.

        ``check`` sees this step's packed gradients before their all-reduce starts writing them.
        """
        outgoing = self.buffers[self._flip]
        # A parameter that got no gradient this step contributes zeros, so every rank's
        # collective has the same size whatever its data did.
        torch._foreach_copy_(outgoing.views, [_grad_or_zeros(p) for p in self.params])
        if check is not None:
            check(outgoing.buckets)
        launched = self.comm.start_mean(outgoing.buckets)
        previous, self.handle = self.handle, launched
        self._flip ^= 1
        if previous is None:
            # First step: there is no mean gradient yet. Dropping the gradients makes torch's
            # optimizers skip every parameter (no update, no weight decay, no momentum).
            for p in self.params:
                p.grad = None
            return launched, None
        previous.wait()
        incoming = self.buffers[self._flip]
        # Only trainable parameters take a gradient: a zero .grad on a frozen one would still
        # let weight decay and momentum move it.
        trainable = [(p, view) for p, view in zip(self.params, incoming.views) if p.requires_grad]
        for p, _ in trainable:
            if p.grad is None:
                p.grad = torch.empty_like(p)
        torch._foreach_copy_([p.grad for p, _ in trainable], [view for _, view in trainable])
        return launched, previous

    def drain(self) -> Handle | None:
        """Wait for the last launched gradients, which no step will apply (end of training)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.wait()
        return handle


def _grad_or_zeros(param: Tensor) -> Tensor:
    return param.grad if param.grad is not None else torch.zeros_like(param)
