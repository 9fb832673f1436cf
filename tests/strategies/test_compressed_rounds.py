"""Compressed CoCoD and Local-SGD rounds through the Lightning strategies on 2 gloo processes:
the ranks end with the same weights, close to (and not equal to) the exact method; the bytes each
rank puts on the wire per round, against a ring all-reduce of the fp32 model; a NaN skipped with
compression leaves the ranks consistent. (The averages' bit-identity after every round, on 2 and 4
ranks, is tests/core/test_compress.py's; exact resume is tests/reliability/test_resume.py's.)"""

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy
from lightning_cocod.data import DigitsDataModule
from lightning_cocod.models import ClassifierModule, SmallCNN
from tests.helpers import toy
from tests.reliability.test_failures import PoisonRank1
from tests.strategies.test_against_reference import STEPS, TAU, WORLD, fit
from tests.strategies.test_nonfinite_skip import POISON_AFTER, reference

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


@pytest.mark.parametrize("codec", ["bf16", "int8"])
@pytest.mark.parametrize("method", ["cocod", "local_sgd"])
def test_compressed_rounds_end_identical_and_close_to_the_exact_method(tmp_path, method, codec):
    strategy = {"cocod": CoCoDStrategy, "local_sgd": LocalSGDStrategy}[method]
    ranks = fit(strategy(tau=TAU, compression=codec, start_method="fork"), tmp_path)
    exact = (toy.reference_cocod if method == "cocod" else toy.reference_local_sgd)(WORLD, STEPS, TAU)[1][0]
    assert ranks[0]["final"] == ranks[1]["final"]
    gap = max(abs(a - b) for a, b in zip(ranks[0]["final"], exact))
    assert 0 < gap < 1e-2  # compression changed the numbers, by little


def test_a_codec_of_another_name_is_refused():
    with pytest.raises(
        ValueError, match="CoCoDStrategy: compression='fp8' is invalid; accepted: None, bf16, int8"
    ):
        CoCoDStrategy(compression="fp8")
    with pytest.raises(
        TypeError, match="LocalSGDStrategy: error_feedback=.yes. is invalid; accepted: True or False"
    ):
        LocalSGDStrategy(compression="int8", error_feedback="yes")


def _bytes_per_round(compression):
    pl.seed_everything(0)
    strategy = CoCoDStrategy(tau=2, compression=compression, start_method="fork")
    model = ClassifierModule(SmallCNN(in_channels=1, num_classes=10, width=32), lr=0.05)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_steps=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=32))
    rounds = strategy.comm_stats.rounds
    numel = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for b in model.buffers() if b.is_floating_point()
    )
    return rounds, numel


def test_bytes_on_the_wire_per_round():
    fp32, numel = _bytes_per_round(None)
    # A ring all-reduce: each of 2 ranks sends half the buffer to the other, twice.
    assert {r.bytes_sent for r in fp32} == {r.bytes_received for r in fp32} == {4 * numel}
    for codec, least in (("int8", 3.5), ("bf16", 1.9)):
        rounds, _ = _bytes_per_round(codec)
        assert rounds[0].bytes_sent == 4 * numel  # the first round has no reference yet: exact
        compressed = {r.bytes_sent for r in rounds[1:]}
        assert len(compressed) == 1 and 4 * numel / compressed.pop() >= least, codec
        assert all(r.codec_seconds > 0 for r in rounds[1:])


@pytest.mark.parametrize("method, strategy_cls", [("cocod", CoCoDStrategy), ("local_sgd", LocalSGDStrategy)])
def test_a_skipped_nan_leaves_compressed_ranks_consistent(tmp_path, method, strategy_cls):
    ranks = fit(
        strategy_cls(tau=TAU, on_nonfinite="skip", compression="bf16", start_method="fork"),
        tmp_path,
        steps=16,
        callbacks=[PoisonRank1(POISON_AFTER)],
    )
    assert torch.isnan(torch.tensor(ranks[1]["trajectory"][POISON_AFTER])).any()  # it really went bad
    final = torch.tensor(ranks[0]["final"])
    assert torch.isfinite(final).all() and ranks[0]["final"] == ranks[1]["final"]
    # The run goes on as the exact skip policy does, up to bf16's rounding.
    torch.testing.assert_close(final, torch.tensor(reference(method)[1][0]), rtol=0, atol=1e-2)


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_evaluation_inside_a_compressed_round(tmp_path, codec):
    """Validation every 3 steps falls inside rounds of 4, while their exchange is on its thread:
    the evaluation's exact average and the exchange each keep to their own group (on one, the two
    threads' collectives paired up in a different order on each rank, and both ranks hung)."""
    ranks = fit(
        CoCoDStrategy(tau=TAU, compression=codec, start_method="fork"),
        tmp_path,
        limit_val_batches=1,
        val_check_interval=3,
    )
    assert ranks[0]["final"] == ranks[1]["final"]
    evaluated = [[weights for _, weights in record["evaluated"]] for record in ranks]
    assert len(evaluated[0]) >= 3 and evaluated[0] == evaluated[1]  # both saw the same average
