"""Consistency points and Lightning features on 2 gloo processes: evaluation sees the averaged
model without changing the trajectory; logs carry the round figures; accumulation and a single
device work (clipping, schedulers and bf16: strategies/test_features.py)."""

import csv

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy
from tests.helpers import toy
from tests.strategies.test_against_reference import STEPS, TAU, WORLD, assert_matches, fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def test_validation_sees_the_average_and_leaves_the_trajectory_alone(tmp_path):
    ranks = fit(
        CoCoDStrategy(tau=TAU, start_method="fork"),
        tmp_path,
        limit_val_batches=1,
        val_check_interval=3,
        num_sanity_val_steps=1,
    )
    trajectory, final = toy.reference_cocod(WORLD, STEPS, TAU)
    assert_matches(ranks, trajectory, final)  # unchanged by the evaluations in between
    evaluated = ranks[0]["evaluated"]
    assert [step for step, _ in evaluated] == [0, 3, 6, 9]
    for step, weights in evaluated[1:]:
        mean = [(a + b) / 2 for a, b in zip(trajectory[step - 1][0], trajectory[step - 1][1])]
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(mean), rtol=0, atol=1e-9)
    assert ranks[1]["evaluated"] == evaluated  # every rank evaluates the same averaged model


def test_round_figures_reach_the_logger(tmp_path):
    logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run", version=0)
    fit(CoCoDStrategy(tau=2, start_method="fork"), tmp_path, logger=logger, log_every_n_steps=2)
    with open(tmp_path / "logs" / "run" / "version_0" / "metrics.csv") as logged_file:
        rows = list(csv.DictReader(logged_file))
    logged = [r for r in rows if r.get("comm/round_seconds")]
    assert len(logged) >= 3
    for row in logged:
        assert float(row["comm/round_seconds"]) > 0
        assert 0.0 <= float(row["comm/hidden_fraction"]) <= 1.0
        assert (
            float(row["comm/payload_bytes"]) == float(row["comm/bytes_sent"]) == (4 * 2 + 2) * 8
        )  # Linear(4, 2) in float64, a ring of 2


def test_accumulation_counts_optimizer_steps(tmp_path):
    module = toy.ToyRegression(6, str(tmp_path))  # 6 batches of data for 3 optimizer steps
    ranks = fit(
        CoCoDStrategy(tau=2, start_method="fork"), tmp_path, steps=3, module=module, accumulate_grad_batches=2
    )
    assert ranks[0]["rounds"] == [[0, 2], [2, 3]]  # 3 optimizer steps = 6 batches
    assert len(ranks[0]["trajectory"]) == 6
    assert ranks[0]["final"] == ranks[1]["final"]


def test_one_device_is_plain_training(tmp_path):
    results = []
    for strategy in (CoCoDStrategy(tau=2), "auto"):
        torch.manual_seed(0)
        module = toy.ToyRegression(6, str(tmp_path))
        trainer = pl.Trainer(
            strategy=strategy,
            accelerator="cpu",
            devices=1,
            max_steps=6,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            use_distributed_sampler=False,  # the same batches for both
        )
        trainer.fit(module)
        results.append(module.trajectory)
    assert results[0] == results[1]
