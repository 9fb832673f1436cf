"""A linear-regression LightningModule with per-rank data, and reference simulations of each
update rule written independently of lightning_cocod.core (plain loops over parameters)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

BATCH = 8
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 1e-3


def rank_batches(rank: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(steps * BATCH, 4, generator=g, dtype=torch.float64)
    w_true = torch.tensor([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0], [-1.0, 1.0]], dtype=torch.float64)
    y = x @ w_true + 0.1 * (rank + 1) * torch.randn(steps * BATCH, 2, generator=g, dtype=torch.float64)
    return x, y


def initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2).double()


def flat(module: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


class ToyLogic:
    """Writes every rank's weights after each optimizer step and at fit end to ``out_dir``; mixed
    into a LightningModule of either namespace (``ToyRegression``, ``toy_module``)."""

    def __init__(
        self, steps: int, out_dir: str, momentum: float = MOMENTUM, weight_decay: float = WEIGHT_DECAY
    ):
        super().__init__()
        self.net = initial_model()
        self.steps, self.out_dir = steps, Path(out_dir)
        self.momentum, self.weight_decay = momentum, weight_decay
        self.trajectory: list[list[float]] = []
        self.events: list[tuple[str, int]] = []
        self.evaluated: list[tuple[int, list[float]]] = []  # (global step, weights seen by evaluation)

    def on_fit_start(self) -> None:
        torch.set_num_threads(1)  # forked workers: keep OpenMP out of the picture

    def train_dataloader(self):
        x, y = (t.to(self.net.weight.dtype) for t in rank_batches(self.global_rank, self.steps))
        return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)

    def training_step(self, batch, batch_idx):
        self.events.append(("train", self.trainer.global_step))
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def val_dataloader(self):
        x, y = (t.to(self.net.weight.dtype) for t in rank_batches(99, 1))
        return DataLoader(TensorDataset(x, y), batch_size=BATCH)

    def validation_step(self, batch, batch_idx):
        self.evaluated.append((self.trainer.global_step, flat(self.net)))
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.evaluated.append((-1, flat(self.net)))

    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=LR, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def on_train_batch_end(self, *args) -> None:
        self.trajectory.append(flat(self.net))

    def on_fit_end(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "trajectory": self.trajectory,
            "final": flat(self.net),
            "events": self.events,
            "evaluated": self.evaluated,
        }
        stats = getattr(self.trainer.strategy, "comm_stats", None)
        if stats is not None:
            record["rounds"] = [[r.launch_step, r.finish_step] for r in stats.rounds]
            record["waits"] = [[r.exposed_seconds, r.comm_seconds] for r in stats.rounds]
            record["summary"] = stats.summary()
        (self.out_dir / f"rank{self.global_rank}.json").write_text(json.dumps(record))


class ToyRegression(ToyLogic, pl.LightningModule):
    pass


def toy_module(lightning_module_class: type) -> type:
    """The toy as a module of another Lightning namespace (``lightning.LightningModule``)."""
    return type("ToyRegression", (ToyLogic, lightning_module_class), {})


def read_ranks(out_dir: Path, world: int) -> list[dict]:
    return [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]


class _Workers:
    def __init__(
        self,
        world: int,
        steps: int,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
        frozen_bias: bool = False,
    ):
        base = initial_model()
        self.models = [copy.deepcopy(base) for _ in range(world)]
        self.opts = [
            torch.optim.SGD(
                [m.weight] if frozen_bias else m.parameters(),
                lr=LR,
                momentum=momentum,
                weight_decay=weight_decay,
            )
            for m in self.models
        ]
        for m in self.models:
            m.bias.requires_grad_(not frozen_bias)
        self.data = [rank_batches(r, steps) for r in range(world)]
        self.world = world

    def grads(self, step: int) -> None:
        for r, (m, o) in enumerate(zip(self.models, self.opts)):
            x, y = (t[step * BATCH : (step + 1) * BATCH] for t in self.data[r])
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()

    def params(self, r: int) -> list[torch.Tensor]:
        return list(self.models[r].parameters())

    @torch.no_grad()
    def average(self) -> None:
        for k in range(len(self.params(0))):
            mean = sum(self.params(r)[k] for r in range(self.world)) / self.world
            for r in range(self.world):
                self.params(r)[k].copy_(mean)

    def snapshot(self) -> list[list[torch.Tensor]]:
        return [[p.detach().clone() for p in self.params(r)] for r in range(self.world)]

    def state(self) -> list[list[float]]:
        return [flat(m) for m in self.models]


def reference_cocod(
    world: int,
    steps: int,
    tau: int,
    unfreeze_bias_at: int | None = None,
    progress: float = 1.0,
    clip: float | None = None,
    gamma: float | None = None,
) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Per-step per-rank weights and final weights of CoCoD-SGD, straight from the update rule
    ``x_i <- avg + progress (x_i - snap_i)`` (1: the paper's rule, CoCoDStrategy's default).

    ``unfreeze_bias_at``: the bias starts frozen and out of the optimizer, and joins it (a new
    param group) before that step, as fine-tuning callbacks do; the rounds cover every parameter.
    ``clip``: each worker's gradient norm is clipped to it before its step; ``gamma``: the
    learning rate of step t is ``LR * gamma**t`` (a scheduler stepped every step).
    """
    w = _Workers(world, steps, frozen_bias=unfreeze_bias_at is not None)
    trajectory, snaps = [], None

    @torch.no_grad()
    def merge():
        for k in range(len(snaps[0])):
            avg = sum(snaps[r][k] for r in range(world)) / world
            for r in range(world):
                p = w.params(r)[k]
                p.copy_(avg + progress * (p - snaps[r][k]))

    for step in range(steps):
        if step == unfreeze_bias_at:
            for m, o in zip(w.models, w.opts):
                m.bias.requires_grad_(True)
                o.add_param_group({"params": [m.bias]})
        if step % tau == 0:
            snaps = w.snapshot()
        w.grads(step)
        for m, o in zip(w.models, w.opts):
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            if gamma is not None:
                for group in o.param_groups:
                    group["lr"] = LR * gamma**step
            o.step()
        if (step + 1) % tau == 0:
            merge()
        trajectory.append(w.state())
    if steps % tau:  # fit ends inside a round: merge the partial round, then average
        merge()
    w.average()
    return trajectory, w.state()


