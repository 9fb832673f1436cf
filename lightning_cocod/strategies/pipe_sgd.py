"""Pipe-SGD: the gradient all-reduce of step t overlaps step t+1, which applies it."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_cocod.core import GradientPipeline, Handle, has_nonfinite
from lightning_cocod.strategies.base import SyncStrategyBase


class PipeSGDMethod(SyncStrategyBase):
    """Synchronous SGD with a pipeline of width two: ``x <- x - lr * mean_j grad_j(t-1)``.

    After backward of step t the local gradients are launched in a non-blocking all-reduce; the
    all-reduce of step t-1 is then waited on and its mean gradients are what the optimizer
    applies at step t. All workers apply the same gradients, so their models stay identical.

    The first step has no earlier gradient: it launches its own and updates nothing (its
    gradients are set to None, which torch optimizers skip: no update, no weight decay, no
    momentum). When fit ends the last launched gradients are waited on and not applied.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pipeline: GradientPipeline | None = None
        self._launch_step = 0
        self._health: tuple[Handle, Tensor] | None = None  # the flags sent with the gradients in flight

    def _build(self, tensors: list[Tensor]) -> None:
        assert self._comm is not None
        self._pipeline = GradientPipeline(self._live_params(), self._comm)

    def _live_params(self) -> list[Tensor]:
        # The live parameters, not the detached views: the pipeline reads and writes their .grad.
        # All of them, frozen or not, so one unfrozen mid-fit is in the exchange from then on.
        return [p for p in self.lightning_module.parameters() if p.is_floating_point()]

    def _retarget(self) -> None:
        if self._pipeline is not None:  # a replaced module brings Parameters of its own
            self._pipeline.params = self._live_params()

    def _flat_buffers(self) -> list:
        mine = list(self._pipeline.buffers) if self._pipeline is not None else []
        return mine + super()._flat_buffers()

    def _exchange(self) -> None:
        assert self._pipeline is not None and self._comm is not None
        # Every step (a gradient exchange is a round): the gradients must be those of the
        # Parameters the model holds now.
        self._follow_model()
        flags: list[Tensor] = []
        # Read before the launch: once in flight the buffer holds a partial sum of everyone's.
        _, waited = self._pipeline.exchange(lambda buckets: flags.append(self._health_flags(has_nonfinite(buckets))))
        # Queued right behind the gradients, so waiting on it at the next step costs nothing more.
        launched_health = (self._comm.start_mean(flags, 1.0), flags[0])
        if waited is not None:
            self._record(waited, self._launch_step, self._pipeline.nbytes)
            # The mean gradient is in .grad but not applied yet: stop before the optimizer does.
            previous, previous_flags = self._health
            previous.wait()
            if self._raise_if_nonfinite(previous_flags, "gradient all-reduce"):
                for p in self._pipeline.params:  # on_nonfinite="skip": no update this step
                    p.grad = None
        self._health = launched_health
        self._launch_step = self._steps

    def _flush(self) -> None:
        if self._health is not None:
            self._health[0].wait()  # the flags of the gradients in flight, never applied
            self._health = None
        if self._pipeline is not None:
            handle = self._pipeline.drain()
            if handle is not None:
                self._record(handle, self._launch_step, self._pipeline.nbytes)

    def _abandon_in_flight(self) -> None:
        self._health = None
        if self._pipeline is not None:
            self._pipeline.handle = None
