"""Wall-clock figures every comparison needs: step time, throughput, accuracy against time."""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


class StepTimer(Callback):
    """Wall time at the end of every optimizer step (after the strategy's merge), so the waits
    at round boundaries are inside the step they delay.

    Logs ``time/step_seconds``, ``time/samples_per_second`` (this rank's samples) and
    ``time/elapsed_seconds`` (since the first step began).
    """

    def __init__(self) -> None:
        self.step_ends: list[float] = []
        self.started: float | None = None
        self._last_step = 0
        self._samples = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step_ends, self._samples = [], 0
        self._last_step = trainer.global_step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *args) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        self._samples += _batch_size(batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._last_step:  # accumulating: no optimizer step yet
            return
        self._last_step = trainer.global_step
        now = time.perf_counter()
        assert self.started is not None
        previous = self.step_ends[-1] if self.step_ends else self.started
        self.step_ends.append(now)
        step_seconds = now - previous
        pl_module.log_dict(
            {
                "time/step_seconds": step_seconds,
                "time/samples_per_second": self._samples / step_seconds if step_seconds > 0 else 0.0,
                "time/elapsed_seconds": now - self.started,
            },
            on_step=True,
            on_epoch=False,
            batch_size=1,
        )
        self._samples = 0

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def steady_step_seconds(self, warmup_steps: int, period: int = 1) -> float:
        return steady_step_seconds(self.step_ends, warmup_steps, period)


def steady_step_seconds(step_ends: list[float], warmup_steps: int, period: int = 1) -> float:
    """Mean step time over whole periods after the warm-up, so round-boundary waits count in full."""
    usable = (len(step_ends) - warmup_steps) // period * period
    if warmup_steps < 1 or usable < 1:
        raise ValueError(
            f"{len(step_ends)} steps leave no whole period of {period} after {warmup_steps} warm-up steps: "
            "run more steps"
        )
    return (step_ends[warmup_steps - 1 + usable] - step_ends[warmup_steps - 1]) / usable


class AccuracyTimeline(Callback):
    """Records (wall seconds, epoch, step, accuracy) after every validation and logs the time to
    reach ``target`` accuracy once it is reached (``time/to_target_seconds``)."""

    def __init__(self, timer: StepTimer, metric: str = "val/acc", target: float | None = None) -> None:
        self.timer, self.metric, self.target = timer, metric, target
        self.points: list[dict[str, float]] = []
        self.time_to_target: float | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.metric])
        point = {
            "seconds": self.timer.elapsed,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "accuracy": value,
        }
        self.points.append(point)
        metrics = {"time/elapsed_seconds": point["seconds"]}
        if self.target is not None and self.time_to_target is None and value >= self.target:
            self.time_to_target = point["seconds"]
            metrics["time/to_target_seconds"] = self.time_to_target
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(first.shape[0]) if hasattr(first, "shape") else 0