def reference_local_sgd(
    world: int, steps: int, tau: int, momentum: float = MOMENTUM, weight_decay: float = WEIGHT_DECAY
):
    w = _Workers(world, steps, momentum, weight_decay)
    trajectory = []
    for step in range(steps):
        w.grads(step)
        for o in w.opts:
            o.step()
        if (step + 1) % tau == 0:
            w.average()
        trajectory.append(w.state())
    w.average()
    return trajectory, w.state()


def reference_pipe_sgd(world: int, steps: int):
    w = _Workers(world, steps)
    trajectory, previous = [], None
    for step in range(steps):
        w.grads(step)
        current = [sum(w.params(r)[k].grad for r in range(world)) / world for k in range(len(w.params(0)))]
        for r in range(world):
            for k, p in enumerate(w.params(r)):
                p.grad = None if previous is None else previous[k].clone()
        for o in w.opts:
            o.step()
        previous = current
        trajectory.append(w.state())
    return trajectory, w.state()


def reference_ssgd(
    world: int, steps: int, momentum: float = MOMENTUM, weight_decay: float = WEIGHT_DECAY, mean=None
):
    """``mean``: how the ranks' gradients of one tensor become the one every rank applies
    (default: the fp32 mean)."""
    w = _Workers(world, steps, momentum, weight_decay)
    trajectory = []
    reduce = mean or (lambda grads: sum(grads) / world)
    for step in range(steps):
        w.grads(step)
        mean = [reduce([w.params(r)[k].grad for r in range(world)]) for k in range(len(w.params(0)))]
        for r in range(world):
            for k, p in enumerate(w.params(r)):
                p.grad = mean[k].clone()
        for o in w.opts:
            o.step()
        trajectory.append(w.state())
    return trajectory, w.state()
