"""Compose and check every job of a command line before Hydra runs the first one.

Hydra alone would report an unknown key in several lines, after ``-m`` had already trained the
jobs before the bad one; a bad value (``strategy.tau=0``) would surface only inside a worker.
Here each job of the sweep is composed with Hydra's compose API, with the same struct mode, and
the first problem becomes one line naming the key and what it accepts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from lightning_cocod.app.checks import APP_TRAINER_KEYS, ConfigError, check_values, first_line, method_of
from lightning_cocod.app.files import check_out_root, resume_checkpoint
from lightning_cocod.app.loggers import to_plain
from lightning_cocod.app.objects import check_objects
from lightning_cocod.app.schema import refused  # registers the schema that train.yaml names
from lightning_cocod.methods import PERIODIC

CONFIG_DIR_ENV = "COCOD_CONFIG_DIR"


def config_dir() -> Path:
    """Where the configs are: $COCOD_CONFIG_DIR when set; the ones installed with the package
    (lightning_cocod/conf in a wheel); else conf/ of the source checkout (an editable install)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    installed = Path(__file__).resolve().parents[1] / "conf"
    checkout = Path(__file__).resolve().parents[2] / "conf"
    path = Path(override) if override else installed if (installed / "train.yaml").is_file() else checkout
    if not (path / "train.yaml").is_file():
        where = f"{CONFIG_DIR_ENV}={override}" if override else "this installation"
        raise ConfigError(
            f"no train.yaml in {path} ({where}): reinstall lightning_cocod, or set {CONFIG_DIR_ENV} to a config folder"
        )
    return path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Hydra's command-line flags (Hydra parses the command line again itself when it runs)."""
    parser = argparse.ArgumentParser(prog="cocod-train", add_help=False)
    parser.add_argument("overrides", nargs="*")
    switches = ("-h --help", "--hydra-help", "--version", "--resolve", "-r --run", "-m --multirun")
    for flags in (*switches, "-sc --shell-completion"):
        parser.add_argument(*flags.split(), action="store_true")
    for flags in ("-c --cfg", "-p --package", "-cp --config-path", "-cn --config-name", "-cd --config-dir"):
        parser.add_argument(*flags.split())
    parser.add_argument("--experimental-rerun")
    parser.add_argument("-i", "--info", nargs="?", const="all")
    return parser.parse_args(list(argv))


