"""Wall-clock figures every comparison needs (step time, throughput, accuracy against time), the
app's checkpoint schedule and its progress line."""

from __future__ import annotations

import collections
import datetime
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, Checkpoint
from pytorch_lightning.utilities.data import extract_batch_size

from lightning_cocod._files import atomic_write
from lightning_cocod._options import is_int, is_number, require


class StepTimer(Callback):
    """Wall time at the end of every optimizer step (after the strategy's merge), so the waits
    at round boundaries are inside the step they delay.

    Every ``trainer.log_every_n_steps`` steps it logs ``time/step_seconds`` (mean over those steps),
    ``time/samples_per_second`` (this rank's samples) and ``time/elapsed_seconds`` (since the first
    step began) straight to the trainer's loggers as Python floats: ``pl_module.log`` would make a
    device tensor of each value, a host-device sync per value per step on a GPU.
    """

    def __init__(self) -> None:
        self.step_ends: list[float] = []
        self.started: float | None = None
        self._last_step = 0
        self._samples = 0
        self._logged_at: tuple[int, float] | None = None  # (global step, time) of the last log

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step_ends, self._samples, self._logged_at = [], 0, None
        self._last_step = trainer.global_step

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *args
    ) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        if self._logged_at is None:
            self._logged_at = (trainer.global_step, self.started)
        self._samples += extract_batch_size(batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self._last_step:  # accumulating: no optimizer step yet
            return
        self._last_step = trainer.global_step
        now = time.perf_counter()
        self.step_ends.append(now)
        every = trainer.log_every_n_steps or 50
        if trainer.global_step % every or not trainer.loggers or self._logged_at is None:
            return
        assert self.started is not None
        step0, time0 = self._logged_at
        seconds, steps = now - time0, trainer.global_step - step0
        metrics = {
            "time/step_seconds": seconds / steps if steps else 0.0,
            "time/samples_per_second": self._samples / seconds if seconds > 0 else 0.0,
            "time/elapsed_seconds": now - self.started,
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self._logged_at, self._samples = (trainer.global_step, now), 0

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started


class AccuracyTimeline(Callback):
    """Records (wall seconds, epoch, step, accuracy, and the loss where ``loss_metric`` is logged)
    after every validation and logs the time to reach ``target`` accuracy once it is reached
    (``time/to_target_seconds``)."""

    def __init__(
        self,
        timer: StepTimer,
        metric: str = "val/acc",
        target: float | None = None,
        loss_metric: str = "val/loss",
    ) -> None:
        self.timer, self.metric, self.target, self.loss_metric = timer, metric, target, loss_metric
        self.points: list[dict[str, float | None]] = []
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
        if self.loss_metric in trainer.callback_metrics:  # what a language model is judged by
            loss = float(trainer.callback_metrics[self.loss_metric])
            point["loss"] = loss if math.isfinite(loss) else None  # a diverged run: JSON has no NaN
        self.points.append(point)
        metrics = {"time/elapsed_seconds": point["seconds"]}
        if self.target is not None and self.time_to_target is None and value >= self.target:
            self.time_to_target = point["seconds"]
            metrics["time/to_target_seconds"] = self.time_to_target
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


class PeriodicCheckpoint(Checkpoint):
    """Writes one file, ``last_path``, every ``every_n_epochs`` epochs, every ``every_n_steps``
    optimizer steps and every ``every_n_minutes`` minutes (0 turns each off), and at the end of fit.

    Lightning's ``ModelCheckpoint(save_top_k=0, save_last=True)`` writes ``last.ckpt`` only when a
    top-k file was saved, i.e. at the end of fit and nowhere before. The step and epoch schedules
    are the same on every rank, so every rank enters each save together. The minutes schedule runs
    on rank 0's clock alone and asks the strategy to checkpoint (``request_checkpoint()``), which
    brings every rank to the same step with no per-step collective.

    ``last_path`` is ``dirpath/last.ckpt``, or ``last-vN.ckpt`` if that exists already (a fresh
    run never replaces another run's file); a run resumed from a file in ``dirpath`` continues
    writing that file. The strategies write it atomically.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike,
        every_n_epochs: int = 1,
        every_n_steps: int = 0,
        every_n_minutes: float = 0.0,
        resume_from: str | os.PathLike | None = None,
    ) -> None:
        for name, value, kind in (
            ("every_n_epochs", every_n_epochs, int),
            ("every_n_steps", every_n_steps, int),
            ("every_n_minutes", every_n_minutes, (int, float)),
        ):
            ok = (is_int(value) if kind is int else is_number(value)) and value >= 0
            require(
                ok, "PeriodicCheckpoint", name, value, f"{'an integer' if kind is int else 'a number'} >= 0"
            )
        self.dirpath = Path(dirpath)
        self.every_n_epochs, self.every_n_steps = every_n_epochs, every_n_steps
        self.every_n_seconds = 60.0 * every_n_minutes
        self.last_path = str(self._file(resume_from))
        self._saved_step: int | None = None
        self._saved_at = time.monotonic()

    def _file(self, resume_from: str | os.PathLike | None) -> Path:
        if resume_from is not None and Path(resume_from).resolve().parent == self.dirpath.resolve():
            return Path(resume_from)
        path, version = self.dirpath / "last.ckpt", 0
        while path.exists():
            version += 1
            path = self.dirpath / f"last-v{version}.ckpt"
        return path

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Rank 0 writes the file: its view of what already exists decides the name for all.
        self.last_path = trainer.strategy.broadcast(self.last_path, src=0)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saved_at = time.monotonic()

    def _save(self, trainer: pl.Trainer) -> None:
        if self._saved_step != trainer.global_step:
            Path(self.last_path).parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(
                self.last_path, weights_only=False
            )  # a full checkpoint: a resume needs it all

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        # Every save counts, the strategy's own (a requested or a preemption one) included.
        self._saved_step, self._saved_at = trainer.global_step, time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step, every_s = trainer.global_step, self.every_n_seconds
        if self.every_n_steps and step and step % self.every_n_steps == 0:
            self._save(trainer)
        elif every_s and trainer.global_rank == 0 and time.monotonic() - self._saved_at >= every_s:
            self._saved_at = time.monotonic()  # one request per period, however long the save takes
            trainer.strategy.request_checkpoint()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_epochs or self.every_n_steps or self.every_n_seconds:
            self._save(trainer)


class ProgressLine(Callback):
    """Rank 0's status every ``every_s`` seconds: epoch, step, loss, accuracy once validated,
    step time and an estimate of the time left. Printed, or written to ``path`` for a launching
    process that shows it (the ranks' own output goes to files there)."""

    def __init__(self, title: str, every_s: float = 5.0, path: str | os.PathLike | None = None) -> None:
        self.title, self.every_s = title, every_s
        self.path = Path(path) if path is not None else None
        self._ends: collections.deque[float] = collections.deque(maxlen=51)
        self._shown = 0.0
        self._accuracy: float | None = None

    def line(self, trainer: pl.Trainer) -> str:
        step, total = trainer.global_step, trainer.estimated_stepping_batches
        epoch, epochs = trainer.current_epoch, trainer.max_epochs
        if epochs and epochs > 0:  # counted from 1; after the last epoch Lightning's count is one past it
            epoch, of = min(epoch, epochs - 1), f"/{epochs}"
        else:
            of = ""
        parts = [f"{self.title}: epoch {epoch + 1}{of}", f"step {step}/{total}"]
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            parts.append(f"loss {float(loss):.4f}")
        if self._accuracy is not None:
            parts.append(f"acc {self._accuracy:.3f}")
        if len(self._ends) > 1:
            per_step = (self._ends[-1] - self._ends[0]) / (len(self._ends) - 1)
            parts.append(f"{per_step:.3f} s/step")
            if total != float("inf"):
                parts.append(f"ETA {datetime.timedelta(seconds=round(max(0, total - step) * per_step))}")
        return "  ".join(parts)

    def _show(self, trainer: pl.Trainer) -> None:
        text = self.line(trainer)
        self._shown = time.monotonic()
        if self.path is None:
            print(text, file=sys.stdout, flush=True)
            return
        # The reader sees a whole line or the previous one; a line lost to a crash is no loss.
        atomic_write(self.path, text, durable=False)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ends.clear()
        self._shown = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_rank != 0:
            return
        self._ends.append(time.monotonic())
        if time.monotonic() - self._shown >= self.every_s:
            self._show(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0 and not trainer.sanity_checking and "val/acc" in trainer.callback_metrics:
            self._accuracy = float(trainer.callback_metrics["val/acc"])

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:
            self._show(trainer)
