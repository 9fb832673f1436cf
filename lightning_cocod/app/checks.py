"""Checks on a composed config that need nothing but OmegaConf: ranges, known names, keys that
depend on each other (the types are the schema's, checked as Hydra composes).

The second pass, which imports the ``_target_`` classes, is in ``objects``.
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_cocod._errors import first_line
from lightning_cocod.methods import METHODS, PERIODIC, method_of_class

LAUNCHERS = ("cpu", "gpu", "torchrun", "slurm")  # cpu/gpu start the ranks; torchrun/slurm find them started
# Trainer arguments the app derives from other keys: the key to set instead.
APP_TRAINER_KEYS = {
    "accelerator": "launcher.accelerator",
    "devices": "launcher.devices (ranks per node)",
    "num_nodes": "launcher.num_nodes",
    "strategy": "strategy=... and tau=...",
    "logger": "logger=...",
    "callbacks": "the hetero, checkpoint and progress_every_s keys",
    "default_root_dir": "out_root, name and run_id",
    "enable_checkpointing": "checkpoint.every_n_epochs, every_n_steps and every_n_minutes",
}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.=,+-]+$")


class ConfigError(ValueError):
    """A bad config, said in one line that names the key and what it accepts."""


def bad(key: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is invalid; accepted: {accepted}")


def _positive_int(key: str, value: Any, what: str = "a positive integer") -> None:
    # For the nodes the schema leaves untyped (a group's own keys): bool is an int to Python.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad(key, value, what)


def method_of(strategy: DictConfig) -> str:
    target = str(strategy.get("_target_", ""))
    method = method_of_class(target)
    if method is None:
        classes = ", ".join(m.strategy_class for m in METHODS.values())
        raise bad("strategy._target_", target, f"a class among {classes} (strategy={'|'.join(METHODS)})")
    return method


def check_values(cfg: DictConfig) -> None:
    """The ranges and the keys that depend on each other; the types are the schema's (``schema``)."""
    from lightning_cocod.app.schema import refused

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # a broken interpolation (${oc.env:...} unset, a typo)
        raise ConfigError(refused(err) or f"cannot resolve the config: {first_line(err)}") from None
    for key in ("name", "group", "run_id"):
        # "." and ".." pass the pattern but name no folder of their own: out_root or its parent.
        if not _SAFE_NAME.match(cfg[key]) or cfg[key] in (".", ".."):
            raise bad(
                key,
                cfg[key],
                "a name of letters, digits and _ . = , + - other than . and .. (it names a folder under out_root)",
            )
    if cfg.seed < 0:
        raise bad("seed", cfg.seed, "an integer >= 0")
    if cfg.max_epochs is not None and cfg.max_epochs < 1:
        raise bad("max_epochs", cfg.max_epochs, "null or a positive integer")
    if cfg.max_steps < 1 and cfg.max_steps != -1:
        raise bad("max_steps", cfg.max_steps, "-1 (no limit) or a positive integer")
    if cfg.max_epochs is None and cfg.max_steps == -1:
        raise bad("max_epochs", None, "a positive integer, or set max_steps: without, training never stops")
    if cfg.target_accuracy is not None and not 0 < cfg.target_accuracy <= 1:
        raise bad("target_accuracy", cfg.target_accuracy, "null or a fraction in (0, 1], e.g. 0.93")
    if cfg.step_time_warmup < 1:
        raise bad("step_time_warmup", cfg.step_time_warmup, "a positive integer")
    if cfg.progress_every_s < 0:
        raise bad("progress_every_s", cfg.progress_every_s, "seconds between progress lines, >= 0 (0: none)")
    _positive_int("dataset.num_classes", cfg.dataset.num_classes)
    _positive_int("dataset.in_channels", cfg.dataset.in_channels)
    batch = cfg.data.get("batch_size")
    _positive_int("data.batch_size", batch, "a positive integer (samples per rank per step)")
    if cfg.data.get("eval_batch_size") is not None:
        _positive_int("data.eval_batch_size", cfg.data.eval_batch_size, "null or a positive integer")
    method = method_of(cfg.strategy)
    if cfg.tau != "auto":  # the strategy checks the tau it gets; this one is checked for S-SGD too
        _positive_int(
            "tau",
            cfg.tau,
            "a positive integer (optimizer steps per round of cocod and local_sgd; the other "
            "methods ignore it), or 'auto' (cocod)",
        )
    timeout = cfg.strategy.get("timeout")
    # Below a second gloo's own connect and I/O deadlines expire inside its threads, which abort
    # the process (SIGABRT) instead of raising: a failure that names nothing.
    if "timeout" in cfg.strategy and (not isinstance(timeout, (int, float)) or timeout < 1):
        raise bad("strategy.timeout", timeout, "a number of seconds >= 1 (how long a collective may wait)")
    if cfg.strategy.get("start_method", "popen") != "popen":
        raise bad("strategy.start_method", cfg.strategy.start_method, "'popen' (the ranks exist already)")
    _check_hetero(cfg, method)
    _check_launcher(cfg)
    for key in sorted(APP_TRAINER_KEYS.keys() & set(cfg.trainer)):
        raise ConfigError(f"trainer.{key} is set by the app from {APP_TRAINER_KEYS[key]}; set that instead")


