"""The GPT in the app: experiment=gpt and gpt_smoke pass the app's checks, the study's recipe
composes the runs it promises, and the smoke experiment trains end to end on 2 CoCoD-SGD workers,
learning (below the source's unigram loss) with its records written."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_cocod._errors import ConfigError
from lightning_cocod.app.checks import method_of
from lightning_cocod.data.markov import MarkovTextDataModule
from tests.helpers.app import preflight, recipe_jobs

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_gpt_experiments_pass_the_app_s_checks():
    (study,) = preflight(["experiment=gpt"])
    assert study.launcher.devices == 4 and study.model._target_ == "lightning_cocod.models.GPTModule"
    assert study.model.vocab_size == study.data.vocab_size and study.model.block_size == study.data.block_size
    assert study.optimizer._target_ == "torch.optim.AdamW" and list(study.optimizer.betas) == [0.9, 0.95]
    (smoke,) = preflight(["experiment=gpt_smoke"])
    assert smoke.launcher.devices == 2
    refused = r"^model: GPT: n_embd=30 is invalid; accepted: a multiple of n_head \(4\)$"
    with pytest.raises(ConfigError, match=refused):
        preflight(["experiment=gpt_smoke", "model.n_embd=30", "model.n_head=4"])
    with pytest.raises(ConfigError, match=r"^data: MarkovTextDataModule: block_size=2 is invalid"):
        preflight(["experiment=gpt_smoke", "data.block_size=2"])


# What each worker died of 15-22 s after it started (a Trainer's or torch's error at the first
# epoch or batch), now refused by cocod-train before any starts.
REFUSED_BEFORE_THE_WORKERS = {
    # Lightning: "val_check_interval must be <= the number of training batches" (100 a rank here).
    ("experiment=gpt_smoke", "trainer.val_check_interval=100000"): (
        "trainer.val_check_interval=100000 is invalid; accepted: at most 100, the training batches of an "
        "epoch on each of the 2 workers (3200 samples in global batches of 16 x 2)"
    ),
    # Lightning: a float val_check_interval needs check_val_every_n_epoch.
    ("experiment=gpt_smoke", "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=0.5"): (
        "trainer.val_check_interval=0.5 is invalid; accepted: a number of batches >= 1 (counted over the "
        "whole run) with trainer.check_val_every_n_epoch=null"
    ),
    # torch: an IndexError in the embedding, at the first id >= 10.
    ("experiment=gpt_smoke", "model.vocab_size=10"): (
        "model.vocab_size=10 is invalid; accepted: at least 27, the data's vocabulary (data.vocab_size"
    ),
    # The GPT: a sequence of 32 tokens is longer than block_size=16.
    ("experiment=gpt_smoke", "model.block_size=16"): (
        "model.block_size=16 is invalid; accepted: at least 32, the data's block length (data.block_size"
    ),
    # torch: an embedding of float images.
    ("model=gpt", "data=synthetic", "optimizer=adamw"): (
        "data._target_='lightning_cocod.data.SyntheticDataModule' is invalid; accepted: token data for "
        "GPTModule (model=gpt): data=markov, or a module of your own; SyntheticDataModule gives no token ids"
    ),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("argv", list(REFUSED_BEFORE_THE_WORKERS), ids=lambda argv: " ".join(argv))
def test_what_the_workers_would_die_of_is_refused_before_they_start(argv, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "lightning_cocod.app.train", *argv, f"out_root={tmp_path}/out"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("cocod-train: error: "), done.stderr
    assert REFUSED_BEFORE_THE_WORKERS[argv] in lines[0], lines[0]
    # No run folder (where the workers' logs go) was made, and the launcher never said it started any.
    assert not (tmp_path / "out").exists() and "starting the workers" not in done.stdout + done.stderr


@pytest.mark.timeout(120)
def test_the_gpt_s_limits_are_the_data_s_and_an_epoch_s():
    """The edges of the refusals above pass: an interval of exactly an epoch's batches, a model as
    large as the data or larger, a count over the whole run without epochs."""
    preflight(["experiment=gpt_smoke", "trainer.val_check_interval=100"])
    preflight(["experiment=gpt_smoke", "model.vocab_size=27", "model.block_size=32"])
    preflight(["experiment=gpt_smoke", "model.vocab_size=40", "model.block_size=64"])
    preflight(
        ["experiment=gpt_smoke", "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=500"]
    )
    # Three workers: 3200 // (16 x 3) = 66 batches each; a limit on the batches shortens the epoch.
    with pytest.raises(
        ConfigError, match=r"^trainer.val_check_interval=67 is invalid; accepted: at most 66, "
    ):
        preflight(["experiment=gpt_smoke", "launcher.devices=3", "trainer.val_check_interval=67"])
    limited = ["experiment=gpt_smoke", "+trainer.limit_train_batches=0.5", "trainer.val_check_interval=51"]
    with pytest.raises(
        ConfigError, match=r"^trainer.val_check_interval=51 is invalid; accepted: at most 50, "
    ):
        preflight(limited)
    preflight(["experiment=gpt_smoke", "+trainer.limit_val_batches=0", "trainer.val_check_interval=101"])


@pytest.mark.timeout(300)
def test_the_gpt_study_recipe_runs_each_method_and_codec_once_per_condition(tmp_path):
    env = {"OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "mini", "WORKERS": "2", "SEEDS": "0"}
    jobs, report = recipe_jobs("gpt_study.sh", tmp_path, env, "max_epochs=1")
    ran, groups = [], set()
    for cfg in jobs:
        method = method_of(cfg.strategy)
        period = cfg.strategy.tau if method in ("local_sgd", "cocod") else None  # tau=null: the default, auto
        codec = cfg.strategy.get("compression") or cfg.strategy.get("comm_hook")
        ran.append((method, period, codec))
        assert cfg.name == "gpt" and cfg.launcher.devices == 2 and cfg.max_epochs == 1
        groups.add(cfg.group)
    assert ran == [
        ("ssgd", None, None),
        ("local_sgd", 4, None),
        ("local_sgd", 8, None),
        ("ssgd", None, "bf16"),
        ("cocod", "auto", None),
        ("cocod", "auto", "bf16"),
        ("cocod", "auto", "int8"),
        ("cocod", 8, "int8"),
    ]
    # The convolutional study's links, and the language model's measure of time to target.
    assert {(cfg.launcher.rate, cfg.launcher.topology, cfg.judged_by) for cfg in jobs} == {
        ("100mbit", "pernode", "loss")
    }
    assert groups == {"gpt-mini"}
    assert report[:3] == [str(tmp_path / "out" / "gpt"), "--group", "gpt-mini"]


@pytest.mark.timeout(300)
def test_the_long_rounds_recipe_runs_its_rows_on_slow_links_and_adds_seeds_to_a_group(tmp_path):
    env = {"OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "mini", "SEEDS": "0"}
    jobs, report = recipe_jobs("long_rounds_study.sh", tmp_path, env, "max_epochs=1")
    ran = []
    for cfg in jobs:
        s = cfg.strategy
        outer = s.get("outer_optimizer")
        outer = outer and (outer.lr, outer.momentum, outer.nesterov)
        codec = s.get("compression") or s.get("comm_hook")
        ran.append((method_of(s), s.get("tau"), s.get("overlap"), outer, codec, s.get("progress")))
    nesterov = (0.7, 0.9, True)
    assert ran == [
        ("ssgd", None, None, None, None, None),
        ("ssgd", None, None, None, "bf16", None),
        ("local_sgd", 8, None, None, None, None),
        ("diloco", 8, 0, nesterov, None, None),
        ("diloco", 8, 1, nesterov, "int8", None),
        ("cocod", "auto", None, None, None, 1.0),
        ("cocod", 1, None, None, "int8", 2.0),
    ]
    # 4 workers behind 25 Mbit/s each, judged by the validation loss, one group.
    assert {(c.launcher.rate, c.launcher.topology, c.launcher.devices, c.judged_by) for c in jobs} == {
        ("25mbit", "pernode", 4, "loss")
    }
    assert {c.group for c in jobs} == {"long-mini"} and report[:3] == [
        str(tmp_path / "out" / "gpt"),
        "--group",
        "long-mini",
    ]
    # A later pass joins the first one's group, so its report compares all the seeds.
    jobs, report = recipe_jobs(
        "long_rounds_study.sh", tmp_path, {**env, "RUN_ID": "more", "GROUP": "long-mini"}
    )
    assert {c.group for c in jobs} == {"long-mini"} and report[2] == "long-mini"
    assert {c.run_id.split("-")[0] for c in jobs} == {"more"}


@pytest.mark.timeout(300)
def test_the_tuned_long_rounds_recipe_runs_each_method_at_its_own_learning_rates(tmp_path):
    env = {"OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "t", "SEEDS": "0"}
    jobs, report = recipe_jobs("long_rounds_tuned.sh", tmp_path, env)
    ssgd, outer = jobs
    assert method_of(ssgd.strategy) == "ssgd" and ssgd.model.lr == 3e-3
    s = outer.strategy
    assert (method_of(s), s.tau, s.overlap, s.compression) == ("diloco", 16, 1, "int8")
    assert (s.outer_optimizer.lr, s.outer_optimizer.momentum, s.outer_optimizer.nesterov) == (1.0, 0.8, True)
    schedule = s.outer_scheduler
    assert (schedule._target_, schedule.start_factor, schedule.total_iters) == (
        "torch.optim.lr_scheduler.LinearLR",
        0.25,
        3,
    )
    assert outer.model.lr == 4e-3
    # Equal samples: the outer round is judged against S-SGD trained as long.
    assert ssgd.max_epochs == outer.max_epochs == 6
    assert {(c.launcher.rate, c.launcher.devices, c.group) for c in jobs} == {("25mbit", 4, "tuned-t")}
    # Checkpoints by the clock, the same for both (per epoch would charge the faster one more).
    assert {(c.checkpoint.every_n_epochs, c.checkpoint.every_n_minutes) for c in jobs} == {(0, 5)}
    assert report[2] == "tuned-t"
    # ROWS runs the rows named, in the recipe's order.
    jobs, _ = recipe_jobs("long_rounds_tuned.sh", tmp_path, {**env, "RUN_ID": "r", "ROWS": "outer16"})
    assert [c.run_id for c in jobs] == ["r-w4-outer16"]
    # At 8 workers the outer round's inner lr is the one tuned there; S-SGD's stays.
    jobs, _ = recipe_jobs(
        "long_rounds_tuned.sh", tmp_path, {**env, "RUN_ID": "e", "WORKERS": "8", "RATE": "10mbit"}
    )
    ssgd, outer = jobs
    assert (ssgd.model.lr, outer.model.lr, outer.strategy.tau) == (3e-3, 2e-3, 16)
    # There the outer round is timed to S-SGD's 6-epoch loss over 8 epochs of its own.
    assert (ssgd.max_epochs, outer.max_epochs) == (6, 8)
    assert {(c.launcher.rate, c.launcher.devices) for c in jobs} == {("10mbit", 8)}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_the_gpt_smoke_experiment_learns_on_two_cocod_workers(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_cocod.app.train",
            "experiment=gpt_smoke",
            "strategy=cocod",
            "tau=2",
            f"out_root={out}",
            "run_id=g1",
            "progress_every_s=600",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = out / "gpt_smoke" / "g1"
    record = json.loads((folder / "run.json").read_text())
    assert record["workers"] == 2 and record["method"] == "cocod" and record["rounds"] >= 1
    assert record["steps"] == 2 * 3200 // 32  # 2 epochs of 3,200 blocks, 16 per rank x 2
    with open(folder / "csv" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    final = {k: float(v) for row in rows for k, v in row.items() if k.startswith("test/") and v}
    val = [float(row["val/loss"]) for row in rows if row.get("val/loss")]
    data = MarkovTextDataModule(block_size=32, num_train_blocks=3200, num_val_blocks=128, num_test_blocks=128)
    # Learnt: below what the best context-free guess (the unigram distribution) can reach, never
    # below what the source itself reaches, and the perplexity is the loss's exp.
    assert len(val) == 2 and val[-1] < data.unigram_loss
    # The record's timeline, which cocod-report reads, holds the same validation losses.
    assert record["judged_by"] == "loss" and [p["loss"] for p in record["timeline"]] == pytest.approx(val)
    assert data.optimum - 0.05 < final["test/loss"] < data.unigram_loss
    assert final["test/ppl"] == pytest.approx(2.718281828459045 ** final["test/loss"], rel=1e-4)
    # Next-character accuracy above that of always guessing the most frequent character.
    most_frequent = float(data.source.stationary.reshape(data.vocab_size, -1).sum(axis=1).max())
    assert record["test_acc"] == pytest.approx(final["test/acc"]) and record["test_acc"] > most_frequent