def job_overrides(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the command line stands for, in the order of Hydra's basic
    sweeper: the product of the swept values, the first override varying slowest."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ConfigError(f"cannot parse the overrides: {first_line(err)}") from None
    values: dict[str, list[str]] = {}  # a key given twice: the last one counts, as for Hydra
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override() and not override.is_discrete_sweep():
            raise ConfigError(f"{override.input_line}: accepted: a list of values (a,b,c), not a range")
        if override.is_sweep_override():
            values[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
        else:
            values[key] = [f"{key}={override.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*values.values())]


def compose_job(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose one job's config (an initialized compose context is required); ConfigError on failure."""
    from hydra import compose
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    try:
        return compose(config_name, overrides)
    except OverrideParseException as err:
        raise ConfigError(f"cannot parse the overrides {' '.join(overrides)}: {first_line(err)}") from None
    except MissingConfigException as err:
        group, _, option = str(err.missing_cfg_file).rpartition("/")
        accepted = ", ".join(err.options or [])
        raise ConfigError(f"{group}={option} is not an option; accepted: {accepted}") from None
    except HydraException as err:
        cause = err.__cause__
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):  # struct mode refused a key
            raise ConfigError(unknown_key(cause.full_key, cause.parent_node)) from None
        said = refused(cause) if isinstance(cause, OmegaConfBaseException) else None  # a wrong type
        if said:
            raise ConfigError(said) from None
        raise ConfigError(first_line(err) + (f" ({first_line(cause)})" if cause else "")) from None


def unknown_key(key: str, parent: DictConfig | None) -> str:
    """A key that struct mode refused: what its node accepts, and the key the user meant."""
    section, _, name = key.rpartition(".")
    accepted = ", ".join(sorted(k for k in (parent or {}) if k != "hydra"))
    if section == "trainer" and name in APP_TRAINER_KEYS:
        hint = f"; the app sets it from {APP_TRAINER_KEYS[name]}"
    elif key == "strategy.tau":
        hint = "; the period of every method that has one is tau=... (S-SGD and Pipe-SGD ignore it)"
    else:
        hint = f" (+{key}=... adds a key)"
    return f"unknown key '{key}'; {section or 'the top level'} accepts: {accepted}{hint}"


def preflight(argv: Sequence[str]) -> list[DictConfig]:
    """Check every job of ``argv`` (the app's own command line); returns the composed configs.

    Raises ConfigError on the first problem. Command lines that do not run jobs (``--help``,
    ``--cfg``, ``--info``, ...) or that point Hydra at other config folders are left to Hydra: they
    need no data, no checkpoint and no writable output folder.
    """
    from hydra import initialize_config_dir

    args = parse_args(argv)
    leave_to_hydra = (args.help, args.hydra_help, args.version, args.cfg, args.info, args.shell_completion)
    if any((*leave_to_hydra, args.config_path, args.config_dir, args.experimental_rerun)):
        return []
    jobs = job_overrides(args.overrides, args.multirun)
    with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="train"):
        configs = [compose_job(args.config_name or "train", overrides) for overrides in jobs]
    for overrides, cfg in zip(jobs, configs):
        _label(check_values, cfg, overrides, len(jobs))
        _label(lambda c: check_out_root(c.out_root), cfg, overrides, len(jobs))
    if not args.multirun:  # a sweep's job folders are Hydra's to name: each job checks its own
        resume_checkpoint(configs[0], run_dir(configs[0], args.overrides))
        check_run_folder(configs[0], run_dir(configs[0], args.overrides))
    # The import-heavy pass (torch, Lightning) only once every job has passed the cheap one.
    for overrides, cfg in zip(jobs, configs):
        _label(check_objects, cfg, overrides, len(jobs))
    return configs


def check_run_folder(cfg: DictConfig, folder: Path) -> None:
    """The folders of an existing run that it will write to can be written (a read-only
    checkpoints/ would otherwise fail at the first save, an epoch in)."""
    from lightning_cocod._files import unwritable

    saves = cfg.checkpoint.every_n_epochs or cfg.checkpoint.every_n_steps or cfg.checkpoint.every_n_minutes
    for path in (folder, *([folder / "checkpoints"] if saves else [])):
        problem = path.is_dir() and unwritable(path)
        if problem:
            raise ConfigError(
                f"cannot write in {path} ({problem}), where this run writes its "
                f"{'checkpoints' if path.name == 'checkpoints' else 'records'}; accepted: a folder this user "
                "can write (another run_id, or out_root=...)"
            )


def run_dir(cfg: DictConfig, overrides: Sequence[str]) -> Path:
    """The folder of a single run, as Hydra will name it."""
    given = [o.partition("=")[2] for o in overrides if o.startswith("hydra.run.dir=")]
    return Path(given[-1]) if given else Path(cfg.out_root) / cfg.name / cfg.run_id


def duplicate_jobs(configs: Sequence[DictConfig]) -> dict[int, int]:
    """Job number -> the earlier job it repeats: a sweep over ``tau`` runs S-SGD and Pipe-SGD,
    which have no period, once per condition rather than once per value of ``tau``."""
    first: dict[str, int] = {}
    repeats = {}
    for num, cfg in enumerate(configs):
        plain = to_plain(cfg)
        plain.pop("run_id", None)
        plain["launcher"].pop("run_id", None)  # a clock: two jobs may straddle a second
        if method_of(cfg.strategy) not in PERIODIC:
            plain.pop("tau", None)
        key = json.dumps(plain, sort_keys=True, default=str)
        repeats.update({num: first[key]} if key in first else {})
        first.setdefault(key, num)
    return repeats


def ssgd_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with a sweep ``strategy=a,b,ssgd`` moved first and ``ssgd`` first in it, so a sweep
    runs its S-SGD jobs before the others and each other run's speedup is known when it ends."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    argv, args = list(argv), parse_args(argv)
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides) if args.multirun else []
    except HydraException:
        return argv  # preflight says what is wrong with it
    for override in parsed:
        value = override.value() if override.key_or_group == "strategy" and override.package is None else None
        if isinstance(value, ChoiceSweep) and value.simple_form and "ssgd" in value.list:
            first = argv.index(args.overrides[0])
            argv.remove(override.input_line)
            argv.insert(first, "strategy=" + ",".join(["ssgd", *(str(c) for c in value.list if c != "ssgd")]))
            break
    return argv


def _label(check, cfg: DictConfig, overrides: list[str], n_jobs: int) -> None:
    try:
        check(cfg)
    except ConfigError as err:
        if n_jobs > 1:  # say which job of the sweep
            raise ConfigError(f"{err} [job: {' '.join(overrides)}]") from None
        raise
