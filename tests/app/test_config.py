"""Every config in conf/ composes and instantiates; recipes compose; bad command lines fail in one line."""

import os
import shlex
import subprocess
import sys

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from pytorch_lightning.strategies import Strategy

from lightning_cocod._errors import ConfigError
from lightning_cocod.app.checks import check
from lightning_cocod.app.files import resume_checkpoint
from lightning_cocod.app.identity import world_size
from lightning_cocod.app.preflight import config_dir, job_overrides, run_order
from tests.helpers.app import preflight, user_module

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


def compose_all(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3", job_name="train"):
        return [compose("train", overrides)]


def test_groups_have_the_options_the_layout_promises():
    assert set(options("strategy")) == {"cocod", "diloco", "local_sgd", "pipe_sgd", "ssgd"}
    assert {"resnet18", "vgg16", "small_cnn", "mnist1d_cnn", "gpt"} <= set(options("model"))
    # An experiment's model settings are the model option of its name.
    assert set(options("experiment")) <= set(options("model"))
    assert set(options("data")) == {"cifar10", "cifar100", "digits", "mnist1d", "synthetic", "markov"}
    assert set(options("launcher")) == {"cpu", "gpu", "torchrun", "slurm"}
    assert set(options("logger")) == {"wandb", "csv", "none"}
    experiments = {
        "resnet18_cifar10",
        "vgg16_cifar100",
        "smoke",
        "digits_cocod",
        "mnist1d",
        "gpt",
        "gpt_smoke",
    }
    assert experiments <= set(options("experiment"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_and_passes_the_checks(group):
    for option in options(group):
        extra = ["run_id=r1"] if option in ("torchrun", "slurm") else []
        if group == "model" and option.startswith("gpt"):
            extra.append("data=markov")  # the GPT takes token data only (refused with images)
        (cfg,) = compose_all([f"{group}={option}", *extra])
        check(cfg)


DATA_OF_MODEL = {"small_cnn": "data=digits", "mnist1d_cnn": "data=mnist1d", "gpt": "data=markov"}


def test_every_target_instantiates(tmp_path):
    for option in options("strategy"):
        (cfg,) = compose_all([f"strategy={option}"])
        assert isinstance(instantiate(cfg.strategy), Strategy)
    for option in options("model"):
        (cfg,) = compose_all([f"model={option}", DATA_OF_MODEL.get(option, "data=cifar10")])
        module = instantiate(cfg.model)
        assert module.num_classes == cfg.dataset.num_classes
    for option in options("data"):
        (cfg,) = compose_all([f"data={option}"])
        assert instantiate(cfg.data).batch_size == cfg.data.batch_size
    for option in ("csv", "wandb"):
        (cfg,) = compose_all([f"logger={option}"])
        assert instantiate(cfg.logger, save_dir=str(tmp_path)) is not None


def test_the_overlap_is_chosen_from_the_command_line():
    (cfg,) = compose_all(["strategy=diloco", "strategy.overlap=auto"])
    check(cfg)
    strategy = instantiate(cfg.strategy)
    assert strategy.overlap == "auto" and strategy.rounds.overlap_in_force == strategy.tau == 8


@pytest.mark.parametrize("experiment", options("experiment"))
@pytest.mark.parametrize("launcher", ["cpu", "gpu", "torchrun", "slurm"])
def test_every_experiment_composes_with_every_launcher(experiment, launcher):
    (cfg,) = compose_all([f"experiment={experiment}", f"launcher={launcher}", "run_id=r1"])
    check(cfg)
    assert cfg.name == experiment and cfg.group == experiment


RECIPE_MODES = {
    "resnet18_cifar10.sh": ["node8", "torchrun", "slurm"],
    "vgg16_cifar100.sh": ["node8", "torchrun", "slurm"],
    "smoke.sh": [""],
    "mnist1d_study.sh": [""],
    "time_to_accuracy.sh": [""],
    "gpt_study.sh": [""],
}


def app_arguments(line: str) -> list[str] | None:
    """The app's own arguments in one printed recipe command, None for other commands."""
    words = shlex.split(line)
    for marker, extra in (
        ("cocod-train", []),
        ("lightning_cocod.app.train", []),
        ("slurm.sbatch", ["launcher=slurm", "checkpoint.resume=auto"]),
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
                **os.environ,
                "DRY_RUN": "1",
                "HEAD": "node01",
                "RUN_ID": "t",
                "NNODES": "2",
                "NPROC": "8",
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
            overrides = [a for a in args if a != "--multirun"]
            jobs = job_overrides(overrides) if multirun else [overrides]
            assert len(jobs) > 1 if multirun else len(jobs) == 1
            # Seeds change no key: one job per distinct rest keeps the test short (compose ~0.1 s).
            distinct = {tuple(o for o in job if not o.startswith("seed=")): job for job in jobs}
            configs = [compose_all(job)[0] for job in distinct.values()]
            for cfg in configs:
                check(cfg)  # the objects too (~0.1 s a job)
                if mode in ("torchrun", "slurm", "node16"):
                    assert world_size(cfg) == 16
    assert commands >= len(RECIPE_MODES[recipe])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["strategy=foo"],
            "strategy=foo is not an option; accepted: cocod, diloco, local_sgd, pipe_sgd, ssgd",
        ),
        (["experiment=nope"], "experiment=nope is not an option"),
        (["trainer.foo=1"], "unknown key 'trainer.foo'; trainer accepts: benchmark"),
        (["+trainer.foo=1"], "unknown key 'trainer.foo'; Trainer accepts: accumulate_grad_batches"),
        (["+model.net.depth=3"], "unknown key 'model.net.depth'; ResNet18 accepts: in_channels, num_classes"),
        (
            ["strategy.tau=0"],
            'strategy: CoCoDStrategy: tau=0 is invalid; accepted: a positive integer (optimizer steps per round) or "auto"',
        ),
        (
            ["tau=0"],
            "tau=0 is invalid; accepted: null (each method's default), a positive integer (optimizer steps per round of local_sgd, cocod, diloco;",
        ),
        (
            ["strategy=local_sgd", "tau=auto"],
            "strategy: LocalSGDStrategy: tau='auto' is invalid; accepted: a positive integer (optimizer steps per round)",
        ),
        (["strategy=ssgd", "tau=-1"], "tau=-1 is invalid"),  # ignored by S-SGD, still checked
        (
            ["trainer.precision=banana"],
            "trainer.precision='banana' is invalid; accepted: one of 64, 32, 16, 'transformer-engine'",
        ),
        (["trainer.max_epochs=abc"], "trainer.max_epochs='abc' is invalid; accepted: an integer or null"),
        (
            ["trainer.deterministic=maybe"],
            "trainer.deterministic='maybe' is invalid; accepted: one of true, false, 'warn', null",
        ),
        (
            ["data=synthetic", "data.num_samples=0"],
            "data: SyntheticDataModule: num_samples=0 is invalid; accepted: an integer >= 1",
        ),
        (
            ["experiment=smoke", "launcher.devices=3", "data.batch_size=1000"],
            "data.batch_size=1000 is invalid; accepted: at most 479 with 3 workers (one global batch of batch_size x workers must fit in the 1437 training samples)",
        ),
        (["data=digits", "data.batch_size=719"], "at most 718 with 2 workers"),
        (["out_root=/proc/x"], "out_root='/proc/x' is invalid; accepted: a folder this user can write"),
        (["strategy.timeout=0"], "strategy.timeout=0 is invalid; accepted: a number of seconds >= 1"),
        (["strategy.timeout=0.001"], "strategy.timeout=0.001 is invalid; accepted: a number of seconds >= 1"),
        (["strategy=ssgd", "strategy.timeout=abc"], "strategy.timeout='abc' is invalid"),
        (
            ["checkpoint.every_n_steps=-1"],
            "checkpoint: PeriodicCheckpoint: every_n_steps=-1 is invalid; accepted: an integer >= 0",
        ),
        (
            ["checkpoint.every_n_minutes=-2"],
            "checkpoint: PeriodicCheckpoint: every_n_minutes=-2.0 is invalid; accepted: a number >= 0",
        ),
        (["progress_every_s=-1"], "progress_every_s=-1.0 is invalid"),
        (["data.batch_size=0"], "data.batch_size=0 is invalid"),
        (["model.lr=-1"], "model: ClassifierModule: lr=-1 is invalid; accepted: a positive float"),
        (["launcher=torchrun"], "run_id='none' is invalid"),
        (["launcher.num_nodes=2"], "launcher.num_nodes=2 is invalid; accepted: 1 with launcher=cpu"),
        (["launcher.rate=fast"], "launcher.rate='fast' is invalid"),
        (["launcher.topology=star"], "launcher.topology='star' is invalid; accepted: loopback or pernode"),
        (["data.root=/nonexistent"], "data.root='/nonexistent' is invalid; accepted: a folder holding"),
        (["max_epochs=null"], "max_epochs=None is invalid"),
        (["seed=-1"], "seed=-1 is invalid; accepted: an integer from 0 to 4294967295"),
        (["seed=4294967296"], "seed=4294967296 is invalid; accepted: an integer from 0 to 4294967295"),
        (["max_steps=0"], "max_steps=0 is invalid; accepted: a positive integer, or -1"),
        (["max_steps=-7"], "max_steps=-7 is invalid; accepted: a positive integer, or -1"),
        (["max_epochs=0"], "max_epochs=0 is invalid; accepted: a positive integer, or null"),
        (["judged_by=perplexity"], "judged_by='perplexity' is invalid; accepted: accuracy or loss"),
        (["trainer.val_check_interval=often"], "trainer.val_check_interval='often' is invalid; accepted: "),
        (
            ["strategy.tau=often"],
            "strategy: CoCoDStrategy: tau='often' is invalid; accepted: a positive integer (optimizer steps per round) or \"auto\"",
        ),
        (
            ["hetero.slowdown=[1,0.5]"],
            "hetero: slowdown factors must be numbers >= 1 (1 = full speed, 2 = twice as slow), got [1.0, 0.5]",
        ),
        (
            ["hetero.batch_sizes=[100,100]"],
            "hetero.batch_sizes=[100, 100] is invalid; accepted: 2 positive integers summing to 256",
        ),
        (
            ["strategy=ssgd", "hetero.proportional=true"],
            "hetero.proportional=True is invalid; accepted: false with strategy ssgd",
        ),
        (["hetero.nope=1"], "unknown key 'hetero.nope'"),
        (
            ["checkpoint.every_n_epochs=-1"],
            "checkpoint: PeriodicCheckpoint: every_n_epochs=-1 is invalid; accepted: an integer >= 0",
        ),
        (
            ["run_id=never-ran", "checkpoint.resume=last"],
            "checkpoint.resume='last' is invalid; accepted: null, last, auto, or the path of a .ckpt file (no outputs/default/never-ran/checkpoints/last.ckpt: pass the run_id",
        ),
        (["checkpoint.resume=/no/such.ckpt"], "(no file /no/such.ckpt)"),
        (["trainer.enable_checkpointing=true"], "unknown key 'trainer.enable_checkpointing'"),
        (["trainer.devices=4"], "unknown key 'trainer.devices'; trainer accepts: benchmark"),
        (["trainer.devices=4"], "the app sets it from launcher.devices"),
        (["+trainer.devices=4"], "trainer.devices is set by the app from launcher.devices"),
        (
            ["model._target_=mymod.MyModule"],
            "model._target_='mymod.MyModule' is invalid; accepted: an importable class",
        ),
        (
            ["strategy.tau=auto", "+strategy.tau_min=8", "+strategy.tau_max=4"],
            "tau_min=8 is invalid; accepted: a period no longer than tau_max=4",
        ),
        (
            ["-m", "strategy=ssgd,cocod", "strategy.tau=2"],
            "unknown key 'strategy.tau'; strategy accepts: _target_, comm_hook, powersgd_rank, process_group_backend, start_method, timeout; "
            "the period of every method that has one is tau=... (S-SGD and Pipe-SGD ignore it)",
        ),
        (
            ["-m", "strategy=cocod", "strategy.tau=1,0"],
            'strategy: CoCoDStrategy: tau=0 is invalid; accepted: a positive integer (optimizer steps per round) or "auto" [job: ',
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
    configs = preflight(["-m", "experiment=smoke", "strategy=cocod,local_sgd", "tau=2,4"])
    assert [(c.strategy._target_.rpartition(".")[2], c.strategy.tau) for c in configs] == [
        ("CoCoDStrategy", 2),
        ("CoCoDStrategy", 4),
        ("LocalSGDStrategy", 2),
        ("LocalSGDStrategy", 4),
    ]
    assert run_order(configs) == ([0, 1, 2, 3], {})  # every job differs, none is S-SGD


def test_a_sweep_runs_ssgd_first_and_once_per_condition_whatever_the_periods():
    configs = preflight(["-m", "experiment=smoke", "tau=2,4", "strategy=cocod,ssgd,pipe_sgd"])
    jobs = [(c.strategy._target_.rpartition(".")[2], c.tau) for c in configs]
    assert jobs == [(s, t) for t in (2, 4) for s in ("CoCoDStrategy", "SSGDStrategy", "PipeSGDStrategy")]
    order, repeats = run_order(configs)
    assert order == [1, 4, 0, 2, 3, 5]  # S-SGD first, the others as listed
    # S-SGD and Pipe-SGD at tau=4 repeat their tau=2 jobs; CoCoD at each tau is its own.
    assert repeats == {4: 1, 5: 2}
    assert run_order(preflight(["-m", "experiment=smoke", "strategy=ssgd", "tau=2,4", "seed=0,1"]))[1] == {
        2: 0,
        3: 1,
    }


@pytest.mark.timeout(120)
def test_commands_that_run_nothing_need_no_data_and_no_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("COCOD_DATA", str(tmp_path / "nothing-here"))
    (tmp_path / "empty").mkdir()
    commands = (["--cfg", "job", "out_root=/proc/x"], ["--info"])
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lightning_cocod.app.train", *argv],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for argv in commands
    ]
    for argv, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=110)
        assert proc.returncode == 0 and "error" not in err, (argv, out, err)
    with pytest.raises(ConfigError, match="data.root="):  # a run needs the data
        preflight([])
    assert list((tmp_path / "empty").iterdir()) == []  # no run folder either


@pytest.mark.timeout(60)
def test_cfg_job_prints_the_default_config_on_a_machine_without_data(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COCOD_DATA"}
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_cocod.app.train", "--cfg", "job"],
        cwd=tmp_path / "empty",
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["data"]["root"] == "${oc.env:COCOD_DATA,data}" and printed["data"]["dataset"] == "cifar10"
    # The package's default period: tau="auto" for CoCoD-SGD (the top-level tau unset).
    assert printed["strategy"]["_target_"] == "lightning_cocod.CoCoDStrategy" and printed["tau"] is None
    assert printed["strategy"]["tau"] == "${period:auto}"
    assert list((tmp_path / "empty").iterdir()) == []  # no run folder either


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"", "is empty"), (b"not a checkpoint at all", "cannot be read"), (None, "cannot be read")],
)
def test_a_broken_checkpoint_is_refused_in_one_line_before_anything_starts(tmp_path, content, expected):
    path = tmp_path / "model.ckpt"
    if content is None:  # a real checkpoint cut short
        torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        preflight([f"checkpoint.resume={path}", f"out_root={tmp_path / 'out'}"])
    message = str(info.value)
    assert message.startswith(f"checkpoint.resume='{path}' is invalid") and expected in message
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_auto_resume_continues_the_newest_checkpoint_or_starts_afresh(tmp_path):
    out = tmp_path / "out"
    common = [f"out_root={out}", "run_id=r", "checkpoint.resume=auto"]
    assert preflight(common) and not out.exists()  # nothing to continue: a fresh start, and valid
    job = out / "default" / "r"
    (cfg,) = compose_all(common)
    assert resume_checkpoint(cfg, job) is None
    (job / "checkpoints").mkdir(parents=True)
    older, newer = job / "checkpoints" / "last.ckpt", job / "checkpoints" / "last-v1.ckpt"
    older.write_bytes(b"x")
    newer.write_bytes(b"y")
    os.utime(older, (1, 1))
    assert resume_checkpoint(cfg, job, verify=False) == str(newer)
    # A checkpoint that is there but broken is refused, not silently trained over.
    with pytest.raises(ConfigError, match=r"checkpoint.resume='auto' is invalid; accepted: null, last, auto"):
        preflight(common)


