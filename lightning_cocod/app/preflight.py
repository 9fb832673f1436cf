"""Every job of a command line is composed once and checked before the first one runs.

A single run: ``RunFolder``, a Hydra callback (train.yaml's hydra.callbacks), gets the config Hydra
composed before Hydra makes the run folder: it checks it, claims the folder and pins a run_id
from the clock in that same config, which Hydra then runs. A sweep (``-m``): ``Sweeper``, the
hydra/sweeper of train.yaml, composes each job, checks them all, orders them (S-SGD first; a job
that only changes a period its method lacks runs once), claims the sweep folder and runs them.
Hydra's basic sweeper would make the sweep folder and compose each job twice before any check.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from hydra.plugins.sweeper import Sweeper as HydraSweeper
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lightning_cocod._errors import ConfigError
from lightning_cocod.app.checks import check, method_of
from lightning_cocod.app.files import check_run_folder, claim_run, is_rank_zero, resume_checkpoint
from lightning_cocod.app.schema import compose_error
from lightning_cocod.methods import PERIODIC

CONFIG_DIR_ENV = "COCOD_CONFIG_DIR"
log = logging.getLogger("cocod-train")


def config_dir() -> Path:
    """Where the configs are: $COCOD_CONFIG_DIR when set; the ones installed with the package
    (lightning_cocod/conf in a wheel); else conf/ of the source checkout (an editable install)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    installed = Path(__file__).resolve().parents[1] / "conf"
    checkout = Path(__file__).resolve().parents[2] / "conf"
    path = Path(override) if override else installed if (installed / "train.yaml").is_file() else checkout
    if not (path / "train.yaml").is_file():
        where = f"{CONFIG_DIR_ENV}={override}" if override else "this installation"
        accepted = f"reinstall lightning_cocod, or set {CONFIG_DIR_ENV} to a config folder"
        raise ConfigError(f"no train.yaml in {path} ({where}): {accepted}")
    return path


def refuse(err: ConfigError | str) -> NoReturn:
    """The app's ending for a bad command line: one line, exit code 2, nothing started."""
    print(f"cocod-train: error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)


def job_part(cfg: DictConfig) -> DictConfig:
    """The job's own config, as the task gets it: without Hydra's node."""
    job = cfg.copy()
    with read_write(job), open_dict(job):
        job.pop("hydra", None)
    return job


# A job's folder is named by its overrides (hydra.sweep.subdir); a file name holds 255 bytes, and a
# sweep of a dozen overrides (a tuned outer round) went past it and failed at its first file.
_DIRNAME_BYTES = 200


def fitting_dirname(name: str) -> str:
    """``name`` if a folder can be named so; else its first bytes and a digest of the whole, the
    same on every rank and apart for different overrides (the run's resolved.yaml has them all)."""
    raw = name.encode()
    if len(raw) <= _DIRNAME_BYTES:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:12]
    return raw[: _DIRNAME_BYTES - 13].decode(errors="ignore") + "-" + digest


def job_overrides(overrides: Sequence[str], config_loader: Any = None) -> list[list[str]]:
    """The override list of every job of a sweep, in the order of Hydra's basic sweeper: the
    product of the swept values, the first override varying slowest. ``config_loader`` lists a
    group's options for ``glob()``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values: dict[str, list[str]] = {}  # a key given twice: the last one counts, as for Hydra
    for override in OverridesParser.create(config_loader).parse_overrides(list(overrides)):
        key = override.get_key_element()
        if override.is_sweep_override() and not override.is_discrete_sweep():
            raise ConfigError(f"{override.input_line}: accepted: a list of values (a,b,c), not an interval")
        swept = override.sweep_string_iterator() if override.is_sweep_override() else None
        values[key] = [f"{key}={v}" for v in swept or [override.get_value_element_as_str()]]
    return [list(job) for job in itertools.product(*values.values())]


def check_jobs(jobs: Sequence[Sequence[str]], configs: Sequence[DictConfig]) -> None:
    """``check`` on every job; a sweep's error names its job."""
    from lightning_cocod.app.user_code import check_own_data

    for overrides, cfg in zip(jobs, configs):
        try:
            check_own_data(cfg)
            check(job_part(cfg))
        except ConfigError as err:
            raise ConfigError(f"{err} [job: {' '.join(overrides)}]" if len(jobs) > 1 else str(err)) from None


def run_order(configs: Sequence[DictConfig]) -> tuple[list[int], dict[int, int]]:
    """The jobs in the order they run (S-SGD first, so each other run's speedup is known when it
    ends), and each job that repeats an earlier one -> that job: a sweep over ``tau`` runs S-SGD and
    Pipe-SGD, which have no period, once per condition rather than once per value of ``tau``."""
    order = sorted(range(len(configs)), key=lambda n: method_of(configs[n].strategy) != "ssgd")
    first: dict[str, int] = {}
    repeats = {}
    for n in order:
        plain = OmegaConf.to_container(job_part(configs[n]), resolve=False)  # a clock reads alike
        assert isinstance(plain, dict)
        if method_of(configs[n].strategy) not in PERIODIC:
            plain.pop("tau")
        if (earlier := first.setdefault(repr(plain), n)) != n:
            repeats[n] = earlier
    return order, repeats


