"""Every config in conf/ composes and instantiates; recipes compose; bad command lines fail in one line."""

import os
import shlex
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from pytorch_lightning.strategies import Strategy

from lightning_cocod.app.checks import ConfigError, check_values
from lightning_cocod.app.identity import world_size
from lightning_cocod.app.objects import check_objects
from lightning_cocod.app.preflight import config_dir, job_overrides, preflight

CONF = config_dir()
REPO = CONF.parent
GROUPS = ("strategy", "model", "data", "launcher", "logger", "experiment")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for key in (
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NNODES",
        "COCOD_DATA",
    ):
        monkeypatch.delenv(key, raising=False)
    # The CIFAR check only looks for the folders; empty ones stand in for the data here.
    for folder in ("cifar-10-batches-py", "cifar-100-python"):
        (tmp_path / "data" / folder).mkdir(parents=True)
    monkeypatch.setenv("COCOD_DATA", str(tmp_path / "data"))
    # launcher=gpu checks the GPUs this machine shows; the configs are what is tested here.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 16)


def compose_all(overrides: list[str], multirun: bool = False):
    with initialize_config_dir(str(CONF), version_base="1.3", job_name="train"):
        return [compose("train", job) for job in job_overrides(overrides, multirun)]


def test_groups_have_the_options_the_layout_promises():
    assert set(options("strategy")) == {"cocod", "local_sgd", "pipe_sgd", "ssgd"}
    assert set(options("model")) == {"resnet18", "vgg16", "small_cnn"}
    assert set(options("data")) == {"cifar10", "cifar100", "digits", "synthetic"}
    assert set(options("launcher")) == {"cpu", "gpu", "torchrun", "slurm"}
    assert set(options("logger")) == {"wandb", "csv", "none"}
    assert {"resnet18_cifar10", "vgg16_cifar100", "smoke", "digits_cocod"} <= set(options("experiment"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_passes_the_checks(group):
    for option in options(group):
        extra = ["run_id=r1"] if option in ("torchrun", "slurm") else []
        (cfg,) = compose_all([f"{group}={option}", *extra])
        check_values(cfg)
        check_objects(cfg)


def test_every_target_instantiates(tmp_path):
    for option in options("strategy"):
        (cfg,) = compose_all([f"strategy={option}"])
        assert isinstance(instantiate(cfg.strategy), Strategy)
    for option in options("model"):
        (cfg,) = compose_all([f"model={option}", "data=digits" if option == "small_cnn" else "data=cifar10"])
        module = instantiate(cfg.model)
        assert module.num_classes == cfg.dataset.num_classes
    for option in options("data"):
        (cfg,) = compose_all([f"data={option}"])
        assert instantiate(cfg.data).batch_size == cfg.data.batch_size
    for option in ("csv", "wandb"):
        (cfg,) = compose_all([f"logger={option}"])
        assert instantiate(cfg.logger, save_dir=str(tmp_path)) is not None


@pytest.mark.parametrize("experiment", options("experiment"))
@pytest.mark.parametrize("launcher", ["cpu", "gpu", "torchrun", "slurm"])
def test_every_experiment_composes_with_every_launcher(experiment, launcher):
    (cfg,) = compose_all([f"experiment={experiment}", f"launcher={launcher}", "run_id=r1"])
    check_values(cfg)
    assert cfg.name == experiment and cfg.group == experiment


RECIPE_MODES = {
    "resnet18_cifar10.sh": ["node8", "torchrun", "slurm"],
    "vgg16_cifar100.sh": ["node8", "torchrun", "slurm"],
    "smoke.sh": [""],
}


def app_arguments(line: str) -> list[str] | None:
    """The app's own arguments in one printed recipe command, None for other commands."""
    words = shlex.split(line)
    for marker, extra in (
        ("cocod-train", []),
        ("lightning_cocod.train", []),
        ("slurm.sbatch", ["launcher=slurm"]),
    ):
        if any(w.endswith(marker) for w in words):
            index = next(i for i, w in enumerate(words) if w.endswith(marker))
            return [*extra, *words[index + 1 :]]
    return None


@pytest.mark.parametrize("hetero", ["0", "1"])
@pytest.mark.parametrize("recipe", sorted(RECIPE_MODES))
def test_recipe_commands_compose(recipe, hetero, monkeypatch):
    # What torchrun/srun would set for 16 workers as 2 nodes x 8.
    env = {
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_WORLD_SIZE": "2",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    commands = 0
    for mode in RECIPE_MODES[recipe]:
        printed = subprocess.run(
            ["bash", str(REPO / "recipes" / recipe), *filter(None, [mode])],
            capture_output=True,
            text=True,
            env={
                **os.environ, "DRY_RUN": "1", "HEAD": "node01", "RUN_ID": "t", "NNODES": "2", "NPROC": "8",
                "HETERO": hetero,
            },
            check=True,
            timeout=30,
        ).stdout
        for line in printed.splitlines():
            args = app_arguments(line)
            if args is None:
                continue
            commands += 1
            multirun = "--multirun" in args
            jobs = job_overrides([a for a in args if a != "--multirun"], multirun)
            assert len(jobs) > 1 if multirun else len(jobs) == 1
            # Seeds change no key: one job per distinct rest keeps the test short (compose ~0.1 s).
            distinct = {tuple(o for o in job if not o.startswith("seed=")): job for job in jobs}
            configs = [compose_all(job)[0] for job in distinct.values()]
            for cfg in configs:
                check_values(cfg)
                if mode in ("torchrun", "slurm", "node16"):
                    assert world_size(cfg) == 16
            check_objects(configs[0])
    assert commands >= len(RECIPE_MODES[recipe])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["strategy=foo"], "strategy=foo is not an option; accepted: cocod, local_sgd, pipe_sgd, ssgd"),
        (["experiment=nope"], "experiment=nope is not an option"),
        (["trainer.foo=1"], "unknown key 'trainer.foo'; trainer accepts: benchmark"),
        (["+trainer.foo=1"], "unknown key 'trainer.foo'; Trainer accepts: accumulate_grad_batches"),
        (["+model.net.depth=3"], "unknown key 'model.net.depth'; ResNet18 accepts: in_channels, num_classes"),
        (["strategy.tau=0"], "strategy.tau=0 is invalid; accepted: a positive integer"),
        (["data.batch_size=0"], "data.batch_size=0 is invalid"),
        (["model.lr=-1"], "model: ClassifierModule: lr=-1 is invalid; accepted: a positive float"),
        (["launcher=torchrun"], "run_id='none' is invalid"),
        (["launcher.num_nodes=2"], "launcher.num_nodes=2 is invalid; accepted: 1 with launcher=cpu"),
        (["launcher.rate=fast"], "launcher.rate='fast' is invalid"),
        (["data.root=/nonexistent"], "data.root='/nonexistent' is invalid; accepted: a folder holding"),
        (["max_epochs=null"], "max_epochs=None is invalid"),
        (["strategy.tau=often"], "strategy.tau='often' is invalid; accepted: a positive integer (optimizer steps per round), or 'auto'"),
        (["hetero.slowdown=[1,0.5]"], "hetero.slowdown=[1, 0.5] is invalid; accepted: null or 2 factors >= 1"),
        (["hetero.batch_sizes=[100,100]"], "hetero.batch_sizes=[100, 100] is invalid; accepted: 2 positive integers summing to 256"),
        (["strategy=ssgd", "hetero.proportional=true"], "hetero.proportional=True is invalid; accepted: false with strategy ssgd"),
        (["hetero.nope=1"], "unknown key 'hetero.nope'"),
        (["checkpoint.every_n_epochs=-1"], "checkpoint.every_n_epochs=-1 is invalid; accepted: an integer >= 0"),
        (
            ["run_id=never-ran", "checkpoint.resume=last"],
            "checkpoint.resume='last' is invalid; accepted: null, last, or the path of a .ckpt file (no outputs/default/never-ran/checkpoints/last.ckpt: pass the run_id",
        ),
        (["checkpoint.resume=/no/such.ckpt"], "(no file /no/such.ckpt)"),
        (["trainer.enable_checkpointing=true"], "unknown key 'trainer.enable_checkpointing'"),
        (["strategy.tau=auto", "+strategy.tau_min=8", "+strategy.tau_max=4"], "tau_min=8 > tau_max=4"),
        (
            ["-m", "strategy=ssgd,cocod", "strategy.tau=2"],
            "unknown key 'strategy.tau'; strategy accepts: _target_",
        ),
        (
            ["-m", "strategy=cocod", "strategy.tau=1,0"],
            "strategy.tau=0 is invalid; accepted: a positive integer",
        ),
    ],
)
def test_preflight_says_what_is_wrong_in_one_line(argv, expected):
    with pytest.raises(ConfigError) as info:
        preflight(argv)
    message = str(info.value)
    assert expected in message and "\n" not in message


