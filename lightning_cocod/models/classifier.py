"""LightningModule for image classification with SGD, linear LR scaling, warm-up and decay."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import SGD
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics.classification import MulticlassAccuracy

from lightning_cocod._options import require
from lightning_cocod.models.nets import build_model
from lightning_cocod.models.schedule import SCHEDULES, lr_factor

_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def param_groups(net: nn.Module, weight_decay: float, no_decay_bn_bias: bool) -> list[dict]:
    """SGD parameter groups; with ``no_decay_bn_bias`` all biases and norm-layer affine parameters get
    no weight decay, because shrinking a BN scale or a shift only fights the normalisation and does
    not regularise the function (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 5.1)."""
    if not no_decay_bn_bias:
        return [{"params": [p for p in net.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    decay, no_decay, seen = [], [], set()
    for module in net.modules():
        for name, p in module.named_parameters(recurse=False):
            # A tied weight (GPT's embedding and output layer) is one parameter of two modules.
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            (no_decay if isinstance(module, _NORM_TYPES) or name == "bias" else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _require(ok: bool, name: str, value: object, accepted: str) -> None:
    require(ok, "ClassifierModule", name, value, accepted)


class ClassifierModule(pl.LightningModule):
    """Cross-entropy classifier trained with SGD, or the optimizer that ``optimizer`` builds.

    ``net`` is an ``nn.Module`` (what Hydra instantiates) or a name for
    :func:`lightning_cocod.models.build_model`, in which case ``num_classes`` is required.
    Batches are ``(x, y)`` with ``x`` already a normalised float tensor on the device: the datamodules
    do that in ``on_after_batch_transfer``, so this module must not override that hook (Lightning
    would then call the module's instead, with a warning).

    ``channels_last`` stores the network's 4-D weights and feeds it 4-D batches in NHWC memory
    order, which GPU convolutions (cuDNN, tensor cores) run fastest in; values are unchanged.
    With ``Trainer(precision="bf16-mixed")`` it is the usual pair of GPU speed options.
    A training step reads nothing back from the device (the accuracy is accumulated there and
    computed at the end of the epoch), so the host can run ahead of a GPU.

    ``optimizer`` builds the optimizer from the parameter groups and ``lr`` (scaled and scheduled
    as for SGD), e.g. ``partial(torch.optim.AdamW, betas=(0.9, 0.999))``: a config node with
    ``_partial_: true``. None: SGD with ``momentum`` and ``nesterov``, which are SGD's alone.
    """

    def __init__(
        self,
        net: nn.Module | str,
        num_classes: int | None = None,
        in_channels: int = 3,
        lr: float = 0.1,
        momentum: float = 0.9,
        nesterov: bool = False,
        weight_decay: float = 5e-4,
        no_decay_bn_bias: bool = True,
        warmup_epochs: float = 0.0,
        schedule: str = "cosine",
        milestones: Sequence[float] = (),
        gamma: float = 0.1,
        max_epochs: int | None = None,
        scale_lr: bool = False,
        base_batch_size: int = 128,
        global_batch_size: int | None = None,
        channels_last: bool = False,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
    ) -> None:
        super().__init__()
        _require(lr > 0, "lr", lr, "a positive float")
        _require(0 <= momentum < 1, "momentum", momentum, "a float in [0, 1)")
        _require(not nesterov or momentum > 0, "nesterov", nesterov, "False when momentum is 0")
        _require(weight_decay >= 0, "weight_decay", weight_decay, "a float >= 0")
        _require(warmup_epochs >= 0, "warmup_epochs", warmup_epochs, "a number >= 0")
        _require(schedule in SCHEDULES, "schedule", schedule, ", ".join(map(repr, SCHEDULES)))
        milestones = [float(m) for m in milestones]
        increasing = all(m >= 0 for m in milestones) and milestones == sorted(milestones)
        _require(increasing, "milestones", milestones, "non-negative epochs in increasing order")
        _require(gamma > 0, "gamma", gamma, "a positive float")
        _require(max_epochs is None or max_epochs >= 1, "max_epochs", max_epochs, "None or an int >= 1")
        _require(base_batch_size >= 1, "base_batch_size", base_batch_size, "an int >= 1")
        ok_batch = global_batch_size is None or global_batch_size >= 1
        _require(ok_batch, "global_batch_size", global_batch_size, "None or an int >= 1")
        _require(isinstance(channels_last, bool), "channels_last", channels_last, "True or False")
        # A module cannot go into hparams (checkpoints, loggers); a model name can.
        ignored = ["net", "optimizer"] if isinstance(net, nn.Module) else ["optimizer"]
        self.save_hyperparameters(ignore=ignored)
        self.build_optimizer = optimizer or partial(SGD, momentum=momentum, nesterov=nesterov)
        if isinstance(net, str):
            _require(num_classes is not None, "num_classes", num_classes, "an int when net is a model name")
            net = build_model(net, num_classes=num_classes, in_channels=in_channels)
        self.channels_last = channels_last
        # Module.to keeps each tensor's strides when it later moves the model to its device.
        self.net = net.to(memory_format=torch.channels_last) if channels_last else net
        if num_classes is None:  # read from the network's last linear layer
            linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
            _require(bool(linears), "num_classes", None, "an int when the network has no nn.Linear")
            num_classes = linears[-1].out_features
        self.num_classes = num_classes
        self.milestones = milestones
        acc = partial(MulticlassAccuracy, num_classes=self.num_classes, average="micro")
        # Checking the labels' range every step reads a value back from the device (a host sync
        # per step); training labels come from our own datamodules.
        self.train_acc, self.val_acc, self.test_acc = acc(validate_args=False), acc(), acc()
        # Top-5 says little with 10 classes; it is the usual second number for CIFAR-100.
        top5 = self.num_classes >= 100
        self.val_acc_top5 = acc(top_k=5) if top5 else None
        self.test_acc_top5 = acc(top_k=5) if top5 else None

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        # update, not forward: forward also computes this batch's accuracy, which nothing reads.
        self.train_acc.update(logits.detach(), y)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _eval_step(self, stage: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        # Metric objects gather their counts across ranks themselves, so accuracy is exact even
        # when ranks hold shards of different sizes; the loss is a mean of per-rank means.
        self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, prog_bar=True, batch_size=len(y))
        for suffix in ("", "_top5"):
            metric = getattr(self, f"{stage}_acc{suffix}")
            if metric is not None:
                metric(logits, y)
                self.log(
                    f"{stage}/acc{suffix}", metric, on_epoch=True, prog_bar=not suffix, batch_size=len(y)
                )

    def resolve_global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks, for linear LR scaling."""
        if self.hparams.global_batch_size is not None:
            return int(self.hparams.global_batch_size)
        datamodule = getattr(self.trainer, "datamodule", None)
        if getattr(datamodule, "global_batch_size", None) is not None:
            return int(datamodule.global_batch_size)
        if getattr(datamodule, "batch_size", None) is not None:
            return int(datamodule.batch_size) * self.trainer.world_size
        raise ValueError(
            "scale_lr=True needs the global batch size: pass global_batch_size=... to ClassifierModule "
            "or fit with a datamodule that has a batch_size attribute"
        )

    def _steps(self) -> tuple[int, int]:
        """(optimizer steps per epoch, total optimizer steps) of the coming fit."""
        trainer = self.trainer
        estimated = trainer.estimated_stepping_batches  # loads the train loader when it needs to
        if trainer.train_dataloader is None:  # max_epochs=-1 skips the loading above
            trainer.fit_loop.setup_data()
        batches = trainer.num_training_batches
        if math.isinf(batches):
            raise ValueError("the LR schedule is defined in epochs but the train loader has no length")
        steps_per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches))
        if self.hparams.max_epochs is not None:
            return steps_per_epoch, self.hparams.max_epochs * steps_per_epoch
        if math.isinf(estimated):
            raise ValueError("set max_epochs (here or on the Trainer) or max_steps to define the LR schedule")
        return steps_per_epoch, int(estimated)

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        lr = hp.lr * (self.resolve_global_batch_size() / hp.base_batch_size if hp.scale_lr else 1.0)
        groups = param_groups(self.net, hp.weight_decay, hp.no_decay_bn_bias)
        optimizer = self.build_optimizer(groups, lr=lr)
        steps_per_epoch, total_steps = self._steps()
        factor = partial(
            lr_factor,
            schedule=hp.schedule,
            warmup_steps=round(hp.warmup_epochs * steps_per_epoch),
            total_steps=total_steps,
            milestone_steps=[round(m * steps_per_epoch) for m in self.milestones],
            gamma=hp.gamma,
        )
        scheduler = {"scheduler": LambdaLR(optimizer, factor), "interval": "step", "name": "lr"}
        return {"optimizer": optimizer, "lr_scheduler": scheduler}
