"""cocod-train's config schema: the keys each node accepts and their types, checked by OmegaConf
while Hydra composes (``max_epochs=abc``, ``hetero.nope=1`` and ``launcher=torchrun
launcher.rate=1gbit`` fail there, before anything runs).

Every field is MISSING: the values and their comments are in conf/ (train.yaml, the launcher
group), one place for each default. The ranges of the values are checked by the objects they
configure (the strategies, data modules, callbacks) and by ``checks``; the nodes that build a
``_target_`` (strategy, model, optimizer, data, logger) are checked against its signature
(``objects``). A Trainer argument the schema lacks is added with ``+trainer.KEY=...``.
"""

import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError


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


@dataclass
class Trainer:
    max_epochs: int | None = MISSING
    max_steps: int = MISSING
    # Lightning takes 16 or "bf16-mixed", True or "warn": OmegaConf types no such union, so these
    # two are checked against the Trainer's own annotations (``few_values_refused``).
    precision: Any = MISSING
    log_every_n_steps: int = MISSING
    check_val_every_n_epoch: int | None = MISSING
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
    tau: Any = MISSING  # a positive integer or "auto": OmegaConf types no union of int and str
    max_epochs: int | None = MISSING
    max_steps: int = MISSING
    target_accuracy: float | None = MISSING
    step_time_warmup: int = MISSING
    progress_every_s: float = MISSING
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    hetero: Hetero = field(default_factory=Hetero)
    launcher: Launcher = field(default_factory=Launcher)
    trainer: Trainer = field(default_factory=Trainer)
    # The groups' nodes: a _target_ and its arguments, or the dataset's description.
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

_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _words(annotation: Any) -> str:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, types.UnionType) and len(args) == 1:
        return _words(args[0]) + " or null"
    if get_origin(annotation) is list:
        return "a list of " + {int: "integers", float: "numbers"}.get(args[0] if args else None, "values")
    return _WORDS.get(annotation, str(annotation))


def refused(err: OmegaConfBaseException) -> str | None:
    """A value of the wrong type, said as ``key=value is invalid; accepted: ...``; None for other errors."""
    if not isinstance(err, ValidationError) or not err.full_key:
        return None
    parent, key = err.parent_node, err.key
    owner = OmegaConf.get_type(parent) if parent is not None else None
    hints = typing.get_type_hints(owner) if owner is not None and owner is not dict else {}
    if isinstance(key, str) and key in hints:
        accepted = _words(hints[key])
    elif OmegaConf.is_list(parent):  # an element of a typed list
        accepted = _words(parent._metadata.element_type)
    else:
        return None
    return f"{err.full_key}={err.value!r} is invalid; accepted: {accepted}"


def _few_values(annotation: Any) -> list[Any] | None:
    """The values an annotation allows when they are few (Literals, bool, None), else None."""
    if annotation in (bool, type(None)):
        return [True, False] if annotation is bool else [None]
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        parts = [_few_values(a) for a in get_args(annotation)]
        return None if None in parts else [v for part in parts for v in part]
    return None


def few_values_refused(trainer_class: type, node: DictConfig) -> str | None:
    """The Trainer arguments that take one of a few values (precision, deterministic, and those
    added with +trainer.KEY), which OmegaConf cannot type: the first value that is none of them."""
    hints = typing.get_type_hints(trainer_class.__init__)
    for key, value in node.items():
        values = _few_values(hints.get(key))
        # type() too: True == 1 and 16 == 16.0, but neither is a precision Lightning knows.
        if values is not None and not any(value == v and type(value) is type(v) for v in values):
            words = ("null" if v is None else str(v).lower() if isinstance(v, bool) else repr(v)
                     for v in values)
            return f"trainer.{key}={value!r} is invalid; accepted: one of {', '.join(words)}"
    return None