def test_gpu_launcher_wants_the_gpus_it_names(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"launcher.devices=8 is invalid; accepted: at most 1, the GPUs"):
        preflight(["launcher=gpu", "data=synthetic"])
    assert preflight(["launcher=gpu", "launcher.devices=1", "data=synthetic"])


def test_preflight_passes_a_sweep_and_returns_every_job():
    configs = preflight(["-m", "experiment=smoke", "strategy=cocod,local_sgd", "strategy.tau=2,4"])
    assert [(c.strategy._target_.rpartition(".")[2], c.strategy.tau) for c in configs] == [
        ("CoCoDStrategy", 2),
        ("CoCoDStrategy", 4),
        ("LocalSGDStrategy", 2),
        ("LocalSGDStrategy", 4),
    ]


@pytest.mark.timeout(120)
def test_bad_command_lines_exit_nonzero_with_one_line(tmp_path):
    cases = {"trainer.foo=1": "unknown key 'trainer.foo'", "strategy.tau=0": "strategy.tau=0 is invalid"}
    # Both at once: each pays the package import (Lightning) before it can check anything.
    procs = {
        override: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lightning_cocod.train",
                "experiment=smoke",
                f"out_root={tmp_path}/out",
                override,
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for override in cases
    }
    for override, proc in procs.items():
        out, err = proc.communicate(timeout=110)
        assert proc.returncode == 2, (override, out, err)
        lines = err.strip().splitlines()
        assert (
            len(lines) == 1 and lines[0].startswith("cocod-train: error: ") and cases[override] in lines[0]
        ), err
    assert not (tmp_path / "out").exists()  # nothing started
