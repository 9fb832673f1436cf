"""Compose and check every job of a command line before Hydra runs the first one.

Hydra alone would report an unknown key in several lines, after ``-m`` had already trained the
jobs before the bad one; a bad value (``strategy.tau=0``) would surface only inside a worker.
Here each job of the sweep is composed with Hydra's compose API, with the same struct mode, and
the first problem becomes one line naming the key and what it accepts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lightning_cocod.app.checks import PERIODIC, ConfigError, check_values, method_of
from lightning_cocod.app.files import check_out_root, resume_checkpoint
from lightning_cocod.app.objects import check_objects

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


def job_overrides(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the command line stands for, in Hydra's launch order."""
    if not multirun:
        return [list(overrides)]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ConfigError(f"cannot parse the overrides: {str(err).strip().splitlines()[0]}") from None
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def compose_job(conf: Path, config_name: str, overrides: list[str]) -> DictConfig:
    """Compose one job's config (an initialized compose context is required); ConfigError on failure."""
    from hydra import compose
    from hydra.errors import HydraException, OverrideParseException

    try:
        return compose(config_name, overrides)
    except OverrideParseException as err:
        raise ConfigError(
            f"cannot parse the overrides {' '.join(overrides)}: {str(err).strip().splitlines()[0]}"
        ) from None
    except HydraException as err:
        raise ConfigError(explain(err, conf, config_name, overrides)) from None


def explain(err: Exception, conf: Path, config_name: str, overrides: list[str]) -> str:
    from hydra import compose

    text = str(err)
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing:
        group, option = missing.groups()
        options = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        return f"{group}={option} is not an option; accepted: {', '.join(options)}"
    unknown = re.match(r"Could not override '([^']+)'", text)
    if unknown and "not in struct" in str(err.__cause__):
        key = unknown.group(1)
        parent = key.rpartition(".")[0]
        others = [o for o in overrides if o.lstrip("+~").partition("=")[0] != key]
        try:
            node = compose(config_name, others)
            for part in filter(None, parent.split(".")):
                node = node[part]
            accepted = ", ".join(sorted(map(str, node)))
        except Exception:  # noqa: BLE001 - the listing is a courtesy; the key is what matters
            accepted = "see conf/"
        hint = (
            "; the period of every method that has one is tau=... (S-SGD and Pipe-SGD ignore it)"
            if key == "strategy.tau"
            else f" (+{key}=... adds a key)"
        )
        return f"unknown key '{key}'; {parent or 'the top level'} accepts: {accepted}{hint}"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    cause = (
        f" ({str(err.__cause__).strip().splitlines()[0]})"
        if err.__cause__ and str(err.__cause__).strip()
        else ""
    )
    return first + cause


def preflight(argv: Sequence[str]) -> list[DictConfig]:
    """Check every job of ``argv`` (the app's own command line); returns the composed configs.

    Raises ConfigError on the first problem. Command lines that do not run jobs (``--help``,
    ``--cfg``, ``--info``, ...) or that point Hydra at other config folders are left to Hydra: they
    need no data, no checkpoint and no writable output folder.
    """
    from hydra import initialize_config_dir
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    if any(
        (
            args.help,
            args.hydra_help,
            args.cfg,
            args.info,
            args.shell_completion,
            args.config_path,
            args.config_dir,
            args.experimental_rerun,
        )
    ):
        return []
    conf = config_dir()
    config_name = args.config_name or "train"
    jobs = job_overrides(args.overrides, args.multirun)
    with initialize_config_dir(str(conf), version_base="1.3", job_name="train"):
        configs = [compose_job(conf, config_name, overrides) for overrides in jobs]
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
        plain = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(plain, dict)
        plain.pop("run_id", None)
        plain["launcher"].pop("run_id", None)  # a clock: two jobs may straddle a second
        if method_of(cfg.strategy) not in PERIODIC:
            plain.pop("tau", None)
        key = json.dumps(plain, sort_keys=True, default=str)
        if key in first:
            repeats[num] = first[key]
        else:
            first[key] = num
    return repeats


def ssgd_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with a sweep over ``strategy`` moved first and ``ssgd`` first in it, so a sweep
    runs its S-SGD jobs before the others and each other run's speedup is known when it ends."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import HydraException

    argv = list(argv)
    args = get_args_parser().parse_args(argv)
    if not args.multirun or not args.overrides:
        return argv
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
    except HydraException:
        return argv  # preflight says what is wrong with it
    for override in parsed:
        value = override.value() if override.key_or_group == "strategy" and override.package is None else None
        simple = isinstance(value, ChoiceSweep) and value.simple_form and override.input_line in argv
        if simple and "ssgd" in value.list:
            choices = ["ssgd", *(c for c in value.list if c != "ssgd")]
            first = argv.index(args.overrides[0])
            argv.remove(override.input_line)
            argv.insert(first, "strategy=" + ",".join(map(str, choices)))
            break
    return argv


def _label(check, cfg: DictConfig, overrides: list[str], n_jobs: int) -> None:
    try:
        check(cfg)
    except ConfigError as err:
        if n_jobs > 1:  # say which job of the sweep
            raise ConfigError(f"{err} [job: {' '.join(overrides)}]") from None
        raise
