"""On a real shaped link (a network namespace whose loopback is rate-limited, root only), CoCoD-SGD
hides its all-reduce behind the round's steps while Local-SGD, which blocks on the same average,
exposes all of it; and each round's communication time is the link's: the bytes over the rate,
within a tolerance taken from the same rounds on the unshaped loopback. Each step's compute is a
fixed sleep, so the comparison holds on any machine."""

import os
import time

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy
from lightning_cocod.launch import launch_workers
from lightning_cocod.launch.netns import burst_bytes
from lightning_cocod.trainer import build_trainer

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="shaping a link needs root (network namespaces)"),
]
RATE_BITS, TAU, STEPS, STEP_SLEEP = 100e6, 4, 12, 0.1
WIDTH = 512  # Linear(512, 512) in float32: about 1 MB; its all-reduce takes about 0.17 s at
# 100 Mbit/s (below), well under the 0.4 s of a round's sleeps


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


def rounds_of(*methods: str) -> dict:
    """One rank: a fit per method, in these processes; each fit's rounds but the last (merged at
    the end of fit, with no steps left to hide it) as (comm_seconds, exposed_seconds, bytes)."""
    torch.set_num_threads(1)
    figures = {}
    for method in methods:
        strategy = (CoCoDStrategy if method == "cocod" else LocalSGDStrategy)(tau=TAU, timeout=60)
        trainer = build_trainer(
            strategy=strategy,
            accelerator="cpu",
            devices=2,
            max_steps=STEPS,
            limit_val_batches=0,
            use_distributed_sampler=False,
        )
        trainer.fit(Sleepy())
        figures[method] = [
            [r.comm_seconds, r.exposed_seconds, r.nbytes] for r in trainer.strategy.comm_stats
        ][:-1]
    return figures


def hidden(rounds) -> float:
    return 1 - sum(r[1] for r in rounds) / sum(r[0] for r in rounds)


def test_cocod_hides_a_shaped_links_all_reduce_that_local_sgd_waits_for(tmp_path):
    shaped = launch_workers(
        rounds_of,
        2,
        f"{RATE_BITS / 1e6:.0f}mbit",
        args=["cocod", "local_sgd"],
        timeout_s=200,
        output_dir=tmp_path / "shaped",
    )[0]
    unshaped = launch_workers(
        rounds_of, 2, None, args=["cocod"], timeout_s=200, output_dir=tmp_path / "plain"
    )[0]
    # What the machine adds to a round besides the wire (gloo's threads, the load), measured on
    # the unshaped loopback in this very test.
    overhead = max(comm for comm, _, _ in unshaped["cocod"])
    for method, rounds in shaped.items():
        assert len(rounds) >= 2
        for comm, _, nbytes in rounds:
            # Both ranks' bytes cross the one shaped loopback. At least the model's size must
            # cross it (each rank needs the other's half of the sum, and its half of the result),
            # less tbf's burst that passes ahead of the rate; a ring sends it twice (once from
            # each rank), and the machine adds what it adds to an unshaped round.
            least = (nbytes - burst_bytes(int(RATE_BITS))) * 8 / RATE_BITS
            ring = 2 * nbytes * 8 / RATE_BITS
            assert least <= comm <= 1.25 * ring + 3 * overhead, (method, comm, least, ring, overhead)
    assert hidden(shaped["cocod"]) >= 0.8, shaped["cocod"]
    assert hidden(shaped["local_sgd"]) <= 0.2, shaped["local_sgd"]
