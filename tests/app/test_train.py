"""The app end to end: CPU sweeps of S-SGD against CoCoD-SGD at two periods and two links into
one group, 2 worker processes per job; checkpoints and resume; then cocod-report on the runs.
Plus the app's small pieces."""

import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from lightning_cocod.app import report
from lightning_cocod.app.fit import REDACTED, log_final, redact, steady_step_seconds, wandb_mode
from lightning_cocod.app.identity import code_of, git_commit
from lightning_cocod.launch.netns import shaped_namespace

# 128 samples, 32 per rank x 2 ranks: 2 optimizer steps per epoch; an 8-wide SmallCNN.
TINY = [
    "data=synthetic",
    "data.num_samples=128",
    "data.num_eval_samples=64",
    "max_epochs=2",
    "model.net.width=8",
    "step_time_warmup=1",
]


def run_app(tmp_path: Path, *overrides: str, timeout: int = 280) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "lightning_cocod.app.train", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def can_shape() -> bool:
    with shaped_namespace("100mbit", name_prefix="cocod-probe") as link:
        return link.shaped


def final_metrics(job: Path) -> dict[str, float]:
    with open(job / "csv" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {k: float(v) for row in rows for k, v in row.items() if k.startswith("final/") and v}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_sweep_at_two_links_gives_each_run_the_speedup_over_its_own_links_ssgd(tmp_path):
    out = tmp_path / "out"
    # No progress line is due within a job (as on a machine fast enough to finish one first):
    # nothing here may depend on how long a job lasts.
    common = ["--multirun", "experiment=smoke", f"out_root={out}", *TINY, "progress_every_s=600"]
    # S-SGD listed last and swept over tau: it runs first, and once.
    first = run_app(tmp_path, *common, "run_id=fast", "strategy=cocod,ssgd", "tau=2,4")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    console = first.stdout + first.stderr
    shaped = can_shape()  # root with ip and tc; the second link needs them
    if shaped:
        second = run_app(
            tmp_path, *common, "run_id=slow", "launcher.rate=100mbit", "strategy=ssgd,cocod", "tau=2"
        )
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        console += second.stdout + second.stderr

    jobs = sorted(p for sweep in ("fast", "slow") for p in (out / "smoke" / sweep).glob("*_*") if p.is_dir())
    records = {job: json.loads((job / "run.json").read_text()) for job in jobs if (job / "run.json").exists()}
    # Job 1 of the first sweep (S-SGD at tau=4) is job 0 again: it does not run, and leaves no folder.
    assert set(records) == set(jobs)
    assert not [job for job in jobs if job.parent.name == "fast" and job.name.startswith("1_")]
    assert re.search(r"job 1 \(.*\) skipped: it is job 0 again", console)
    fast = {(r["method"], r["tau"]): r for job, r in records.items() if job.parent.name == "fast"}
    assert set(fast) == {("ssgd", None), ("cocod", 2), ("cocod", 4)}
    assert fast[("ssgd", None)]["finished_at"] < min(
        fast[("cocod", 2)]["finished_at"], fast[("cocod", 4)]["finished_at"]
    )
    links = {"fast": "unshaped", "slow": "100mbit"}
    by_sweep = {
        sweep: {(r["method"], r["tau"]): r for j, r in records.items() if j.parent.name == sweep}
        for sweep in links
    }
    if shaped:
        assert set(by_sweep["slow"]) == {("ssgd", None), ("cocod", 2)}
        assert (
            by_sweep["fast"][("ssgd", None)]["condition_id"]
            != by_sweep["slow"][("ssgd", None)]["condition_id"]
        )

    report.main([str(out), "--out", str(tmp_path / "report")])
    table = (tmp_path / "report" / "smoke.md").read_text()
    for sweep, runs in by_sweep.items():
        ssgd = runs.get(("ssgd", None))
        for (method, tau), record in runs.items():
            job = Path(record["dir"])
            assert (
                record["link"] == links[sweep] and record["global_batch_size"] == 64 and record["steps"] == 4
            )
            # The figure worked out here from the two runs' own step times, then found everywhere.
            expected = ssgd["steady_step_seconds"] / record["steady_step_seconds"]
            assert record["speedup_vs_ssgd"] == pytest.approx(expected, rel=1e-12)
            assert record["speedup_baseline"] == ssgd["id"]
            assert f"{record['name']}: test acc" in console and f"speedup vs S-SGD {expected:.3f}x" in console
            assert final_metrics(job)["final/speedup_vs_ssgd"] == pytest.approx(expected, rel=1e-9)
            label = {"ssgd": "S-SGD", "cocod": "CoCoD-SGD"}[method]
            row = f"| {label} | {'–' if tau is None else tau} | 2 | {links[sweep]} | 0 |"
            assert any(
                line.startswith(row) and f"| {expected:.3f} |" in line for line in table.splitlines()
            ), table
            resolved = yaml.safe_load("\n".join((job / "resolved.yaml").read_text().splitlines()[1:]))
            assert resolved["strategy"]["_target_"].endswith(
                {"ssgd": "SSGDStrategy", "cocod": "CoCoDStrategy"}[method]
            )
            assert (job / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "report" / "smoke_speedup_vs_tau.png").read_bytes().startswith(b"\x89PNG")

    # The sweep again, as a requeued SLURM job runs it: with auto-resume the finished jobs are left
    # as they are, records and all, and nothing trains.
    before = {job: (job / "run.json").read_bytes() for job in records}
    again = run_app(
        tmp_path, *common, "run_id=fast", "strategy=cocod,ssgd", "tau=2,4", "checkpoint.resume=auto"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(re.findall(r": finished already \(", again.stdout + again.stderr)) == 3
    assert {job: (job / "run.json").read_bytes() for job in records} == before
    if not shaped:  # said, not passed over in silence: half of what this test is for did not run
        pytest.skip("the second link (100mbit) needs root with ip and tc; only the unshaped half ran")


def _pid_of_rank(rank: int, job_dir: Path) -> int:
    """The worker process of ``rank`` in ``job_dir``, found by the result path its launcher gave it."""
    wanted = f"COCOD_RESULT_PATH={job_dir / 'workers' / f'rank{rank}.result.json'}".encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and wanted in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process for rank {rank} of {job_dir}")


def _signal_rank_one(
    tmp_path: Path, folder: Path, progress_seen: str, sig: int, *args: str, app_itself=False
):
    """Runs cocod-train with ``args``; once its progress matches ``progress_seen``, sends ``sig``
    to rank 1 alone (or, ``app_itself``, to the app, as a terminal's Ctrl-C does). Returns the
    app's exit code, stdout and stderr."""
    app = subprocess.Popen(
        [sys.executable, "-m", "lightning_cocod.app.train", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        # As a terminal starts it: a suite run in the background inherits SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 (no threads yet)
    )
    try:
        progress = folder / "workers" / "progress.txt"
        while not (progress.exists() and re.search(progress_seen, progress.read_text())):
            assert app.poll() is None, "the run ended before it got going"  # (a hang: the test's timeout)
            time.sleep(0.2)
        os.kill(app.pid if app_itself else _pid_of_rank(1, folder), sig)
        out, err = app.communicate(timeout=120)
    finally:
        app.kill()
    return app.returncode, out, err


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_a_preempted_run_resumes_with_the_one_command_it_prints(tmp_path):
    # 4096 samples, 32 per rank x 2: 64 steps per epoch; nothing saved on a schedule before step 64.
    common = [
        "experiment=smoke",
        "data=synthetic",
        "logger=none",
        f"out_root={tmp_path / 'out'}",
        "run_id=r1",
    ]
    common += ["data.num_samples=4096", "data.num_eval_samples=64", "model.net.width=8", "step_time_warmup=1"]
    folder = tmp_path / "out" / "smoke" / "r1"
    code, console, _ = _signal_rank_one(
        tmp_path,
        folder,
        r"step ([3-9]|\d\d+)/",
        signal.SIGTERM,
        *common,
        "max_epochs=50",
        "progress_every_s=0.5",
    )  # one rank only: every rank must stop with it
    assert code == 75, console[-3000:]
    last = folder / "checkpoints" / "last.ckpt"
    line = next(x for x in console.splitlines() if " preempted; " in x)
    assert line.startswith(f"cocod-tauauto-w2-s0: preempted; checkpoint {last}; resume with: cocod-train ")
    saved = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert saved >= 3  # how far past step 3 depends on the machine's speed, not on the code
    epochs = saved // 64 + 1  # up to the end of the epoch it stopped in

    # The printed command, run to the end of that epoch instead of 50, as a requeued job runs it
    # (checkpoint.resume=auto: the unfinished run goes on from its checkpoint; resume=last is
    # what the worker killed below resumes with).
    command = shlex.split(line.partition("resume with: ")[2])
    assert command[-2:] == ["run_id=r1", "checkpoint.resume=last"] and "max_epochs=50" in command
    overrides = [a for a in command[1:-1] if not a.startswith("max_epochs=")]
    resumed = run_app(tmp_path, *overrides, f"max_epochs={epochs}", "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"cocod-tauauto-w2-s0: resumed from {last} at step {saved}" in resumed.stdout + resumed.stderr
    record = json.loads((folder / "run.json").read_text())
    # Continued where it stopped: the steps it had left, into the file it resumed from.
    assert record["steps"] == 64 * epochs and record["steps_trained"] == 64 * epochs - saved
    assert record["resumed_from"] == str(last) and [p["epoch"] for p in record["timeline"]] == [epochs - 1]
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 64 * epochs
    assert not list((folder / "checkpoints").glob("last-v*.ckpt"))

    # A resume that fails its checks leaves the finished run's records as they were.
    finished = {name: (folder / name).read_bytes() for name in ("run.json", "resolved.yaml")}
    refused = run_app(tmp_path, *common, "checkpoint.resume=last", "trainer.max_epochs=abc")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "cocod-train: error: trainer.max_epochs='abc' is invalid; accepted: an integer or null"
    ]
    assert {name: (folder / name).read_bytes() for name in finished} == finished
    # Requeued as a scheduler would (resume=auto), the finished run is left as it is.
    again = run_app(tmp_path, *common, f"max_epochs={epochs}", "checkpoint.resume=auto")
    assert again.returncode == 0 and "finished already" in again.stdout + again.stderr, again.stderr[-3000:]
    assert {name: (folder / name).read_bytes() for name in finished} == finished
    # Our checkpoints are asked for whole: Lightning has nothing to log about them at every save.
    assert "weights_only" not in (folder / "workers" / "rank1.stderr").read_text()

    # A worker killed outright (no signal handler runs): one line naming it, and how to resume.
    code, _, errors = _signal_rank_one(
        tmp_path,
        folder,
        r"step (6[89]|[7-9]\d|\d{3,})/",
        signal.SIGKILL,
        *common,
        "max_epochs=50",
        "checkpoint.resume=last",
    )
    assert code == 1, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (
        f"cocod-train: error: cocod-tauauto-w2-s0: rank 1 was killed by SIGKILL; logs in {folder / 'workers'}; "
        f"checkpoint {last}; resume with: cocod-train "
        f"{shlex.join(a for a in common if a != 'run_id=r1')} max_epochs=50 run_id=r1 checkpoint.resume=last"
    )
    assert "Traceback" not in errors


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_ctrl_c_to_the_app_says_so_and_prints_the_command_that_resumes(tmp_path):
    common = [
        "experiment=smoke",
        "data=synthetic",
        "logger=none",
        f"out_root={tmp_path / 'out'}",
        "run_id=c1",
    ]
    common += ["max_epochs=50"]
    common += [
        "data.num_samples=4096",
        "data.num_eval_samples=64",
        "model.net.width=8",
        "progress_every_s=0.5",
    ]
    folder = tmp_path / "out" / "smoke" / "c1"
    code, console, errors = _signal_rank_one(
        tmp_path, folder, r"step ([3-9]|\d\d+)/", signal.SIGINT, *common, app_itself=True
    )
    assert code == 130, errors[-3000:]
    last = folder / "checkpoints" / "last.ckpt"
    assert (
        f"cocod-tauauto-w2-s0: interrupted (Ctrl-C); checkpoint {last}; resume with: cocod-train " in console
    )
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] >= 3  # the workers saved
    assert "Traceback" not in errors


def test_the_final_figures_reach_wandb_as_the_record_has_them():
    class WandbLogger:  # what log_final uses of Lightning's WandbLogger
        def __init__(self):
            self.metrics, self.finished = [], False
            self.experiment = SimpleNamespace(summary={}, finish=lambda: setattr(self, "finished", True))

        def log_metrics(self, metrics, step):
            self.metrics.append((step, metrics))

    logger = WandbLogger()
    record = {
        "test_acc": 0.5,
        "steady_step_seconds": 0.25,
        "speedup_vs_ssgd": 2.0 / 0.7,
        "finished_at": 123.0,
        "speedup_baseline": "g/ssgd",
        "timeline": [{"seconds": 1.0, "step": 2, "accuracy": 0.4}],
    }
    log_final(logger, record, step=7)
    summary = logger.experiment.summary
    assert summary["final/speedup_vs_ssgd"] == 2.0 / 0.7 and summary["final/steady_step_seconds"] == 0.25
    assert summary["final/speedup_baseline"] == "g/ssgd" and summary["final/timeline"] == [[1.0, 0.4]]
    finals = {"final/test_acc": 0.5, "final/steady_step_seconds": 0.25, "final/speedup_vs_ssgd": 2.0 / 0.7}
    assert logger.metrics == [(7, {**finals, "final/finished_at": 123.0})]
    assert logger.finished  # a torchrun multirun fits the next job in the same process
    assert "final/loss_timeline" not in summary  # a classifier's record has no loss timeline
    # A language model's record: its loss timeline too, which its time to target reads.
    logger = WandbLogger()
    log_final(
        logger, {**record, "timeline": [{"seconds": 1.0, "step": 2, "accuracy": 0.4, "loss": 1.5}]}, step=7
    )
    assert logger.experiment.summary["final/loss_timeline"] == [[1.0, 1.5]]


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
    # This repository: its HEAD as git itself says, when the tests run from a checkout (CI's clone).
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True
    )
    lines = head.stdout.split()
    in_checkout = head.returncode == 0 and Path(lines[0]).resolve() == root
    assert git_commit(root)[0] == (lines[1] if in_checkout else "unknown")


def test_an_install_inside_someone_elses_repository_names_no_commit(tmp_path):
    # A virtualenv inside the user's project: site-packages is not the root of that checkout.
    site_packages = tmp_path / ".venv" / "lib" / "site-packages"
    site_packages.mkdir(parents=True)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=u", "-c", "user.email=u@x"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "theirs"], check=True)
    theirs = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    assert git_commit(site_packages) == ("unknown", False)
    assert git_commit(tmp_path) == (theirs.stdout.strip(), False)


def test_the_code_a_run_ran_is_named_by_version_and_commit_when_known():
    assert code_of({"version": "1.2.3", "git_commit": "unknown"}) == "lightning_cocod 1.2.3"
    assert code_of({"version": "1.2.3", "git_commit": "abc", "git_dirty": True}) == (
        "lightning_cocod 1.2.3 (git abc+dirty)"
    )
    assert code_of({"git_commit": "abc"}) == "git abc"  # recorded before versions were kept
    assert code_of({}) == "unknown"


def test_steady_step_time_over_whole_rounds_and_short_runs():
    ends = [0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 10.0, 14.0]  # rounds of 4 steps, a 3 s wait at each end
    assert steady_step_seconds(ends, warmup=1, period=4) == pytest.approx((14.0 - 0.0) / 8)
    assert steady_step_seconds(ends[:4], warmup=20, period=4) == pytest.approx(1.0)  # too short for a round
    assert steady_step_seconds([5.0], warmup=1, period=1) is None


USER_MODULE = """
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class MyModule(pl.LightningModule):  # no **kwargs: the config may pass it nothing it does not name
    def __init__(self, hidden: int = 8):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.Linear(hidden, 10))

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def _eval(self, stage, batch):
        x, y = batch
        self.log(f"{stage}/acc", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def validation_step(self, batch, _):
        self._eval("val", batch)

    def test_step(self, batch, _):
        self._eval("test", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class MyData(pl.LightningDataModule):  # takes none of the data group's keys: its batch is its own
    def __init__(self):
        super().__init__()
        self.batch_size = 32  # data=digits's data.batch_size, which the record reads
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(256, 1, 8, 8, generator=g), torch.randint(0, 10, (256,), generator=g)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

    val_dataloader = test_dataloader = train_dataloader
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_model_and_a_datamodule_of_the_users_own_in_the_current_folder(tmp_path):
    (tmp_path / "mymod.py").write_text(USER_MODULE)
    # Started as the console script is: no current folder on sys.path (python -P).
    common = [
        "-P",
        "-m",
        "lightning_cocod.app.train",
        "data=digits",
        "logger=none",
        f"out_root={tmp_path / 'out'}",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    mine = ["data._target_=mymod.MyData", "~model", "+model._target_=mymod.MyModule", "+model.hidden=16"]
    done = subprocess.run(
        [sys.executable, *common, *mine, "max_epochs=1", "run_id=u", "step_time_warmup=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "default" / "u" / "run.json").read_text())
    assert 0 <= record["test_acc"] <= 1 and record["steps"] == 4  # 256 samples, 32 per rank x 2
    # Only the target replaced: the package's model keys would go to a module that takes none of them.
    refused = subprocess.run(
        [sys.executable, *common, "model._target_=mymod.MyModule"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "cocod-train: error: unknown key 'model.base_batch_size'; MyModule accepts: hidden; a module of your own: "
        "~model +model._target_=mymod.MyModule"
    ], refused.stderr[-3000:]
