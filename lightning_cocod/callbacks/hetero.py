"""Heterogeneous workers: proportional sampling, and a simulated slowdown for experiments.

``ProportionalSampling`` gives each rank a batch in proportion to its measured throughput
(this project's rule, see ``core/adapt.py``) and sets the strategy's averaging weight to the
rank's batch share. ``SimulatedSlowdown`` makes chosen ranks slower by a known factor.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.data import extract_batch_size

from lightning_cocod.core.adapt import proportional_split

log = logging.getLogger(__name__)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_slowdowns(factors: Sequence[float], world_size: int | None = None) -> list[float]:
    factors = list(factors)
    bad = [f for f in factors if isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 1.0]
    if bad:
        raise ValueError(
            f"slowdown factors must be numbers >= 1 (1 = full speed, 2 = twice as slow), got {factors}"
        )
    if world_size is not None and len(factors) != world_size:
        raise ValueError(f"slowdown has {len(factors)} factors for {world_size} workers: give one per rank")
    return [float(f) for f in factors]


class SimulatedSlowdown(Callback):
    """Rank i takes ``factors[i]`` times as long per sample as it would at full speed.

    A measured delay: at the start of fit each slowed rank times a few forward+backward passes of
    a private copy of the model (no communication can be inside that measurement), giving its
    compute time per sample; every step then sleeps ``(factor - 1) * batch * seconds_per_sample``
    before its forward pass. Sleeping stands in for a slower device: it costs wall time, like a
    slower GPU, not CPU that the other workers on this machine would lose.
    """

    def __init__(
        self, factors: Sequence[float], calibration_steps: int = 3, seconds_per_sample: float | None = None
    ) -> None:
        self.factors = check_slowdowns(factors)
        self.calibration_steps = calibration_steps
        # Given: skip the calibration (tests, or a cost measured elsewhere).
        self.seconds_per_sample = seconds_per_sample or 0.0
        self.factor = 1.0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        check_slowdowns(self.factors, trainer.world_size)
        self.factor = self.factors[trainer.global_rank]

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *args: Any
    ) -> None:
        if self.factor == 1.0:
            return
        x = batch[0]
        if self.seconds_per_sample == 0.0:
            self.seconds_per_sample = self._calibrate(pl_module, x)
        time.sleep((self.factor - 1.0) * len(x) * self.seconds_per_sample)

    def _calibrate(self, pl_module: pl.LightningModule, x: torch.Tensor) -> float:
        # Private copies of the parameters: the real ones (and any DDP hooks on them) are not
        # touched, and nothing here communicates.
        params = {
            k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in pl_module.named_parameters()
        }
        buffers = {k: v.detach().clone() for k, v in pl_module.named_buffers()}

        def one_pass() -> float:
            start = time.perf_counter()
            torch.func.functional_call(pl_module, (params, buffers), (x,)).float().sum().backward()
            return time.perf_counter() - start

        # The first pass at a batch shape pays one-off costs (kernel selection, allocations) that
        # a steady step does not: timing it would slow the rank by more than its factor.
        one_pass()
        return statistics.median(one_pass() for _ in range(self.calibration_steps)) / len(x)


class ProportionalSampling(Callback):
    """Each rank's batch follows its measured throughput; averages are weighted by batch share.

    The first epoch runs with an equal split and is the warm-up; at the end of every
    ``every_n_epochs``-th epoch each rank's throughput (samples per second of its own compute,
    communication waits excluded) is gathered from all ranks, and every rank computes the same
    split ``b_i = B * c_i / sum_j c_j`` (integers summing to B, each >= 1). The new batches start
    with the next epoch; the strategy's weight ``p_i = b_i / B`` changes at once (CoCoD-SGD and
    Local-SGD apply it from their next average). ``batch_sizes`` fixes the split instead.

    Needs a datamodule with ``set_per_rank_batch_sizes`` (all of ``lightning_cocod.data``).
    Since ``B`` is fixed, every rank keeps taking ``N // B`` steps per epoch.
    """

    def __init__(
        self, global_batch_size: int, batch_sizes: Sequence[int] | None = None, every_n_epochs: int = 1
    ) -> None:
        for name, value in (("global_batch_size", global_batch_size), ("every_n_epochs", every_n_epochs)):
            if not _positive_int(value):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        sizes = list(batch_sizes or [])
        if batch_sizes is not None and not (
            all(map(_positive_int, sizes)) and sum(sizes) == global_batch_size
        ):
            raise ValueError(
                f"batch_sizes {sizes} must be positive integers summing to "
                f"global_batch_size={global_batch_size}"
            )
        self.global_batch_size = global_batch_size
        self.fixed = list(batch_sizes) if batch_sizes is not None else None
        self.every_n_epochs = every_n_epochs
        self.sizes: list[int] = []
        self.history: list[tuple[int, list[int]]] = []  # (epoch the split starts, split)
        self._samples, self._seconds = 0, 0.0  # measured since the last split

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        world = trainer.world_size
        if self.global_batch_size < world:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} cannot give each of {world} workers a sample: "
                f"use at least {world}"
            )
        if self.fixed is not None and len(self.fixed) != world:
            raise ValueError(f"batch_sizes {self.fixed} has {len(self.fixed)} entries for {world} workers")
        if not hasattr(trainer.datamodule, "set_per_rank_batch_sizes"):
            raise ValueError(
                "ProportionalSampling needs trainer.fit(..., datamodule=dm) with a datamodule that has "
                "set_per_rank_batch_sizes (the lightning_cocod.data modules do)"
            )
        self._apply(trainer, self.fixed or proportional_split(self.global_batch_size, [1.0] * world), epoch=0)

    def state_dict(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Loaded after setup() applied the warm-up split: on_fit_start applies the saved one.
        self._resumed = state_dict

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        resumed, self._resumed = getattr(self, "_resumed", None), None
        if resumed is not None and len(resumed["sizes"]) == trainer.world_size:
            self.history = [(epoch, list(sizes)) for epoch, sizes in resumed["history"][:-1]]
            self._apply(trainer, list(resumed["sizes"]), epoch=resumed["history"][-1][0])

    def _apply(self, trainer: pl.Trainer, sizes: list[int], epoch: int) -> None:
        self.sizes = sizes
        self.history.append((epoch, sizes))
        trainer.datamodule.set_per_rank_batch_sizes(sizes)
        strategy = trainer.strategy
        if hasattr(strategy, "weight"):
            strategy.weight = sizes[trainer.global_rank] / self.global_batch_size
        elif len(set(sizes)) > 1 and trainer.is_global_zero:
            log.warning(
                f"{type(strategy).__name__} averages gradients uniformly: unequal batches {sizes} are not weighted"
            )

    # A step is measured from the previous step's end, not from this callback's batch-start
    # hook: whatever runs in the step counts however the callbacks are ordered (a slowdown
    # that sleeps in its own batch-start hook included). The first step of an epoch is left
    # out, so the epoch-end all_gather (where a fast worker waits for the slow) is not compute.
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end: float | None = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        now, exposed = time.perf_counter(), self._exposed(trainer)
        if getattr(self, "_last_end", None) is not None:
            self._seconds += now - self._last_end - (exposed - self._exposed_at_end)
            self._samples += extract_batch_size(batch)
        self._last_end, self._exposed_at_end = now, exposed

    @staticmethod
    def _exposed(trainer: pl.Trainer) -> float:
        stats = getattr(trainer.strategy, "comm_stats", None)
        return stats.exposed_seconds if stats is not None else 0.0

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.log(
            "hetero/batch_size", float(self.sizes[trainer.global_rank]), on_epoch=True, sync_dist=False
        )
        if self.fixed is not None or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        throughput = self._samples / self._seconds if self._seconds > 0 else 1.0
        self._samples, self._seconds = 0, 0.0
        # Every rank gathers the same figures and runs the same arithmetic: the same split.
        gathered = trainer.strategy.all_gather(torch.tensor([throughput], dtype=torch.float64))
        capabilities = [float(c) for c in gathered.reshape(-1).cpu()]
        sizes = proportional_split(self.global_batch_size, capabilities)
        if sizes != self.sizes:
            if trainer.is_global_zero:
                log.info(
                    f"proportional sampling: batch sizes {self.sizes} -> {sizes} (throughput {capabilities})"
                )
            self._apply(trainer, sizes, epoch=trainer.current_epoch + 1)
