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

REPO = Path(__file__).resolve().parents[1]


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
