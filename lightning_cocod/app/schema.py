"""What a config may hold: its one schema, and what Hydra or OmegaConf refused while composing
against it, in one line naming the key and what it accepts.

The schema gives the keys each node accepts and their types, which OmegaConf checks while Hydra
composes (``max_epochs=abc``, ``hetero.nope=1`` and ``launcher=torchrun launcher.rate=1gbit`` fail
there, before anything runs), and ``compose_error`` says their exception in one line. Every field
is MISSING: the values and their comments are in conf/ (train.yaml, the launcher group), one place
for each default; a Trainer argument the schema lacks is added with ``+trainer.KEY=...``. Importing
this module registers the schema and the ``period`` resolver, which every composition needs: the
app's entry point imports it before Hydra composes. The values' checks are ``checks``'.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from lightning_cocod._errors import first_line
from lightning_cocod.app.user_code import adding_hint

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
_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass
class Checkpoint:
    every_n_epochs: int = MISSING
    every_n_steps: int = MISSING
    every_n_minutes: float = MISSING
    resume: str | None = MISSING


@dataclass
class Hetero:
    proportional: bool = MISSING
    batch_sizes: list[int] | None = MISSING
    every_n_epochs: int = MISSING
    slowdown: list[float] | None = MISSING


@dataclass
class Launcher:
    """Every launcher's keys: torchrun and slurm find the ranks started, so they take no more."""

    name: str = MISSING
    accelerator: str = MISSING
    devices: int = MISSING
    num_nodes: int = MISSING
    backend: str | None = MISSING
    threads_per_worker: int | None = MISSING
    run_id: str = MISSING


@dataclass
class LocalLauncher(Launcher):
    """launcher=gpu (and cpu): this command starts the ranks, so it ends them after ``timeout_s``."""

    timeout_s: float = MISSING


@dataclass
class CpuLauncher(LocalLauncher):
    """CPU workers talk gloo over the loopback, which ``rate`` can shape (GPUs on one node talk NCCL)."""

    rate: str | None = MISSING
    topology: str = "loopback"


@dataclass
class Trainer:
    max_epochs: int | None = MISSING
    max_steps: int = MISSING
    # Lightning takes 16 or "bf16-mixed", True or "warn": OmegaConf types no such union, so these
    # two are checked against the Trainer's own annotations (``check``).
    precision: Any = MISSING
    log_every_n_steps: int = MISSING
    check_val_every_n_epoch: int | None = MISSING
    val_check_interval: Any = MISSING  # a fraction of an epoch or a number of batches
    num_sanity_val_steps: int = MISSING
    enable_progress_bar: bool = MISSING
    enable_model_summary: bool = MISSING
    deterministic: Any = MISSING
    benchmark: bool | None = MISSING


@dataclass
class Train:
    name: str = MISSING
    group: str = MISSING
    run_id: str = MISSING
    out_root: str = MISSING
    seed: int = MISSING
    tau: Any = MISSING  # null, a positive integer or "auto": OmegaConf types no union of int and str
    max_epochs: int | None = MISSING
    max_steps: int = MISSING
    target_accuracy: float | None = MISSING
    judged_by: str = MISSING
    step_time_warmup: int = MISSING
    progress_every_s: float = MISSING
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    hetero: Hetero = field(default_factory=Hetero)
    launcher: Launcher = field(default_factory=Launcher)
    trainer: Trainer = field(default_factory=Trainer)
    # The groups' nodes: a _target_ and its arguments (checked against its signature), or the
    # dataset's description.
    strategy: Any = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    data: Any = MISSING
    dataset: Any = MISSING
    logger: Any = MISSING


# train.yaml and the launcher options name these first in their defaults lists.
store = ConfigStore.instance()
store.store(name="train_schema", node=Train)
store.store(name="launcher_schema_local", node=LocalLauncher)
store.store(name="launcher_schema_cpu", node=CpuLauncher)


def _period(default: Any, *, _root_: DictConfig) -> Any:
    """A strategy's ``tau``: the top-level ``tau`` when set, else the method's own default
    (``${period:auto}`` for CoCoD-SGD, ``${period:4}`` for Local-SGD), so one sweep over
    ``tau`` sets every method's period and a run without it gets each method's default."""
    return default if _root_.get("tau") is None else _root_.tau


OmegaConf.register_new_resolver("period", _period, replace=True)


def compose_error(err: Exception) -> str:
    """What Hydra or OmegaConf refused while composing, in one line."""
    from hydra.errors import MissingConfigException

    cause = err if isinstance(err, OmegaConfBaseException) else err.__cause__
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={option} is not an option; accepted: {', '.join(err.options or [])}"
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:  # struct mode
        return unknown_key(cause.full_key, cause.parent_node)
    if isinstance(cause, ValidationError) and cause.full_key and cause.parent_node is not None:
        parent = cause.parent_node
        if isinstance(parent, ListConfig):
            kind = parent._metadata.element_type
        else:
            kind = typing.get_type_hints(OmegaConf.get_type(parent) or dict).get(str(cause.key))
        if kind is not None:
            return f"{cause.full_key}={cause.value!r} is invalid; accepted: {_words(kind)}"
    return first_line(err) + (f" ({first_line(cause)})" if cause is not None and cause is not err else "")


def _words(kind: Any) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is list:
        return "a list of " + {int: "integers", float: "numbers"}.get(args[0], "values")
    if type(None) in typing.get_args(kind):
        return _words(args[0]) + " or null"
    return _WORDS.get(kind, str(kind))


def unknown_key(key: str, parent: Any) -> str:
    """A key that struct mode refused: what its node accepts, and the key the user meant."""
    section, _, name = key.rpartition(".")
    accepted = ", ".join(sorted(k for k in (parent or {}) if k != "hydra"))
    if section == "trainer" and name in APP_TRAINER_KEYS:
        hint = f"; the app sets it from {APP_TRAINER_KEYS[name]}"
    elif key == "strategy.tau":
        hint = "; the period of every method that has one is tau=... (S-SGD and Pipe-SGD ignore it)"
    else:
        hint = adding_hint(key, parent)
    return f"unknown key '{key}'; {section or 'the top level'} accepts: {accepted}{hint}"