def test_a_hydra_launcher_plugin_is_refused_for_a_single_run_too(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^hydra.launcher._target_=x.Joblib would not be used \(cocod-train"
    ):
        preflight(["experiment=smoke", f"out_root={tmp_path}", "hydra.launcher._target_=x.Joblib"])
    assert preflight(["experiment=smoke", f"out_root={tmp_path}"])  # Hydra's basic launcher, the default


@pytest.mark.timeout(120)
def test_bad_command_lines_exit_nonzero_with_one_line(tmp_path):
    cases = {
        ("trainer.foo=1",): "unknown key 'trainer.foo'",
        ("strategy.tau=0",): "CoCoDStrategy: tau=0 is invalid; accepted: a positive",
        # glob() lists the group's options (Hydra's config loader), and each job is checked by name.
        ("-m", "strategy=glob(*)", "launcher.devices=0"): (
            "launcher.devices=0 is invalid; accepted: a positive integer [job: "
        ),
        # A Hydra launcher plugin (hydra-submitit-launcher's, say) would never see a job: a sweep
        # meant for a cluster's queue would run here.
        ("-m", "strategy=ssgd,cocod", "hydra.launcher._target_=hydra_plugins.x.SlurmLauncher"): (
            "hydra.launcher._target_=hydra_plugins.x.SlurmLauncher would not be used (cocod-train runs "
            "each job itself); accepted: Hydra's basic launcher; where the workers run is launcher=cpu|gpu|"
        ),
    }
    # All at once: each pays the package import (Lightning) before it can check anything.
    procs = {
        override: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lightning_cocod.app.train",
                *[a for a in override if a == "-m"],  # Hydra's flags before the overrides
                "experiment=smoke",
                f"out_root={tmp_path}/out",
                *[a for a in override if a != "-m"],
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


@pytest.mark.parametrize("data", ["digits", "synthetic", "mnist1d", "cifar10"])
def test_the_smoke_experiment_takes_any_data(data, tmp_path):
    (cfg,) = preflight(["experiment=smoke", f"data={data}", f"out_root={tmp_path}"])
    (plain,) = compose_all([f"data={data}"])
    assert cfg.data._target_ == plain.data._target_ and cfg.data.batch_size == 32


def test_the_optimizer_is_chosen_in_the_config():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for option, kind in (("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)):
        (cfg,) = compose_all(["experiment=smoke", f"optimizer={option}"])
        optimizer = instantiate(cfg.model).build_optimizer([{"params": params, "weight_decay": 0.0}], lr=0.2)
        assert type(optimizer) is kind and optimizer.param_groups[0]["lr"] == 0.2
    assert optimizer.defaults["betas"] == (0.9, 0.999)
    sgd = instantiate(compose_all(["experiment=smoke"])[0].model).build_optimizer(params, lr=0.1)
    assert (sgd.defaults["momentum"], sgd.defaults["nesterov"]) == (0.9, False)


@pytest.mark.timeout(60)
def test_help_lists_the_groups_and_the_top_level_options(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_cocod.app.train", "--help"],
        cwd=tmp_path / "empty",
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for group in GROUPS + ("optimizer",):
        assert f"{group}: {', '.join(options(group))}" in lines
    keys = yaml.safe_load((CONF / "train.yaml").read_text())
    scalars = [k for k, v in keys.items() if not isinstance(v, (dict, list))]
    for key in scalars:  # each with its default and what it does
        assert any(line.startswith(f"{key}=") and len(line.split()) > 2 for line in lines), key
    assert "strategy:\n" not in proc.stdout and "process_group_backend" not in proc.stdout  # not a dump
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize(
    ("override", "taken"),
    [
        ("trainer.precision=bf16-mixed", True),
        ("trainer.precision=32", True),
        ("trainer.precision=true", False),  # True == 1, but no precision Lightning knows
        ("trainer.deterministic=warn", True),
        ("trainer.max_epochs=null", True),
        ("trainer.max_epochs=1.5", False),
        ("max_epochs=abc", False),
        ("+trainer.limit_val_batches=0.25", True),
        ("+trainer.limit_val_batches=3", True),
        ("hetero.slowdown=[1,x]", False),
        ("launcher=torchrun", False),  # no rate: the torchrun launcher starts no link
    ],
)
def test_the_schema_takes_what_lightning_would(override, taken, tmp_path):
    argv = ["experiment=smoke", f"out_root={tmp_path}", override]
    if override == "launcher=torchrun":
        argv += ["run_id=r1", "launcher.rate=1gbit"]
    if taken:
        assert preflight(argv)
    else:
        with pytest.raises(ConfigError, match=r"is invalid; accepted: |unknown key 'launcher.rate'"):
            preflight(argv)


OWN_MODULES = '''
import pytorch_lightning as pl
import torch


class Full(pl.LightningModule):  # no **kwargs: it takes only what it names
    def __init__(self, hidden: int = 8, lr: float = 0.5):
        pl.LightningModule.__init__(self)  # not super(): the classes below take this method too
        self.lr = lr
        self.net = torch.nn.Linear(64, 10)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", 0.0)

    def test_step(self, batch, batch_idx):
        self.log("test/acc", 0.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def lacking(hook):
    """Full without ``hook``: a class of its own that never defines it."""
    return type(f"No_{hook}", (pl.LightningModule,), {k: v for k, v in vars(Full).items() if k != hook})


NoTrainingStep = lacking("training_step")
NoConfigureOptimizers = lacking("configure_optimizers")
NoValidationStep = lacking("validation_step")
NoTestStep = lacking("test_step")


class MyData(pl.LightningDataModule):
    def __init__(self, batch_size: int, eval_batch_size=None, seed: int = 0):
        super().__init__()
        self.batch_size = batch_size
'''


@pytest.fixture
def own_modules(tmp_path, monkeypatch):
    """``ownmods``, a module of the user's own, importable as the app finds it (the current folder)."""
    yield from user_module(tmp_path, monkeypatch, "ownmods", OWN_MODULES)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_no_experiment_gives_a_module_of_your_own_its_model_settings(experiment):
    (cfg,) = compose_all([f"experiment={experiment}", "~model", "+model._target_=ownmods.Full"])
    assert OmegaConf.to_container(cfg.model) == {"_target_": "ownmods.Full"}
    (cfg,) = compose_all([f"experiment={experiment}", "model=small_cnn"])  # the option's own settings
    (plain,) = compose_all(["model=small_cnn"])
    assert OmegaConf.to_container(cfg.model) == OmegaConf.to_container(plain.model)


def test_a_module_of_your_own_gets_only_the_keys_you_give_it_with_or_without_an_experiment(own_modules):
    # Not the experiment's learning rate, network or schedule: Full keeps its own lr default.
    for base in ([], ["experiment=smoke"]):
        common = [*base, "data=digits", f"out_root={own_modules / 'out'}"]
        (cfg,) = preflight([*common, "~model", "+model._target_=ownmods.Full"])
        assert OmegaConf.to_container(cfg.model) == {"_target_": "ownmods.Full"}
        (cfg,) = preflight([*common, "~model", "+model._target_=ownmods.Full", "+model.hidden=16"])
        assert OmegaConf.to_container(cfg.model) == {"_target_": "ownmods.Full", "hidden": 16}
        (cfg,) = preflight([*common, "data._target_=ownmods.MyData"])
        assert cfg.data._target_ == "ownmods.MyData"
        assert set(cfg.data) == {"_target_", "batch_size", "eval_batch_size", "seed"}


def test_the_hint_for_a_replaced_model_target_is_a_command_that_works(own_modules):
    for base in ([], ["experiment=smoke"]):
        common = [*base, "data=digits", f"out_root={own_modules / 'out'}"]
        with pytest.raises(ConfigError) as info:
            preflight([*common, "model._target_=ownmods.Full"])
        message = str(info.value)
        assert message.startswith("unknown key 'model.") and "Full accepts: hidden, lr" in message
        hinted = message.split("; a module of your own: ")[1].split()
        assert hinted == ["~model", "+model._target_=ownmods.Full"]
        preflight([*common, *hinted])  # passes


@pytest.mark.parametrize(
    ("module", "hook", "use"),
    [
        ("NoTrainingStep", "training_step", "fit trains with it"),
        ("NoConfigureOptimizers", "configure_optimizers", "fit builds the optimizer with it"),
        ("NoValidationStep", "validation_step", "it logs val/acc after every epoch"),
        ("NoTestStep", "test_step", "records the test/acc it logs"),
    ],
)
def test_a_module_without_a_hook_the_app_needs_is_refused_before_anything_runs(
    module, hook, use, own_modules
):
    out = own_modules / "out"
    with pytest.raises(ConfigError) as info:
        preflight(["experiment=smoke", "~model", f"+model._target_=ownmods.{module}", f"out_root={out}"])
    message = str(info.value)
    assert message.startswith(
        f"model._target_='ownmods.{module}' is invalid; accepted: a LightningModule with "
    )
    assert f"has no {hook}, which the app needs: " in message and use in message and "\n" not in message
    assert not out.exists()
