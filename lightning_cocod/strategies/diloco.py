"""DiLoCo under the Trainer: ``rounds.DiLoCoRounds`` run from the hooks of ``SyncStrategyBase``."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning_cocod.core.outer import DILOCO_OUTER, OuterFactory, SchedulerFactory
from lightning_cocod.rounds.cocod import DiLoCoRounds
from lightning_cocod.strategies.base import SyncStrategyBase, of_rounds


class DiLoCoMethod(SyncStrategyBase):
    """DiLoCo (Douillard et al. 2023, arXiv:2311.08105): ``tau`` local steps, then an outer step.

    After step kH every worker snapshots ``s_i``, the mean of ``Delta_i = theta - s_i`` is
    all-reduced, the outer optimizer steps the outer model theta with it as the gradient, and
    every worker restarts from the new theta; the inner optimizer's state stays local. It is
    CoCoD-SGD's generalized round (``core.outer``) with ``overlap=0`` and Nesterov SGD (lr 0.7,
    momentum 0.9, DiLoCo's choice for AdamW workers) as the outer optimizer. A positive
    ``overlap`` d takes the snapshot d steps before the round ends and keeps those d steps at the
    merge, ``x_i <- theta' + (x_i - s_i)``, so that the all-reduce runs alongside them (Streaming
    DiLoCo's overlap). Outer SGD with lr 1 and no momentum is Local-SGD (up to rounding).

    Args:
        tau: optimizer steps per round (default 8, the short end of the periods later DiLoCo
            work uses; tune it with the outer and inner learning rates).
        overlap: the steps the round's all-reduce runs alongside, 0 to ``tau`` (default 0), or
            ``"auto"``: re-chosen every round as the fewest that hide the round as measured.
        outer_optimizer: a factory ``params -> torch.optim.Optimizer`` (default
            ``functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)``), or None
            for the plain mean of the snapshots.
        outer_scheduler: a factory ``optimizer -> torch.optim.lr_scheduler.LRScheduler`` stepped
            after every outer step (as ``CoCoDStrategy``'s), or None (the default).
        compression, error_feedback, average_buffers: as ``CoCoDStrategy``'s; with a codec the
            pseudo-gradients are sent encoded, as deltas from the last mean one.
    """

    tau = of_rounds("tau")
    overlap = of_rounds("overlap")

    def __init__(
        self,
        tau: int = 8,
        overlap: int | str | None = 0,
        outer_optimizer: OuterFactory | None = DILOCO_OUTER,
        outer_scheduler: SchedulerFactory | None = None,
        compression: str | None = None,
        error_feedback: bool = True,
        **kwargs: Any,
    ) -> None:
        rounds = partial(
            DiLoCoRounds,
            tau=tau,
            overlap=overlap,
            outer_optimizer=outer_optimizer,
            outer_scheduler=outer_scheduler,
            compression=compression,
            error_feedback=error_feedback,
        )
        super().__init__(rounds, **kwargs)
