"""``on_nonfinite="allow"`` trains on through NaN/Inf as DDPStrategy does: Lightning's own
``SpikeDetection`` test (a loss of -inf or NaN on one rank, ``finite_only=False``), on 2 forked gloo
ranks, runs to the end and saves its checkpoint; under the default ``"raise"`` it stops with
``NonFiniteError`` where DDP trains on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks.spike import SpikeDetection

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

SPIKE_RANK = 1


class IdentityModule(pl.LightningModule):
    """Lightning's test module (tests_pytorch/callbacks/test_spike.py): the weight is reset to one
    before every step, so the loss is the input; rank 1's input at batch ``spike_batch`` is
    ``spike``. Each rank writes its step count and final weight (the ranks are forked: files)."""

    def __init__(self, spike: float, spike_batch: int, out_dir: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1, bias=False)
        self.spike, self.spike_batch, self.out_dir = spike, spike_batch, out_dir

    def training_step(self, batch, batch_idx: int):
        with torch.no_grad():
            self.layer.weight.data = torch.ones_like(self.layer.weight.data)
        value = 1 / (batch_idx + 1)
        if self.trainer.global_rank == SPIKE_RANK and batch_idx == self.spike_batch:
            value = self.spike
        return self.layer(torch.tensor(value, device=self.device, dtype=self.dtype).view(1, 1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def on_fit_end(self) -> None:
        record = {"step": self.trainer.global_step, "weight": self.layer.weight.item()}
        (self.out_dir / f"rank{self.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("spike", [float("-inf"), float("nan")], ids=["-inf", "nan"])
@pytest.mark.parametrize("strategy_cls", [CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy])
def test_spike_detection_with_a_non_finite_loss_runs_to_the_end(tmp_path, strategy_cls, spike):
    options = {"tau": 2} if strategy_cls is not PipeSGDStrategy else {}
    # 10 samples over 2 ranks: batches 0-4 on each. The spike goes into the last gradient that
    # reaches the final weights (the reset undoes any earlier one): Pipe-SGD applies a step's mean
    # gradient at the next step, and never the last step's.
    spike_batch = 3 if strategy_cls is PipeSGDStrategy else 4
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        strategy=strategy_cls(on_nonfinite="allow", start_method="fork", **options),
        callbacks=[SpikeDetection(exclude_batches_path=tmp_path, finite_only=False)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        IdentityModule(spike, spike_batch, tmp_path), torch.utils.data.DataLoader([1 for _ in range(10)])
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["step"] for r in ranks] == [5, 5]  # every batch trained, on both ranks
    # Rank 1's non-finite gradient reached both ranks' weights, as DDP's all-reduce spreads it.
    weights = [r["weight"] for r in ranks]
    assert not any(math.isfinite(w) for w in weights) and (
        weights[0] == weights[1] or all(map(math.isnan, weights))
    )
    # The end-of-epoch checkpoint was written from those weights.
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    saved = torch.load(checkpoint, weights_only=False)["state_dict"]["layer.weight"]
    assert not torch.isfinite(saved).any()
