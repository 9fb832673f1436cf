"""CoCoD-SGD under the Trainer: ``rounds.CoCoDRounds`` run from the hooks of ``SyncStrategyBase``."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning_cocod.core.averaging import DEFAULT_PROGRESS
from lightning_cocod.core.outer import OuterFactory, SchedulerFactory
from lightning_cocod.rounds.cocod import CoCoDRounds
from lightning_cocod.strategies.base import SyncStrategyBase, of_rounds


class CoCoDMethod(SyncStrategyBase):
    """Computation and communication decoupled SGD (Shen et al., IJCAI 2019, arXiv:1906.12043).

    Every ``tau`` optimizer steps a round ends and the next begins: each worker snapshots its
    model, launches a non-blocking all-reduce of the snapshot on a process group of its own, takes
    ``tau`` local steps, then merges ``x_i <- avg + progress * (x_i - snap_i)``
    (``core.CoCoDRound``). The rounds are ``rounds.CoCoDRounds``; this class runs them from the
    Trainer's hooks, the merge inside ``optimizer_step`` so that it happens once per optimizer
    step and before any checkpoint callback dumps the weights. Why each default is what it is,
    with the studies behind it: docs/methods.md.

    Args:
        tau: a number of optimizer steps per round, or ``"auto"`` (the default,
            ``rounds.auto.AutoPeriod``): the shortest period that hides the round's communication
            as measured, within ``[tau_min, tau_max]``; with an ``outer_optimizer`` the period
            ``rounds.cocod.OUTER_TAU`` with ``overlap="auto"``.
        tau_min: the shortest period ``tau="auto"`` may choose (default 1).
        tau_max: the longest period ``tau="auto"`` may choose (default ``core.adapt.SAFE_TAU_MAX``,
            the longest that kept S-SGD's accuracy; docs/methods.md says why).
        progress: the share of its own progress since the round began that a worker keeps at the
            merge; 1 (the default) is the paper's rule (``core.averaging`` explains it).
        overlap: d, the steps of a round its all-reduce runs alongside: the snapshot is taken
            after step kH - d, the merge made after step kH (0 <= d <= tau). None (the default)
            is the whole period, the paper's round; ``"auto"`` re-chooses d every round as the
            fewest steps that hide the round as measured (``tau="auto"``'s rule, within [1, tau]).
        outer_optimizer: a factory ``params -> torch.optim.Optimizer`` (e.g.
            ``functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)``; in Hydra
            a ``_partial_: true`` config): the outer model theta is stepped with the mean of
            ``theta - snap_i`` as its gradient and every worker merges
            ``x_i <- theta' + (x_i - snap_i)`` (``core.outer``). None (the default) is the
            paper's merge. Outer SGD with lr 1 and no momentum is that merge too, and at
            ``overlap=0`` Local-SGD, up to rounding.
        outer_scheduler: a factory ``optimizer -> torch.optim.lr_scheduler.LRScheduler`` stepped
            after every outer step (e.g. ``functools.partial(LinearLR, start_factor=0.25,
            total_iters=3)``: a warm-up of the outer learning rate over the first rounds), or None.
        compression: None (fp32, the default), "bf16" or "int8": rounds sent as encoded deltas
            (``core.compress``, docs/compression.md); ``error_feedback`` (default True) carries
            what encoding dropped to the next round.
        average_buffers: round BatchNorm running statistics (floating-point buffers) with the
            parameters; integer buffers always stay local.
    """

    tau = of_rounds("tau")
    tau_history = of_rounds("tau_history")  # (step, tau) at the start and at every change
    progress = of_rounds("progress")
    overlap = of_rounds("overlap")
    rounds_class: type[CoCoDRounds] = CoCoDRounds  # a variant of the rounds (a study's control) sets its own

    def __init__(
        self,
        tau: int | str = "auto",
        tau_min: int | None = None,
        tau_max: int | None = None,
        progress: float = DEFAULT_PROGRESS,
        compression: str | None = None,
        error_feedback: bool = True,
        overlap: int | str | None = None,
        outer_optimizer: OuterFactory | None = None,
        outer_scheduler: SchedulerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        rounds = partial(
            self.rounds_class,
            tau=tau,
            tau_min=tau_min,
            tau_max=tau_max,
            progress=progress,
            overlap=overlap,
            outer_optimizer=outer_optimizer,
            outer_scheduler=outer_scheduler,
            compression=compression,
            error_feedback=error_feedback,
        )
        super().__init__(rounds, **kwargs)
