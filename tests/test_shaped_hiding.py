"""On a real shaped link (a network namespace whose loopback is rate-limited, root only), CoCoD-SGD
hides its all-reduce behind the round's steps while Local-SGD, which blocks on the same average,
exposes all of it. Each step's compute is a fixed sleep, so the comparison holds on any machine."""

import os
import time

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy
from lightning_cocod.launch import launch_workers
from lightning_cocod.trainer import build_trainer

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="shaping a link needs root (network namespaces)"),
]
RATE_BITS, TAU, STEPS, STEP_SLEEP = 100e6, 4, 12, 0.1
WIDTH = 512  # Linear(512, 512) in float32: about 1 MB; a ring all-reduce of it takes about 0.16 s at
# 100 Mbit/s (the whole model each way), well under the 0.4 s of a round's sleeps


class Sleepy(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(WIDTH, WIDTH)

    def train_dataloader(self):
        x = torch.randn(STEPS * 4, WIDTH, generator=torch.Generator().manual_seed(self.global_rank))
        return DataLoader(TensorDataset(x), batch_size=4)

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_SLEEP)  # the compute a round can hide communication behind
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def hiding_rank(method: str) -> dict:
    torch.set_num_threads(1)
    strategy = (CoCoDStrategy if method == "cocod" else LocalSGDStrategy)(tau=TAU, timeout=60)
    trainer = build_trainer(
        strategy=strategy, accelerator="cpu", devices=2, max_steps=STEPS, limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(Sleepy())
    rounds = trainer.strategy.comm_stats.rounds
    return {"rounds": [[r.comm_seconds, r.exposed_seconds, r.nbytes] for r in rounds]}


@pytest.mark.parametrize("method", ["cocod", "local_sgd"])
def test_cocod_hides_a_shaped_links_all_reduce_that_local_sgd_waits_for(method, tmp_path):
    results = launch_workers(hiding_rank, 2, f"{RATE_BITS / 1e6:.0f}mbit", args=[method], timeout_s=200,
                             output_dir=tmp_path)
    # The last round is merged at the end of fit, with no steps left to hide it.
    rounds = results[0]["rounds"][:-1]
    assert len(rounds) >= 2
    for comm, _, nbytes in rounds:
        # The link really is shaped: no all-reduce of the model beats its rate (a ring sends
        # about the whole model each way between 2 ranks).
        assert comm >= 0.9 * nbytes * 8 / RATE_BITS, (comm, nbytes)
    hidden = 1 - sum(r[1] for r in rounds) / sum(r[0] for r in rounds)
    if method == "cocod":
        assert hidden >= 0.8, rounds
    else:
        assert hidden <= 0.2, rounds