def _threads_before_torch(cfg: DictConfig) -> None:
    """Under torchrun/SLURM this process is the rank: it starts again (same pid, same arguments)
    with OMP_NUM_THREADS (and MKL's) set to its threads, unless they are already. The OpenMP and
    MKL runtimes read them only when torch loads; torch.set_num_threads in the fit alone left two
    ranks sharing a node at 0.27 s a step against 0.035 s with OMP_NUM_THREADS. (The cpu/gpu
    launchers set it for the workers they start.)"""
    from lightning_cocod.app.fit import threads_per_rank

    if cfg.launcher.name not in ("torchrun", "slurm"):
        return
    threads = str(threads_per_rank(cfg.launcher, os.environ))
    if all(os.environ.get(name) == threads for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        return
    os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _refuse_hydra_launchers(config: DictConfig) -> None:
    """A Hydra launcher plugin (submitit, joblib, ...) would never be asked to run a job: the app
    runs each job itself, so a sweep meant for a cluster's queue would run on this machine."""
    target = OmegaConf.select(config, "hydra.launcher._target_") or ""
    if target.endswith(".BasicLauncher"):
        return
    choice = OmegaConf.select(config, "hydra.runtime.choices", default={}).get("hydra/launcher")
    given = (
        f"hydra/launcher={choice}" if choice not in (None, "basic") else f"hydra.launcher._target_={target}"
    )
    accepted = "Hydra's basic launcher; where the workers run is launcher=cpu|gpu|torchrun|slurm"
    raise ConfigError(f"{given} would not be used (cocod-train runs each job itself); accepted: {accepted}")


def check_run(config: DictConfig) -> None:
    """A single run's checks, given its config with Hydra's node: the job's, then the files of
    the folder it will run in."""
    _refuse_hydra_launchers(config)
    check_jobs([[]], [config])
    folder = Path(config.hydra.run.dir)
    resume_checkpoint(config, folder)
    check_run_folder(config, folder)


class RunFolder(Callback):
    """A single run's checks and claim, before Hydra makes its folder (Hydra turns a callback's
    exception into a warning, so a refusal ends the process here)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _threads_before_torch(config)
        try:
            check_run(config)
            if is_rank_zero():
                claim_run(config, multirun=False)
        except ConfigError as err:
            refuse(err)


class Sweeper(HydraSweeper):
    """Hydra's basic sweep (the product of the listed values), composed once and checked whole."""

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.context, self.task, self.config = hydra_context, task_function, config

    def sweep(self, arguments: list[str]) -> Any:
        from hydra.core.utils import configure_log, run_job

        _threads_before_torch(self.config)
        _refuse_hydra_launchers(self.config)
        jobs = job_overrides(arguments, self.context.config_loader)
        configs = []
        for overrides in jobs:
            try:
                configs.append(self.context.config_loader.load_sweep_config(self.config, list(overrides)))
            except Exception as err:  # noqa: BLE001 - what Hydra or OmegaConf refused, in one line
                raise ConfigError(f"{compose_error(err)} [job: {' '.join(overrides)}]") from None
        check_jobs(jobs, configs)
        order, repeats = run_order(configs)
        if order != sorted(order):
            print(
                "cocod-train: S-SGD runs first, so each other run's speedup is known when it ends",
                file=sys.stderr,
            )
        if is_rank_zero():
            claim_run(self.config, multirun=True)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        results = []
        for num, n in enumerate(order):
            cfg, job = configs[n], " ".join(jobs[n])
            if n in repeats:
                method = method_of(cfg.strategy)
                why = (
                    "the same config"
                    if method in PERIODIC
                    else f"{method} has no period: tau changes nothing"
                )
                log.info(
                    "job %d (%s) skipped: it is job %d again (%s)", num, job, order.index(repeats[n]), why
                )
                continue
            log.info("#%d : %s", num, job)
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = num
                cfg.hydra.job.override_dirname = fitting_dirname(cfg.hydra.job.override_dirname)
                cfg.run_id = cfg.launcher.run_id = self.config.run_id  # as claimed: a clock reads once
            dirs = {"job_dir_key": "hydra.sweep.dir", "job_subdir_key": "hydra.sweep.subdir"}
            results.append(run_job(hydra_context=self.context, task_function=self.task, config=cfg, **dirs))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        for result in results:
            _ = result.return_value  # a job's exception, raised
        return [results]
