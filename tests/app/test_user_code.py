"""Code of the user's own under cocod-train: a LightningModule of either Lightning namespace, a
data module taking any subset of the data group's keys, and the hints the app prints for such
configs, each executed."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_cocod._errors import ConfigError
from tests.helpers.app import preflight, user_module

ROOT = Path(__file__).resolve().parents[2]

# Shaped as lightning-hydra-template's MNISTLitModule: the unified `lightning` package, torchmetrics
# objects logged, sync_dist for plain tensors, the network and a partial optimizer from the config.
LIGHTNING_MODULE = """
import torch
from lightning import LightningModule
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class Net(torch.nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
        )

    def forward(self, x):
        return self.layers(x)


class LitModule(LightningModule):
    def __init__(self, net: torch.nn.Module, optimizer, scheduler=None, compile: bool = False):
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self.criterion = torch.nn.CrossEntropyLoss()
        self.train_acc, self.val_acc, self.test_acc = (MulticlassAccuracy(num_classes=10) for _ in range(3))
        self.train_loss = MeanMetric()

    def forward(self, x):
        return self.net(x)

    def model_step(self, batch):
        x, y = batch
        logits = self(x)
        return self.criterion(logits, y), logits.argmax(dim=1), y

    def training_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.val_acc(preds, targets)
        self.log("val/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def test_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.test_acc(preds, targets)
        self.log("test/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        optimizer = self.hparams.optimizer(params=self.trainer.model.parameters())
        if self.hparams.scheduler is not None:
            return {"optimizer": optimizer, "lr_scheduler": self.hparams.scheduler(optimizer=optimizer)}
        return {"optimizer": optimizer}


class NotLightning(torch.nn.Module):  # the four hooks, but no LightningModule of any namespace
    training_step = validation_step = test_step = configure_optimizers = lambda self, *args: None


import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


class OnlyBatch(pl.LightningDataModule):  # takes batch_size alone of the data group's keys
    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(256, 1, 8, 8, generator=g), torch.randint(0, 10, (256,), generator=g)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

    val_dataloader = test_dataloader = train_dataloader


class NoArgs(OnlyBatch):  # takes nothing: its batch is its own
    def __init__(self):
        super().__init__(16)
"""


def documented(start: str) -> list[str]:
    """The overrides of the command docs/app.md shows that starts with ``start``."""
    text = (ROOT / "docs" / "app.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith(start)]
    words = shlex.split(line, comments=True)
    assert words[0] == "cocod-train"
    return words[1:]


@pytest.fixture
def mymod(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "mymod", LIGHTNING_MODULE)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_lightning_module_and_a_data_module_taking_only_batch_size_train_under_the_app(mymod):
    model = documented("cocod-train experiment=smoke '~model' +model._target_=mymod.LitModule")
    data = [
        o.replace("mymod.MyData", "mymod.OnlyBatch") for o in documented("cocod-train experiment=smoke data.")
    ]
    run = [*model, *[o for o in data if o not in model], "max_epochs=1", "run_id=lit", "step_time_warmup=1"]
    # As the console script starts: the current folder is not on sys.path (python -P).
    done = subprocess.run(
        [sys.executable, "-P", "-m", "lightning_cocod.app.train", *run, f"out_root={mymod / 'out'}"],
        cwd=mymod,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = mymod / "out" / "smoke" / "lit"
    record = json.loads((job / "run.json").read_text())
    # 256 samples, 32 per rank x 2 workers: 4 steps; digits-like noise with random labels.
    assert record["steps"] == 4 and 0 <= record["test_acc"] <= 1 and record["rounds"] >= 1
    # The package's checkpoint callback, made one of lightning.pytorch's: no default ModelCheckpoint beside it.
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["last.ckpt"]
    assert (job / "csv").is_dir()  # the logger, in the module's namespace


def test_a_module_of_neither_namespace_is_refused_before_anything_starts(mymod):
    out = mymod / "out"
    with pytest.raises(ConfigError) as info:
        preflight(["experiment=smoke", "~model", "+model._target_=mymod.NotLightning", f"out_root={out}"])
    message = str(info.value)
    assert "\n" not in message and message.startswith("model._target_='mymod.NotLightning' is invalid")
    assert "mymod.NotLightning" in message.partition("it built a ")[2]
    assert "pytorch_lightning.LightningModule or lightning.LightningModule" in message
    assert not out.exists()


def test_the_strategy_logger_and_callbacks_follow_the_modules_namespace(mymod):
    import lightning.pytorch as L

    from lightning_cocod.app.user_code import in_namespace, namespace_of, node_in
    from lightning_cocod.callbacks import PeriodicCheckpoint, StepTimer

    (cfg,) = preflight(
        [
            *documented("cocod-train experiment=smoke '~model' +model._target_=mymod.LitModule"),
            f"out_root={mymod / 'out'}",
        ]
    )
    from hydra.utils import instantiate

    model = instantiate(cfg.model)
    assert namespace_of(model) == "lightning.pytorch"
    strategy = instantiate(node_in(cfg.strategy, "lightning.pytorch"))
    assert isinstance(strategy, L.strategies.DDPStrategy) and type(strategy).__name__ == "CoCoDStrategy"
    assert node_in(cfg.logger, "lightning.pytorch")._target_ == "lightning.pytorch.loggers.CSVLogger"
    saver = in_namespace(PeriodicCheckpoint(mymod / "ckpt", every_n_epochs=1), "lightning.pytorch")
    assert isinstance(saver, L.callbacks.Checkpoint) and isinstance(
        in_namespace(StepTimer(), "lightning.pytorch"), L.Callback
    )
    assert node_in(cfg.strategy, "pytorch_lightning")._target_ == "lightning_cocod.CoCoDStrategy"


def test_a_data_module_gets_the_data_keys_it_names_and_nothing_else(mymod):
    from lightning_cocod.app.user_code import data_node

    common = ["experiment=smoke", f"out_root={mymod / 'out'}"]
    (cfg,) = preflight([*common, "data._target_=mymod.OnlyBatch"])
    assert OmegaConf.to_container(data_node(cfg.data)) == {"_target_": "mymod.OnlyBatch", "batch_size": 32}
    (cfg,) = preflight([*common, "data._target_=mymod.NoArgs", "data.batch_size=16"])
    assert OmegaConf.to_container(data_node(cfg.data)) == {"_target_": "mymod.NoArgs"}
    # A key set on the command line is the user's: one the module does not take is refused.
    with pytest.raises(
        ConfigError, match=r"^unknown key 'data\.seed' \(data\.seed=3\); OnlyBatch takes: batch_size"
    ):
        preflight([*common, "data._target_=mymod.OnlyBatch", "data.seed=3"])
    # The package's modules keep their strict keys.
    with pytest.raises(ConfigError, match=r"^unknown key 'data\.nope'"):
        preflight([*common, "+data.nope=1"])


def run_hint(message: str, pattern: str, value: str = "") -> list[str]:
    """The command a message prints, found by ``pattern`` (its one group), ``...`` given ``value``."""
    found = re.search(pattern, message)
    assert found, message
    return shlex.split(found.group(1).replace("=...", f"={value}"))


@pytest.mark.parametrize(
    ("argv", "pattern", "value", "kept"),
    [
        # A module of the user's own with a batch of its own: the record must read the same.
        (["data._target_=mymod.NoArgs"], r"the batch_size of NoArgs.*: (data\.batch_size=\d+)$", "", 1),
        # ~data drops the data group: the whole command, without it.
        (
            ["~data", "+data._target_=mymod.OnlyBatch"],
            r"in its place without it: cocod-train (.*)$",
            "",
            None,
        ),
        (["strategy.tau_max=3"], r"\((\+strategy\.tau_max=\.\.\.) adds it", "3", 0),
        (["trainer.gradient_clip_val=1.0"], r"\((\+trainer\.gradient_clip_val=\.\.\.) adds it", "1.0", 0),
        (
            ["strategy=ssgd", "strategy.tau=3"],
            r"the period of every method that has one is (tau=\.\.\.)",
            "3",
            1,
        ),
        (["model._target_=mymod.LitModule"], r"a module of your own: (.*)$", "", 0),
        (["~model", "+model._target_=mymod.LitModule", "+model.x=1"], r"\(drop it: (~model\.x)\)", "", 3),
    ],
)
def test_every_hint_for_a_config_error_is_a_command_that_works(argv, pattern, value, kept, mymod):
    """Each hint, executed: in place of the override it corrects (the first ``kept`` given stay),
    or as the whole command line (kept None)."""
    common = ["experiment=smoke", f"out_root={mymod / 'out'}"]
    with pytest.raises(ConfigError) as info:
        preflight([*common, *argv])
    message = str(info.value)
    assert "\n" not in message
    hinted = run_hint(message, pattern, value)
    if kept is None:
        fixed = hinted
    else:
        fixed = [*common, *argv[:kept], *hinted]
    if "+model._target_=mymod.LitModule" in fixed:  # its network and optimizer, which it needs
        fixed += ["+model.net._target_=mymod.Net", "+model.optimizer._target_=torch.optim.SGD"]
        fixed += ["+model.optimizer._partial_=true"]
    assert preflight(fixed)


@pytest.mark.parametrize("argv", [["trainer.foo=1"], ["hetero.nope=1"], ["strategy.nope=1"]])
def test_no_hint_offers_a_key_that_adding_would_refuse(argv, mymod):
    with pytest.raises(ConfigError) as info:
        preflight(["experiment=smoke", f"out_root={mymod / 'out'}", *argv])
    assert "adds" not in str(info.value) and "+" not in str(info.value)
