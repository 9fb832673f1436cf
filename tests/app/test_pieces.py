"""Small pieces of the app: data module checks, the run condition, the console
lines, the README's first example and the suite's temp folder."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_cocod.app.identity import condition, condition_id
from lightning_cocod.app.train import (
    _preempted_line,
    _resume_hint,
    _stopped_line,
    _worker_failure,
    final_line,
)
from lightning_cocod.data import CIFARDataModule, DigitsDataModule, SyntheticDataModule

REPO = Path(__file__).resolve().parents[2]


def test_datamodules_know_their_training_set_size_without_loading_it():
    digits = DigitsDataModule(batch_size=8)
    assert digits.num_train_samples == 1797 - 360  # scikit-learn's 1,797 digits less the test split
    digits.setup()
    assert digits.num_train_samples == len(digits.train_tensors[0])
    synthetic = SyntheticDataModule(num_samples=37, num_eval_samples=5, image_shape=(3, 4, 4))
    assert synthetic.num_train_samples == 37
    synthetic.setup()
    assert len(synthetic.train_tensors[0]) == 37
    # CIFAR-10 and CIFAR-100 both have 50,000 training images (and 10,000 test images).
    assert CIFARDataModule(root="/nowhere", dataset="cifar10").num_train_samples == 50_000
    assert CIFARDataModule(root="/nowhere", dataset="cifar100").num_train_samples == 50_000


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: SyntheticDataModule(num_samples=0),
            "SyntheticDataModule: num_samples=0 is invalid; accepted: an integer >= 1",
        ),
        (lambda: SyntheticDataModule(num_eval_samples=-3), "num_eval_samples=-3 is invalid"),
        (lambda: SyntheticDataModule(num_samples=2.5), "num_samples=2.5 is invalid"),
        (lambda: SyntheticDataModule(num_classes=True), "num_classes=True is invalid"),
        (
            lambda: SyntheticDataModule(image_shape=(3, 0, 32)),
            "image_shape=(3, 0, 32) is invalid; accepted: positive integers",
        ),
        (lambda: SyntheticDataModule(image_shape="3x32x32"), "image_shape='3x32x32' is invalid"),
        (
            lambda: CIFARDataModule(dataset="cifar1000"),
            "dataset='cifar1000' is invalid; accepted: 'cifar10', 'cifar100'",
        ),
    ],
)
def test_datamodules_refuse_bad_arguments_in_one_line(build, message):
    with pytest.raises(ValueError) as info:
        build()
    assert message in str(info.value) and "\n" not in str(info.value)


BASE = {
    "strategy": {"_target_": "lightning_cocod.CoCoDStrategy", "tau": 4},
    "tau": 4,
    "seed": 0,
    "name": "smoke",
    "group": "smoke",
    "run_id": "r1",
    "out_root": "outputs",
    "checkpoint": {"every_n_epochs": 1},
    "logger": {},
    "target_accuracy": None,
    "progress_every_s": 5,
    "model": {"lr": 0.05},
    "data": {"batch_size": 32, "root": "data", "seed": 0},
    "launcher": {"name": "cpu", "devices": 2, "rate": "100mbit", "run_id": "r1", "timeout_s": 60},
    "hetero": {"proportional": False, "slowdown": None},
    "trainer": {"precision": "32-true", "enable_progress_bar": False},
}
FACTS = {"link": "100mbit", "threads": 1, "device": "cpu x2", "precision": "32-true"}


def _with(config, path, value):
    changed = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    *parents, key = path.split(".")
    node = changed
    for part in parents:
        node = node[part]
    node[key] = value
    return changed


def test_the_condition_ignores_the_method_and_names_but_not_what_sets_the_speed():
    same = condition_id(condition(BASE, FACTS))
    for path, value in [
        ("strategy", {"_target_": "lightning_cocod.SSGDStrategy"}),
        ("tau", 8),
        ("seed", 3),
        ("run_id", "r2"),
        ("out_root", "elsewhere"),
        ("data.root", "/data"),
        ("data.seed", 3),
        ("launcher.run_id", "x"),
        ("hetero.proportional", True),
        ("checkpoint.every_n_epochs", 0),
        ("progress_every_s", 0),
    ]:
        assert condition_id(condition(_with(BASE, path, value), FACTS)) == same, path
    for path, value in [
        ("data.batch_size", 64),
        ("model.lr", 0.1),
        ("launcher.devices", 4),
        ("hetero.slowdown", [1, 2]),
        ("trainer.precision", "bf16-mixed"),
    ]:
        assert condition_id(condition(_with(BASE, path, value), FACTS)) != same, path
    for fact, value in [("link", "unshaped"), ("threads", 2), ("device", "gpu"), ("precision", "16-mixed")]:
        assert condition_id(condition(BASE, {**FACTS, fact: value})) != same, fact
    assert BASE["launcher"]["rate"] == "100mbit"  # the input is left as it was


def test_console_lines_say_the_speedup_and_where_it_comes_from(tmp_path):
    record = {
        "name": "cocod-tau4-w2-s0",
        "group": "g",
        "seed": 0,
        "link": "100mbit",
        "test_acc": 0.91234,
        "steady_step_seconds": 0.123456,
        "speedup_vs_ssgd": 2.0 / 0.7,
        "speedup_baseline": "g/s1/0_strategy=ssgd",
    }
    assert final_line(record) == (
        "cocod-tau4-w2-s0: test acc 0.9123, steady step 0.1235 s, speedup vs S-SGD 2.857x "
        "(over g/s1/0_strategy=ssgd, link 100mbit)"
    )
    unknown = final_line({**record, "speedup_vs_ssgd": None, "speedup_baseline": None})
    assert unknown.endswith(
        "speedup vs S-SGD unknown (no S-SGD run in group g with this condition (link 100mbit) and seed 0 yet)"
    )
    hydra_cfg = SimpleNamespace(
        overrides=SimpleNamespace(task=["experiment=smoke", "run_id=r1", "tau=8"]),
        runtime=SimpleNamespace(choices={}),
    )
    job = tmp_path / "out" / "smoke" / "r1"
    assert _preempted_line("x", RuntimeError("stop"), _resume_hint(job, hydra_cfg, False)).startswith(
        "x: preempted (stop); no checkpoint"
    )
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert _preempted_line("x", RuntimeError("stop"), _resume_hint(job, hydra_cfg, False)) == (
        f"x: preempted; checkpoint {job}/checkpoints/last.ckpt; resume with: "
        "cocod-train experiment=smoke tau=8 run_id=r1 checkpoint.resume=last"
    )
    sweep_job = job / "3_tau=8"
    (sweep_job / "checkpoints").mkdir(parents=True)
    (sweep_job / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert _preempted_line("x", RuntimeError("stop"), _resume_hint(sweep_job, hydra_cfg, True)).endswith(
        f"resume with: cocod-train experiment=smoke tau=8 hydra.run.dir={sweep_job} checkpoint.resume=last"
    )
    # Under torchrun the ranks are started by torchrun again: the line gives the overrides.
    hydra_cfg.runtime = SimpleNamespace(choices={"launcher": "torchrun"})
    assert _preempted_line("x", RuntimeError("stop"), _resume_hint(job, hydra_cfg, False)).endswith(
        "launch it again as before (torchrun / sbatch), with the overrides: "
        "experiment=smoke tau=8 run_id=r1 checkpoint.resume=last"
    )


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_the_first_example_trains_two_workers_to_well_above_chance(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "first_example.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    accuracy = float(proc.stdout.strip().splitlines()[-1].removeprefix("validation accuracy "))
    assert accuracy >= 0.8  # 10 classes: chance is 0.1


@pytest.mark.timeout(120)
def test_the_suite_leaves_nothing_in_the_temp_folder(tmp_path):
    # A session under this suite's conftest whose test leaves what torch's spawn leaves for every
    # process it starts (a pytorch-errorfile-*.pickle) and uses pytest's own tmp_path.
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (suite / "test_leftovers.py").write_text(
        textwrap.dedent("""
        import tempfile

        def test_leaves_files(tmp_path):
            (tmp_path / "x").write_text("x")
            tempfile.NamedTemporaryFile(prefix="pytorch-errorfile-", suffix=".pickle", delete=False).close()
    """)
    )
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert list(temp.iterdir()) == []


def test_a_lost_worker_is_one_line_naming_the_rank_and_what_it_said():
    from lightning_cocod import NonFiniteError, WorkerLostError
    from lightning_cocod.launch import WorkerFailed, WorkersTimedOut

    tail = "Traceback (most recent call last):\n  File x\nValueError: bad batch\n"
    raised = WorkerFailed(
        f"rank 0 exited with code 1; logs in /r/workers\n--- rank 0 ---\n{tail}", 0, 1, tail, "/r/workers"
    )
    assert _worker_failure(raised) == "rank 0 exited with code 1: ValueError: bad batch; logs in /r/workers"
    killed = WorkerFailed(
        "rank 1 was killed by SIGKILL; logs in /r/workers\n--- rank 1 ---\nnoise",
        1,
        -9,
        "noise",
        "/r/workers",
    )
    assert _worker_failure(killed) == "rank 1 was killed by SIGKILL; logs in /r/workers"
    assert _worker_failure(WorkersTimedOut("workers did not finish within 5 s\nmore", [1], "/r")) == (
        "workers did not finish within 5 s"
    )
    assert (
        _worker_failure(WorkerLostError("peer gone at step 7\ndetail"))
        == "WorkerLostError: peer gone at step 7"
    )
    assert _worker_failure(NonFiniteError("NaN in the model")) == "NonFiniteError: NaN in the model"
    assert _worker_failure(KeyError("ours")) is None  # our own bug keeps its traceback


def test_a_second_csv_logger_in_a_run_folder_keeps_the_first_ones_metrics(tmp_path):
    from omegaconf import OmegaConf

    from lightning_cocod.app.fit import build_logger

    node = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "logger" / "csv.yaml")
    for value in (1.0, 2.0, 3.0):  # a run, then two resumes of it
        logger = build_logger(node, tmp_path, {})
        logger.log_metrics({"loss": value}, step=0)
        logger.save()
    files = sorted(tmp_path.rglob("metrics.csv"))
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "csv/metrics.csv",
        "csv/v1/metrics.csv",
        "csv/v2/metrics.csv",
    ]
    assert [f.read_text().splitlines()[1] for f in files] == ["1.0,0", "2.0,0", "3.0,0"]


def test_a_run_stopped_by_a_signal_before_its_workers_could_stop_together_says_so(tmp_path):
    from lightning_cocod.launch.netns import Terminated

    hydra_cfg = SimpleNamespace(
        overrides=SimpleNamespace(task=["experiment=smoke", "run_id=r1"]), runtime=SimpleNamespace(choices={})
    )
    job = tmp_path / "out" / "smoke" / "r1"
    assert _stopped_line("x", Terminated(143), _resume_hint(job, hydra_cfg, False)) == (
        "cocod-train: x: stopped by SIGTERM before its workers could stop together; no checkpoint was "
        "written, so it cannot be resumed"
    )
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert _stopped_line("x", Terminated(129), _resume_hint(job, hydra_cfg, False)) == (
        f"cocod-train: x: stopped by SIGHUP before its workers could stop together; checkpoint "
        f"{job}/checkpoints/last.ckpt; resume with: cocod-train experiment=smoke run_id=r1 checkpoint.resume=last"
    )
