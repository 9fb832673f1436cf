"""Pipe-SGD's rounds: the gradient all-reduce of step t overlaps step t+1, which applies it."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_cocod._options import invalid
from lightning_cocod.core import FlatBuffer, GradientPipeline, Handle, has_nonfinite
from lightning_cocod.rounds.base import Rounds


class PipeSGDRounds(Rounds):
    """Pipe-SGD's rounds: one gradient exchange per step (see ``PipeSGDMethod``)."""

    def __init__(self, owner: str, **common: Any) -> None:
        if common.get("compression") is not None:  # the loop API passes its options on unfiltered
            accepted = "None: Pipe-SGD exchanges gradients, not rounds of the model (CoCoD and Local-SGD compress theirs)"
            raise invalid(owner, "compression", common["compression"], accepted)
        super().__init__(owner, **common)
        self.pipeline: GradientPipeline | None = None
        self._launch_step = 0
        self._health: tuple[Handle, Tensor] | None = None  # the flags sent with the gradients in flight

    def build(self) -> None:
        assert self.comm is not None
        self.pipeline = GradientPipeline(self._live_params(), self.comm)

    def _live_params(self) -> list[Tensor]:
        # The live parameters, not the detached views: the pipeline reads and writes their .grad.
        # All of them, frozen or not, so one unfrozen mid-fit is in the exchange from then on.
        assert self.module is not None
        return [p for p in self.module.parameters() if p.is_floating_point()]

    def retarget(self) -> None:
        if self.pipeline is not None:  # a replaced module brings Parameters of its own
            self.pipeline.params = self._live_params()

    def flat_buffers(self) -> list[FlatBuffer]:
        mine = list(self.pipeline.buffers) if self.pipeline is not None else []
        return mine + super().flat_buffers()

    def exchange(self) -> None:
        assert self.pipeline is not None and self.comm is not None
        # Every step (a gradient exchange is a round): the gradients must be those of the
        # Parameters the model holds now.
        self.follow_model()
        flags: list[Tensor] = []
        # Read before the launch: once in flight the buffer holds a partial sum of everyone's.
        _, waited = self.pipeline.exchange(
            lambda buckets: flags.append(self.health_flags(has_nonfinite(buckets)))
        )
        # Queued right behind the gradients, so waiting on it at the next step costs nothing more.
        launched_health = (self.comm.start_mean(flags, 1.0), flags[0])
        if waited is not None:
            assert self._health is not None
            self.record(waited, self._launch_step, self.pipeline.nbytes)
            # The mean gradient is in .grad but not applied yet: stop before the optimizer does.
            previous, previous_flags = self._health
            previous.wait()
            if self.raise_if_nonfinite(previous_flags, "gradient all-reduce"):
                for p in self.pipeline.params:  # on_nonfinite="skip": no update this step
                    p.grad = None
        self._health = launched_health
        self._launch_step = self.steps

    def flush(self, averaging_next: bool = False) -> None:
        if self._health is not None:
            self._health[0].wait()  # the flags of the gradients in flight, never applied
            self._health = None
        if self.pipeline is not None:
            handle = self.pipeline.drain()
            if handle is not None:
                self.record(handle, self._launch_step, self.pipeline.nbytes)

    def abandon(self) -> None:
        self._health = None
        if self.pipeline is not None:
            self.pipeline.handle = None
