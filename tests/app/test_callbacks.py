"""The app's callbacks on single-process CPU fits: the checkpoint schedule, the step timer's
logging and the progress line (and its relay in the launching process)."""

import re
import time
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Checkpoint
from pytorch_lightning.loggers import Logger

import lightning_cocod
from lightning_cocod.callbacks import PeriodicCheckpoint, ProgressLine, StepTimer
from lightning_cocod.callbacks import metrics as callbacks
from lightning_cocod.data import SyntheticDataModule
from lightning_cocod.launch.progress import ProgressRelay
from lightning_cocod.models import ClassifierModule, SmallCNN
from tests.helpers.trainers import single_cpu_trainer

# 40 samples in batches of 8: 5 optimizer steps per epoch.
STEPS_PER_EPOCH = 5


def tiny_fit(trainer_callbacks, strategy="auto", **trainer_kwargs):
    pl.seed_everything(0)
    data = SyntheticDataModule(
        num_samples=40, num_eval_samples=16, image_shape=(3, 8, 8), batch_size=8, augment=False
    )
    model = ClassifierModule(SmallCNN(in_channels=3, num_classes=10, width=4), lr=0.01, schedule="none")
    settings = {
        "max_epochs": 2,
        "callbacks": trainer_callbacks,
        "strategy": strategy,
        # Only our own checkpoint callback: Lightning's default one would write into the cwd.
        "enable_checkpointing": any(isinstance(cb, Checkpoint) for cb in trainer_callbacks),
    }
    trainer = single_cpu_trainer(**{**settings, **trainer_kwargs})
    trainer.fit(model, datamodule=data)
    return trainer


class SaveRecorder(pl.Callback):
    """The global step of every checkpoint, and what the file held while training went on."""

    def __init__(self, path_of):
        self.path_of, self.saved, self.on_disk = path_of, [], {}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.saved.append(trainer.global_step)

    def on_train_batch_start(self, trainer, *args):
        path = self.path_of()
        if path.exists():
            self.on_disk[trainer.global_step] = torch.load(path, map_location="cpu", weights_only=False)[
                "global_step"
            ]


def test_last_ckpt_is_written_on_the_step_and_epoch_schedules_during_training(tmp_path):
    periodic = PeriodicCheckpoint(tmp_path / "checkpoints", every_n_epochs=1, every_n_steps=3)
    recorder = SaveRecorder(lambda: tmp_path / "checkpoints" / "last.ckpt")
    trainer = tiny_fit([periodic, recorder])
    assert trainer.checkpoint_callback is periodic  # Lightning adds no ModelCheckpoint of its own
    # Steps 3, 6, 9 (every 3) and 5, 10 (epoch ends); the end of fit (10) is saved already.
    assert recorder.saved == [3, 5, 6, 9, 10]
    # The file existed from the first save on, each time holding the latest save.
    assert recorder.on_disk == {3: 3, 4: 3, 5: 5, 6: 6, 7: 6, 8: 6, 9: 9}
    assert torch.load(periodic.last_path, map_location="cpu", weights_only=False)["global_step"] == 10


def test_the_end_of_fit_is_saved_when_no_schedule_falls_on_it(tmp_path):
    periodic = PeriodicCheckpoint(tmp_path, every_n_epochs=0, every_n_steps=4)
    recorder = SaveRecorder(lambda: tmp_path / "last.ckpt")
    tiny_fit([periodic, recorder], max_epochs=None, max_steps=7)
    assert recorder.saved == [4, 7]


def test_a_fresh_run_never_replaces_a_checkpoint_and_a_resumed_run_continues_its_file(tmp_path):
    assert PeriodicCheckpoint(tmp_path).last_path == str(tmp_path / "last.ckpt")
    (tmp_path / "last.ckpt").write_bytes(b"earlier run")
    assert PeriodicCheckpoint(tmp_path).last_path == str(tmp_path / "last-v1.ckpt")
    (tmp_path / "last-v1.ckpt").write_bytes(b"another")
    assert PeriodicCheckpoint(tmp_path).last_path == str(tmp_path / "last-v2.ckpt")
    assert PeriodicCheckpoint(tmp_path, resume_from=tmp_path / "last-v1.ckpt").last_path == str(
        tmp_path / "last-v1.ckpt"
    )
    elsewhere = tmp_path / "other" / "model.ckpt"  # not this run's file: start a new one
    assert PeriodicCheckpoint(tmp_path, resume_from=elsewhere).last_path == str(tmp_path / "last-v2.ckpt")
    with pytest.raises(ValueError, match=r"every_n_steps=-1 is invalid; accepted: an integer >= 0"):
        PeriodicCheckpoint(tmp_path, every_n_steps=-1)


