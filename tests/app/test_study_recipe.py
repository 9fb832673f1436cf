"""The accuracy study's recipe (recipes/mnist1d_study.sh), in miniature: the jobs its sweeps run
after the app's own checks and ordering, and the report it asks for reads the folders and the
group those jobs write. (A sweep through the app, its records and its report run end to end in
tests/app/test_train.py; this recipe's commands are printed with DRY_RUN=1, not run.)"""

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_cocod.app.checks import method_of
from lightning_cocod.app.preflight import run_order
from tests.helpers.app import preflight, recipe_jobs

REPO = Path(__file__).resolve().parents[2]


def test_the_study_recipe_runs_each_method_and_period_once_and_reports_their_group(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "mini"}
    env.update(WORKERS="2", SEEDS="0", TAUS="2")  # with the half-progress run at 4: two periods
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / "mnist1d_study.sh"), "max_epochs=2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    sweeps = [c[c.index("--multirun") + 1 :] for c in commands if c[0] == "cocod-train"]
    (report,) = [c for c in commands if c[0] == "cocod-report"]
    assert len(sweeps) == 3

    ran, folders, groups = [], set(), set()
    for overrides in sweeps:
        configs = preflight(["-m", *overrides])  # composed and checked as the app does
        order, repeats = run_order(configs)
        for n in order:
            cfg = configs[n]
            if n in repeats:
                continue
            method = method_of(cfg.strategy)
            period = cfg.tau if method in ("local_sgd", "cocod") else None
            ran.append((method, period, cfg.strategy.get("progress", 1.0)))
            assert cfg.launcher.devices == 2 and cfg.seed == 0 and cfg.max_epochs == 2
            folders.add(str(Path(cfg.out_root) / cfg.name))
            groups.add(cfg.group)
    # S-SGD first, and S-SGD and Pipe-SGD once (no period); Local-SGD and CoCoD at tau 2; CoCoD
    # at auto; CoCoD keeping half its progress at 4.
    assert ran == [
        ("ssgd", None, 1.0),
        ("pipe_sgd", None, 1.0),
        ("local_sgd", 2, 1.0),
        ("cocod", 2, 1.0),
        ("cocod", "auto", 1.0),
        ("cocod", 4, 0.5),
    ]
    # The report reads the folder all the runs are under, for their one group.
    assert folders == {str(tmp_path / "out" / "mnist1d")} and groups == {"mnist1d-mini"}
    assert report[1:4] == [str(tmp_path / "out" / "mnist1d"), "--group", "mnist1d-mini"]
    assert OmegaConf.select(configs[0], "hydra.sweep.dir").startswith(str(tmp_path / "out" / "mnist1d"))


