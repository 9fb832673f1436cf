"""cocod-train's one config schema: the keys each node accepts and their types, which OmegaConf
checks while Hydra composes (``max_epochs=abc``, ``hetero.nope=1`` and ``launcher=torchrun
launcher.rate=1gbit`` fail there, before anything runs).

Every field is MISSING: the values and their comments are in conf/ (train.yaml, the launcher
group), one place for each default. Ranges are the constructors' to check (``checks`` builds the
objects once); a Trainer argument the schema lacks is added with ``+trainer.KEY=...``.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


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
    # two are checked against the Trainer's own annotations (``checks``).
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
