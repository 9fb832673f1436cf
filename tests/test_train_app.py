"""The app end to end: a CPU multirun of 2 methods x 2 periods, 2 worker processes per job, wandb
offline; then cocod-report on the sweep folder. Plus the app's small pieces."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cocod import report
from lightning_cocod.app.fit import steady_step_seconds
from lightning_cocod.app.identity import git_commit
from lightning_cocod.app.loggers import REDACTED, redact, wandb_mode

SWEEP = ["strategy=cocod,local_sgd", "strategy.tau=2,4"]
# 128 samples, 32 per rank x 2 ranks: 2 optimizer steps; 1 epoch; an 8-wide SmallCNN.
TINY = [
    "data.num_samples=128",
    "data.num_eval_samples=64",
    "max_epochs=1",
    "model.net.width=8",
    "step_time_warmup=1",
    # the heterogeneous path rides along: measured split (applied after the one epoch) and a slowed rank
    "hetero.proportional=true",
    "hetero.slowdown=[1,1.5]",
]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_cpu_multirun_runs_every_job_and_the_report_reads_them(tmp_path):
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "WANDB_SILENT": "true",
        "PYTHONWARNINGS": "ignore",
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_cocod.train",
            "--multirun",
            "experiment=smoke",
            "logger=wandb",
            f"out_root={out}",
            "run_id=t1",
            *TINY,
            *SWEEP,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    sweep = out / "smoke" / "t1"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name.split("_", 1)[0] for p in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        resolved = yaml.safe_load((job / "resolved.yaml").read_text())
        record = json.loads((job / "run.json").read_text())
        assert (job / ".hydra" / "config.yaml").is_file()
        assert list((job / "wandb").glob("offline-run-*")), job  # wandb ran offline, into the job folder
        assert (job / "resolved.yaml").read_text().startswith(f"# git commit {record['git_commit']}")
        assert (
            record["method"]
            == {"CoCoDStrategy": "cocod", "LocalSGDStrategy": "local_sgd"}[
                resolved["strategy"]["_target_"].rpartition(".")[2]
            ]
        )
        assert record["tau"] == resolved["strategy"]["tau"] and record["workers"] == 2
        assert record["global_batch_size"] == 64 and record["steps"] == 2
        assert 0 <= record["test_acc"] <= 1 and record["steady_step_seconds"] > 0
        assert record["dir"] == str(job) and record["id"] == f"smoke/t1/{job.name}"
        assert (job / "workers" / "rank1.stderr").is_file()
        seen.add((record["method"], record["tau"]))
    assert seen == {("cocod", 2), ("cocod", 4), ("local_sgd", 2), ("local_sgd", 4)}
    ledger = json.loads((out / "groups" / "smoke.json").read_text())
    assert sorted(ledger) == sorted(f"smoke/t1/{job.name}" for job in jobs)

    assert report.main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "smoke.md").read_text()
    for row in (
        "| CoCoD-SGD | 2 | 2 | 0 |",
        "| CoCoD-SGD | 4 | 2 | 0 |",
        "| Local-SGD | 2 | 2 | 0 |",
        "| Local-SGD | 4 | 2 | 0 |",
    ):
        assert row in table, table
    assert "No S-SGD run in this group" in table
    png = (tmp_path / "report" / "smoke_accuracy_vs_time.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def run_app(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "lightning_cocod.train", "experiment=smoke", "logger=none",
         f"out_root={tmp_path / 'out'}", *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200, check=False, stdin=subprocess.DEVNULL,
    )


@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_a_run_checkpoints_by_default_and_continues_from_its_last_checkpoint(tmp_path):
    tiny = [o for o in TINY if not o.startswith(("hetero.", "max_epochs"))]
    first = run_app(tmp_path, "run_id=r1", "max_epochs=1", *tiny)
    assert first.returncode == 0, first.stderr[-3000:]
    last = tmp_path / "out" / "smoke" / "r1" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 2  # the one epoch of this run

    second = run_app(tmp_path, "run_id=r1", "max_epochs=2", "checkpoint.resume=last", *tiny)
    assert second.returncode == 0, second.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "smoke" / "r1" / "run.json").read_text())
    # Continued, not restarted: only the second epoch was trained (and validated) this time.
    assert record["steps"] == 4 and [p["epoch"] for p in record["timeline"]] == [1]
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4


def test_wandb_mode_follows_env_key_and_pytest(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password k\n")
    nothing = {"NETRC": str(tmp_path / "missing")}
    assert wandb_mode(nothing) == "offline"
    assert wandb_mode({**nothing, "WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"NETRC": str(netrc)}) == "online"
    assert wandb_mode({"NETRC": str(netrc), "WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode({**nothing, "PYTEST_CURRENT_TEST": "x", "WANDB_API_KEY": "k"}) == "disabled"
    assert wandb_mode({**nothing, "PYTEST_CURRENT_TEST": "x", "WANDB_MODE": "offline"}) == "offline"


def test_the_api_key_never_reaches_a_logged_config():
    config = {"logger": {"key": "abc123", "tags": ["x", "token=abc123"]}, "seed": 0}
    assert redact(config, "abc123") == {"logger": {"key": REDACTED, "tags": ["x", REDACTED]}, "seed": 0}
    assert redact(config, "") == config


def test_git_commit_is_unknown_outside_a_checkout(tmp_path):
    assert git_commit(tmp_path) == ("unknown", False)
    commit, _ = git_commit(Path(__file__).parent)
    assert commit == "unknown" or len(commit) == 40


def test_steady_step_time_over_whole_rounds_and_short_runs():
    ends = [0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 10.0, 14.0]  # rounds of 4 steps, a 3 s wait at each end
    assert steady_step_seconds(ends, warmup=1, period=4) == pytest.approx((14.0 - 0.0) / 8)
    assert steady_step_seconds(ends[:4], warmup=20, period=4) == pytest.approx(1.0)  # too short for a round
    assert steady_step_seconds([5.0], warmup=1, period=1) is None