def test_the_time_to_accuracy_recipe_runs_every_method_on_per_worker_links(tmp_path):
    env = {"OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "mini", "WORKERS": "4", "SEEDS": "0"}
    jobs, report = recipe_jobs("time_to_accuracy.sh", tmp_path, env, "max_epochs=2")
    ran = []
    for cfg in jobs:
        codec = cfg.strategy.get("compression") or cfg.strategy.get("comm_hook")
        ran.append((method_of(cfg.strategy), cfg.strategy.get("tau"), codec, cfg.strategy.get("tau_max")))
        # Every run on the same per-worker links, model and schedule, in one group.
        assert (cfg.launcher.rate, cfg.launcher.topology, cfg.launcher.devices) == ("100mbit", "pernode", 4)
        assert cfg.model.net.channels == 256 and cfg.max_epochs == 2 and cfg.group == "tta-mini"
    # S-SGD first in its sweep and once; Local-SGD at two periods; CoCoD in every codec at the
    # default tau="auto" (bound 2) and with the bound lifted to hide the round.
    assert ran == [
        ("ssgd", None, None, None),
        ("local_sgd", 4, None, None),
        ("local_sgd", 8, None, None),
        ("ssgd", None, "bf16", None),
        *(("cocod", "auto", codec, bound) for codec in (None, "bf16", "int8") for bound in (2, 64)),
    ]
    assert report[:3] == [str(tmp_path / "out" / "mnist1d_tta"), "--group", "tta-mini"]


def test_the_long_mnist1d_recipe_runs_8_workers_on_five_times_the_signals(tmp_path):
    env = {"OUT_ROOT": str(tmp_path / "out"), "RUN_ID": "mini", "SEEDS": "0"}
    jobs, report = recipe_jobs("mnist1d_long.sh", tmp_path, env, "max_epochs=1")
    ran = []
    for cfg in jobs:
        s = cfg.strategy
        outer = s.get("outer_optimizer")
        outer = outer and (outer.lr, outer.momentum, outer.nesterov)
        ran.append((method_of(s), s.get("tau"), s.get("overlap"), outer, s.get("compression")))
        assert (cfg.launcher.rate, cfg.launcher.topology, cfg.launcher.devices) == ("100mbit", "pernode", 8)
        # The time-to-accuracy study's model and schedule on 60,000 signals: 40,000 to train on.
        assert cfg.model.net.channels == 256 and cfg.data.num_samples == 60_000 and cfg.group == "long1d-mini"
    assert ran == [
        ("ssgd", None, None, None, None),
        ("cocod", "auto", None, None, "int8"),
        ("diloco", 4, 1, (1.0, 0.0, False), "int8"),  # Local-SGD's mean, overlapped with 1 step
    ]
    assert report[:3] == [str(tmp_path / "out" / "mnist1d_long"), "--group", "long1d-mini"]


def test_a_run_names_the_bound_of_its_tau_auto_when_it_is_not_the_default(tmp_path):
    from lightning_cocod.app.identity import make_identity

    names = []
    for bound in ([], ["+strategy.tau_max=2"], ["+strategy.tau_max=64"]):
        (cfg,) = preflight(["experiment=smoke", "strategy.compression=int8", f"out_root={tmp_path}", *bound])
        names.append(make_identity(cfg, tmp_path / "run", "r1")["name"])
    # The default bound (2) is the method's default: no variant; 64 is another row of a report.
    assert names == [
        "cocod-tauauto-int8-w2-s0",
        "cocod-tauauto-int8-w2-s0",
        "cocod-tauauto-int8-tau_max64-w2-s0",
    ]
    # With an outer step the default bound is 1, so 2 is named and 1 is not.
    outer = []
    for bound in ([], ["+strategy.tau_max=1"], ["+strategy.tau_max=2"]):
        argv = ["experiment=smoke", "strategy.progress=2.0", f"out_root={tmp_path}", *bound]
        (cfg,) = preflight(argv)
        outer.append(make_identity(cfg, tmp_path / "run", "r1")["name"])
    assert outer == [
        "cocod-tauauto-progress2-w2-s0",
        "cocod-tauauto-progress2-w2-s0",
        "cocod-tauauto-progress2-tau_max2-w2-s0",
    ]


def test_a_run_names_the_overlap_and_outer_optimizer_that_are_not_its_methods_defaults(tmp_path):
    from lightning_cocod.app.identity import make_identity, variant_of

    outer = "strategy.outer_optimizer"
    cases = {
        (): "diloco-tau8-w2-s0",
        ("strategy.overlap=1", "strategy.compression=int8"): "diloco-tau8-overlap1-int8-w2-s0",
        (f"{outer}.lr=0.35",): "diloco-tau8-outerSGDlr0.35momentum0.9nesterov-w2-s0",
        (
            f"{outer}.momentum=0",
            f"{outer}.nesterov=false",
            f"{outer}.lr=1.0",
        ): "diloco-tau8-outerSGDlr1momentum0-w2-s0",
        (f"{outer}=null",): "diloco-tau8-outernone-w2-s0",
        ("strategy.overlap=auto",): "diloco-tau8-overlapauto-w2-s0",
        (
            "strategy.outer_scheduler={_target_:torch.optim.lr_scheduler.LinearLR,_partial_:true,"
            "start_factor:0.25,total_iters:3}",
        ): "diloco-tau8-scheduleLinearLRstart_factor0.25total_iters3-w2-s0",
    }
    names = {}
    for overrides in cases:
        argv = ["experiment=smoke", "strategy=diloco", f"out_root={tmp_path}", *overrides]
        (cfg,) = preflight(argv)
        names[overrides] = make_identity(cfg, tmp_path / "run", "r1")["name"]
    assert names == cases
    # Records from before the options existed ran the defaults: no variant, as before.
    assert variant_of({"method": "diloco", "tau": 8}) is None
    assert variant_of({"method": "cocod", "tau": 4}) is None
    assert variant_of({"method": "cocod", "tau": 8, "overlap": 1, "outer_optimizer": "SGD lr 0.7"}) == (
        "overlap 1, outer SGD lr 0.7"
    )


def _recipe(
    recipe: str, tmp_path: Path, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess, str]:
    """Runs ``recipes/<recipe>`` for real (no DRY_RUN unless ``env`` sets one) with every program a
    recipe starts replaced by one that notes its command line: (the process, what ran)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name in ("cocod-train", "cocod-report", "torchrun", "sbatch"):
        (fake / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "$RAN"\n')
        (fake / name).chmod(0o755)
    (tmp_path / "README.md").write_text("a file for a '*' to expand to\n")
    ran = tmp_path / "ran.txt"
    base = {k: v for k, v in os.environ.items() if k not in _RECIPE_VARIABLES}
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / recipe), *args],
        cwd=tmp_path,
        env={**base, "PATH": f"{fake}:{os.environ['PATH']}", "RAN": str(ran), "RUN_ID": "r1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return done, ran.read_text() if ran.exists() else ""


_RECIPE_VARIABLES = ("DRY_RUN", "HETERO", "SEEDS", "TAUS", "WORKERS", "NNODES", "NPROC", "MAX_RESTARTS")
_RECIPE_VARIABLES += ("RATE", "SLOWDOWN", "RUN_ID", "GROUP", "OUT_ROOT", "HEAD")


def test_the_recipes_run_their_commands_for_real_without_dry_run(tmp_path):
    """What the refusals below are measured against: with good variables the stand-in programs
    do run (so "nothing ran" there means something)."""
    done, ran = _recipe("time_to_accuracy.sh", tmp_path, {"WORKERS": "4,8", "DRY_RUN": "0"})
    assert done.returncode == 0, done.stderr
    assert ran.count("cocod-train") == 6 and ran.count("cocod-report") == 1
    assert "launcher.devices=4 " in ran and "launcher.devices=8 " in ran
    (tmp_path / "m").mkdir()
    done, ran = _recipe("mnist1d_study.sh", tmp_path / "m", {"WORKERS": "4 8"})
    assert done.returncode == 0, done.stderr
    assert "launcher.devices=4,8 " in ran  # one Hydra sweep over both counts


def test_the_tuned_long_rounds_recipe_takes_one_worker_count_per_run(tmp_path):
    """Its rows' settings are per worker count, and shaped_study gives every count the same rows:
    a list of counts would run one count's settings at the other."""
    for counts in ("4,8", "4 8"):
        done, ran = _recipe("long_rounds_tuned.sh", tmp_path, {"WORKERS": counts})
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert ran == "" and done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("long_rounds_tuned.sh: WORKERS=") and "one worker count" in line


@pytest.mark.parametrize(
    "recipe, name, value",
    [
        *(("mnist1d_study.sh", "DRY_RUN", v) for v in ("true", "yes", "TRUE", " 1", "01", "2")),
        ("time_to_accuracy.sh", "DRY_RUN", "true"),
        ("smoke.sh", "DRY_RUN", "yes"),
        ("resnet18_cifar10.sh", "DRY_RUN", "1 "),
        *(("time_to_accuracy.sh", "WORKERS", v) for v in ("*", " ", "4,,8", "0", "4 *")),
        *(("mnist1d_study.sh", "WORKERS", v) for v in ("*", " ", "-1")),
        ("gpt_study.sh", "WORKERS", "?"),
        *(("mnist1d_study.sh", "SEEDS", v) for v in ("a", "1-2", "-1", "0,", "4294967296", "00")),
        *(("mnist1d_study.sh", "TAUS", v) for v in ("0", "x", "2 8", "*")),
        *(("gpt_study.sh", "RATE", v) for v in ("100", "fast", "100 mbit")),
        *(("resnet18_cifar10.sh", "SLOWDOWN", v) for v in ("[0,1]", "1,2", "[1,*]")),
        ("resnet18_cifar10.sh", "HETERO", "true"),
        *(("smoke.sh", "RUN_ID", v) for v in ("a b", "x,y", "../up", "*")),
        *(("long_rounds_study.sh", "GROUP", v) for v in ("a b", "x,y", "*")),
        *(("long_rounds_study.sh", "ROWS", v) for v in ("nope", "ssgd,", "ssgd diloco", "*")),
        *(("smoke.sh", "OUT_ROOT", v) for v in ("a,b", "-x", "a b", "out/*")),
        ("resnet18_cifar10.sh", "NNODES", "0"),
        ("resnet18_cifar10.sh", "NPROC", "two"),
        ("resnet18_cifar10.sh", "MAX_RESTARTS", "-1"),
        ("resnet18_cifar10.sh", "HEAD", "a;b"),
    ],
)
def test_a_bad_recipe_variable_is_refused_by_name_before_anything_runs(tmp_path, recipe, name, value):
    """DRY_RUN=true ran the study for real (only the exact 1 dry-ran), WORKERS='*' became
    launcher.devices=README.md, a blank WORKERS ran no sweep and exited 0: each is refused in one
    line naming the variable and what is accepted, and no command runs."""
    args = ["torchrun"] if recipe == "resnet18_cifar10.sh" else []
    done, ran = _recipe(recipe, tmp_path, {"HEAD": "node01", name: value}, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert ran == "" and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{recipe}: {name}=") and " is invalid; accepted: " in line