def _check_hetero(cfg: DictConfig, method: str) -> None:
    # every_n_epochs is ProportionalSampling's to check, and the factors' range SimulatedSlowdown's
    # (``objects`` builds both); the counts need the number of workers, known here.
    hetero, workers = cfg.hetero, cfg.launcher.devices * cfg.launcher.num_nodes
    if hetero.batch_sizes is not None:
        sizes, total = list(hetero.batch_sizes), cfg.data.batch_size * workers
        if len(sizes) != workers or min(sizes) < 1 or sum(sizes) != total:
            accepted = f"{workers} positive integers summing to {total} (data.batch_size x workers)"
            raise bad("hetero.batch_sizes", sizes, accepted)
    if (hetero.proportional or hetero.batch_sizes is not None) and method not in PERIODIC:
        accepted = f"false with strategy {method} (it averages uniformly)"
        raise bad("hetero.proportional", hetero.proportional, accepted)
    if hetero.slowdown is not None and len(hetero.slowdown) != workers:
        accepted = f"null or {workers} factors >= 1, one per worker (e.g. [1, 2])"
        raise bad("hetero.slowdown", list(hetero.slowdown), accepted)


def _check_launcher(cfg: DictConfig) -> None:
    launcher = cfg.launcher
    if launcher.name not in LAUNCHERS:  # a launcher config of one's own names one of these
        raise bad("launcher.name", launcher.name, ", ".join(LAUNCHERS))
    if launcher.devices < 1:
        raise bad("launcher.devices", launcher.devices, "a positive integer (ranks per node)")
    if launcher.num_nodes < 1:
        raise bad("launcher.num_nodes", launcher.num_nodes, "a positive integer")
    if launcher.threads_per_worker is not None and launcher.threads_per_worker < 1:
        raise bad("launcher.threads_per_worker", launcher.threads_per_worker, "null or a positive int")
    if launcher.name in ("cpu", "gpu"):
        if launcher.num_nodes != 1:
            accepted = f"1 with launcher={launcher.name}; use launcher=torchrun or slurm"
            raise bad("launcher.num_nodes", launcher.num_nodes, accepted)
        if launcher.timeout_s <= 0:
            raise bad("launcher.timeout_s", launcher.timeout_s, "a positive number of seconds")
    elif cfg.run_id in ("none", ""):
        supplier = "torchrun --rdzv-id" if launcher.name == "torchrun" else "SLURM_JOB_ID"
        accepted = f"an id that every rank shares, for the output folders: run_id=... ({supplier} gives one)"
        raise bad("run_id", cfg.run_id, accepted)
