"""BatchNorm buffers on 2 gloo processes: the floating-point running statistics go through each
method's rounds exactly like the weights, the integer batch counter stays each rank's own, and
``average_buffers=False`` leaves the statistics local.

With BatchNorm as the first layer its running statistics depend only on the data (not on the
weights), so an independent reference is a few lines: each rank's exponential moving average of
its own batch statistics, merged by the method's rule at the end of every round. The statistics
are compared after every step: the update is linear, so every rule ends at the same final average.
"""

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WORLD, STEPS, TAU, BATCH, MOMENTUM = 2, 10, 4, 8, 0.1  # rounds of 4, 4 and a partial 2


def rank_data(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 + rank)
    # Ranks see differently placed data, so their statistics really differ.
    return torch.randn(STEPS * BATCH, 3, generator=g, dtype=torch.float64) * (1 + rank) + 2.0 * rank


class BatchNormFirst(pl.LightningModule):
    def __init__(self, out_dir: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.BatchNorm1d(3, momentum=MOMENTUM), torch.nn.Linear(3, 1)
        ).double()
        self.out_dir = Path(out_dir)
        self.trajectory: list[list[float]] = []

    def on_train_batch_end(self, *args) -> None:
        self.trajectory.append(self.net[0].running_mean.tolist())

    def on_fit_start(self) -> None:
        torch.set_num_threads(1)

    def train_dataloader(self):
        x = rank_data(self.global_rank)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_fit_end(self) -> None:
        bn = self.net[0]
        record = {
            "trajectory": self.trajectory,
            "mean": bn.running_mean.tolist(),
            "var": bn.running_var.tolist(),
            "tracked": int(bn.num_batches_tracked),
            "tracked_dtype": str(bn.num_batches_tracked.dtype),
        }
        (self.out_dir / f"rank{self.global_rank}.json").write_text(json.dumps(record))


def fit(strategy, out_dir: Path) -> list[dict]:
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=WORLD,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    trainer.fit(BatchNormFirst(str(out_dir)))
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def reference(rule: str) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each rank's running_mean after every step (a [step, rank, feature] tensor) and its
    (running_mean, running_var) at the end of fit under ``rule``: "cocod" (average of the
    round-start statistics plus the rank's own change since), "local_sgd" (the average at the end
    of each round), or "local" (never averaged)."""
    stats = [[torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)] for _ in range(WORLD)]
    snaps, trajectory = None, []

    def mean_of(tensors):
        return sum(tensors) / len(tensors)

    def merge():
        for k in range(2):
            if rule == "cocod":
                avg = mean_of([snaps[r][k] for r in range(WORLD)])
                for r in range(WORLD):
                    stats[r][k] = avg + (stats[r][k] - snaps[r][k])
            elif rule == "local_sgd":
                avg = mean_of([stats[r][k] for r in range(WORLD)])
                for r in range(WORLD):
                    stats[r][k] = avg.clone()

    for step in range(STEPS):
        if step % TAU == 0:
            snaps = [[t.clone() for t in s] for s in stats]
        for r in range(WORLD):
            x = rank_data(r)[step * BATCH : (step + 1) * BATCH]
            stats[r][0] = (1 - MOMENTUM) * stats[r][0] + MOMENTUM * x.mean(0)
            stats[r][1] = (1 - MOMENTUM) * stats[r][1] + MOMENTUM * x.var(0, unbiased=True)
        if (step + 1) % TAU == 0:
            merge()
        trajectory.append(torch.stack([s[0] for s in stats]))
    if rule == "cocod" and STEPS % TAU:
        merge()  # the partial last round, then the final average
    if rule != "local":
        for k in range(2):
            avg = mean_of([stats[r][k] for r in range(WORLD)])
            for r in range(WORLD):
                stats[r][k] = avg
    return torch.stack(trajectory), [tuple(s) for s in stats]


def assert_stats(ranks: list[dict], expected) -> None:
    trajectory, final = expected
    for r, record in enumerate(ranks):
        torch.testing.assert_close(
            torch.tensor(record["trajectory"], dtype=torch.float64), trajectory[:, r], rtol=0, atol=1e-9
        )
    for record, (mean, var) in zip(ranks, final):
        torch.testing.assert_close(torch.tensor(record["mean"], dtype=torch.float64), mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(torch.tensor(record["var"], dtype=torch.float64), var, rtol=0, atol=1e-9)
        # The batch counter is each rank's own: an integer that no round touches.
        assert record["tracked"] == STEPS and record["tracked_dtype"] == "torch.int64"


@pytest.mark.parametrize(
    "strategy, rule",
    [
        (lambda: CoCoDStrategy(tau=TAU, start_method="fork"), "cocod"),
        (lambda: LocalSGDStrategy(tau=TAU, start_method="fork"), "local_sgd"),
    ],
    ids=["cocod", "local_sgd"],
)
def test_running_statistics_go_through_the_rounds_like_the_weights(tmp_path, strategy, rule):
    ranks = fit(strategy(), tmp_path)
    expected = reference(rule)
    # The rule matters: merged by another method's rule, or never, the statistics would differ.
    for other in {"cocod", "local_sgd", "local"} - {rule}:
        assert not torch.allclose(reference(other)[0], expected[0])
    assert_stats(ranks, expected)


def test_average_buffers_false_keeps_each_ranks_statistics(tmp_path):
    ranks = fit(CoCoDStrategy(tau=TAU, start_method="fork", average_buffers=False), tmp_path)
    expected = reference("local")
    assert not torch.allclose(expected[1][0][0], expected[1][1][0])  # the ranks' data differ
    assert_stats(ranks, expected)