def test_every_n_minutes_asks_the_strategy_on_rank_zeros_clock(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    periodic = PeriodicCheckpoint("unused", every_n_epochs=0, every_n_minutes=0.5)
    requests = []
    strategy = SimpleNamespace(request_checkpoint=lambda: requests.append(clock[0]))
    for rank in (0, 1):
        trainer = SimpleNamespace(global_rank=rank, global_step=1, strategy=strategy)
        for now in (110.0, 129.0, 131.0, 140.0, 161.0, 162.0):
            clock[0] = now
            periodic.on_train_batch_end(trainer)
        periodic._saved_at = 100.0
    # Rank 0: 30 s after the start, then 30 s after that request; rank 1 never asks.
    assert requests == [131.0, 161.0]


@pytest.mark.timeout(60)
def test_every_n_minutes_saves_through_the_strategys_request(tmp_path):
    periodic = PeriodicCheckpoint(tmp_path, every_n_epochs=0, every_n_minutes=1e-9)  # due at every step
    recorder = SaveRecorder(lambda: tmp_path / "last.ckpt")
    strategy = lightning_cocod.CoCoDStrategy(tau=2)
    tiny_fit([periodic, recorder], strategy=strategy, max_epochs=None, max_steps=4)
    assert recorder.saved and recorder.saved[0] < 4  # saved while training, not only at its end
    assert recorder.saved[-1] == 4


class MetricsLog(Logger):
    name, version = "memory", 0

    def __init__(self):
        super().__init__()
        self.logged = []

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_step_timer_logs_python_floats_to_the_loggers_every_n_steps():
    timer, logger = StepTimer(), MetricsLog()
    trainer = tiny_fit([timer], logger=logger, log_every_n_steps=2, max_epochs=None, max_steps=6)
    logged = [(step, m) for step, m in logger.logged if "time/step_seconds" in m]
    assert [step for step, _ in logged] == [2, 4, 6]
    # Over the steps since the previous log: the timer's own step ends say the same.
    ends = timer.step_ends
    assert logged[1][1]["time/step_seconds"] == pytest.approx((ends[3] - ends[1]) / 2)
    assert logged[2][1]["time/step_seconds"] == pytest.approx((ends[5] - ends[3]) / 2)
    assert logged[1][1]["time/samples_per_second"] == pytest.approx(16 / (ends[3] - ends[1]))
    assert all(type(v) is float for _, m in logged for v in m.values())
    assert "time/step_seconds" not in trainer.callback_metrics  # never went through pl_module.log


def test_progress_line_says_epoch_step_loss_accuracy_step_time_and_time_left(capsys):
    trainer = tiny_fit([ProgressLine("run-a", every_s=0)])
    lines = capsys.readouterr().out.strip().splitlines()
    progress = [line for line in lines if line.startswith("run-a: ")]
    assert len(progress) == 2 * STEPS_PER_EPOCH + 1  # every step (every_s=0) and the end of training
    assert progress[0].startswith("run-a: epoch 1/2  step 1/10  loss ")
    assert "acc" not in progress[4] and "  acc 0." in progress[5]  # known once the first epoch validated
    assert re.search(r"s/step  ETA 0:00:0\d$", progress[3])
    assert progress[-1].startswith("run-a: epoch 2/2  step 10/10") and progress[-1].endswith("ETA 0:00:00")
    assert trainer.global_step == 10


def test_progress_line_arithmetic():
    line = ProgressLine("t")
    line._ends.extend([0.0, 0.5, 1.0, 1.5])  # 0.5 s a step
    line._accuracy = 0.8125
    trainer = SimpleNamespace(
        global_step=10,
        estimated_stepping_batches=110,
        max_epochs=4,
        current_epoch=1,
        callback_metrics={"train/loss": torch.tensor(1.23456)},
    )
    assert (
        line.line(trainer) == "t: epoch 2/4  step 10/110  loss 1.2346  acc 0.812  0.500 s/step  ETA 0:00:50"
    )


def test_the_launcher_relays_rank_zeros_line_every_few_seconds(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    shown = []
    path = tmp_path / "progress.txt"
    path.write_text("a previous run's line")
    relay = ProgressRelay(path, "job", every_s=5.0, show=shown.append)
    assert not path.exists()
    for now, text in (
        (1.0, None),
        (5.0, None),
        (6.0, "job: epoch 0  step 1/8"),
        (9.0, "job: epoch 0  step 2/8"),
        (11.0, None),
        (16.5, None),
        (30.0, "job: epoch 1  step 8/8"),
    ):
        clock[0] = now
        if text:
            path.write_text(text)
        relay.tick()
    assert shown == [
        "job: starting the workers (5 s)",
        "job: epoch 0  step 2/8",  # at 11 s: 5 s after the last line; the line at 6 s was not due yet
        "job: epoch 1  step 8/8",  # at 16.5 s nothing new was written
    ]
