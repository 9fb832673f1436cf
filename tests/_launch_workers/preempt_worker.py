"""A rank of a small run on digits for the preemption and lost-peer tests.

argv: out_dir strategy max_steps event event_rank event_step [resume]
  strategy: cocod | ssgd | local_sgd | pipe_sgd   (tau 4 where there is one)
  event: sigterm | sigusr1 | request_checkpoint | die_in_validation | none
Writes out_dir/rank{R}.json: how the fit ended (optimizer step, exit reason, times), and the final
weights to out_dir/rank{R}.pt when fit returns. Checkpoints go to out_dir/ckpt/ (ModelCheckpoint).
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

import lightning_cocod
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN

STRATEGIES = {
    "cocod": lambda: lightning_cocod.CoCoDStrategy(tau=4, timeout=20),
    "local_sgd": lambda: lightning_cocod.LocalSGDStrategy(tau=4, timeout=20),
    "pipe_sgd": lambda: lightning_cocod.PipeSGDStrategy(timeout=20),
    "ssgd": lambda: lightning_cocod.SSGDStrategy(timeout=20),
}


class Script(pl.Callback):
    def __init__(self, out_dir, event, rank, step):
        self.out_dir, self.event, self.rank, self.step = out_dir, event, rank, step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_rank != self.rank or trainer.global_step != self.step:
            return
        (self.out_dir / "event_at").write_text(json.dumps({"time": time.time(), "step": trainer.global_step}))
        if self.event in ("sigterm", "sigusr1"):
            os.kill(os.getpid(), signal.SIGTERM if self.event == "sigterm" else signal.SIGUSR1)
        elif self.event == "request_checkpoint":
            trainer.strategy.request_checkpoint()

    def on_validation_batch_start(self, trainer, *args):
        if (
            self.event == "die_in_validation"
            and trainer.global_rank == self.rank
            and trainer.global_step >= self.step
        ):
            os._exit(3)


class Saves(pl.Callback):
    """Records the optimizer step at which each checkpoint file was written."""

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        path = self.out_dir / f"saves{trainer.global_rank}.json"
        saves = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(saves + [trainer.global_step]))


def main():
    out_dir, name, max_steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    event, event_rank, event_step = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    resume = len(sys.argv) > 7 and sys.argv[7] == "resume"
    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10, width=8), lr=0.05, schedule="none")
    evaluate = event == "die_in_validation"
    trainer = pl.Trainer(
        strategy=STRATEGIES[name](),
        accelerator="cpu",
        devices=2,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if evaluate else 0,
        val_check_interval=4 if evaluate else None,
        callbacks=[
            Script(out_dir, event, event_rank, event_step),
            Saves(out_dir),
            ModelCheckpoint(dirpath=out_dir / "ckpt", save_top_k=0, every_n_epochs=1000),
        ],
    )
    record = {"rank": int(os.environ["RANK"])}
    try:
        trainer.fit(
            model,
            datamodule=DigitsDataModule(batch_size=16),
            ckpt_path=str(out_dir / "ckpt" / "last.ckpt") if resume else None,
        )
    except lightning_cocod.Preempted as stop:
        record.update(
            ended="preempted",
            step=stop.step,
            checkpoint=stop.checkpoint,
            reason=stop.reason,
            time=time.time(),
        )
        (out_dir / f"rank{record['rank']}.json").write_text(json.dumps(record))
        raise
    record.update(ended="finished", step=trainer.global_step, time=time.time())
    (out_dir / f"rank{record['rank']}.json").write_text(json.dumps(record))
    torch.save(model.state_dict(), out_dir / f"rank{record['rank']}.pt")


if __name__ == "__main__":
    main()
