"""The import-heavy checks: every ``_target_`` imports and accepts its keys, and the cheap objects
(strategy, datamodule, checkpoint and hetero callbacks, the LightningModule around a stand-in
network) are built once, so their own argument checks run before any process starts. Imports torch
and Lightning (seconds)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lightning_cocod.app.checks import APP_TRAINER_KEYS, ConfigError, bad, first_line
from lightning_cocod.app.identity import world_size
from lightning_cocod.app.schema import few_values_refused

_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def _target_nodes(node: Any, path: str = "") -> list[tuple[str, DictConfig]]:
    found = []
    if isinstance(node, DictConfig):
        if "_target_" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _target_nodes(value, f"{path}.{key}" if path else str(key))
    return found


def check_objects(cfg: DictConfig) -> None:
    """Import every ``_target_``, reject keys its signature lacks, and build the cheap objects."""
    import pytorch_lightning as pl
    from hydra.utils import get_object

    for path, node in _target_nodes(cfg):
        try:
            target = get_object(node._target_)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error here
            raise bad(f"{path}._target_", node._target_, f"an importable class ({first_line(err)})") from None
        _check_signature(path, target, node)
    _check_signature("trainer", pl.Trainer, cfg.trainer, frozenset(APP_TRAINER_KEYS))
    said = few_values_refused(pl.Trainer, cfg.trainer)
    if said:
        raise ConfigError(said)
    _build_cheap_objects(cfg)


def _check_signature(
    path: str, target: Any, node: DictConfig, app_keys: frozenset[str] = frozenset()
) -> None:
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # takes anything; its own checks run when it is built
    accepted = {name for name in params if name != "self"} - app_keys
    extra = sorted(set(node) - accepted - _HYDRA_KEYS)
    if extra:
        name = getattr(target, "__name__", str(target))
        # The model group's keys are ClassifierModule's: a module of one's own starts from none; a
        # datamodule of one's own needs data.batch_size (the global batch), the others can go.
        hint = ""
        if path == "model":
            hint = f"; a module of your own: ~model +model._target_={node._target_}"
        elif path == "data":
            hint = f"; a datamodule of your own takes batch_size (drop the others: ~data.{extra[0]})"
        listed = ", ".join(sorted(accepted))
        raise ConfigError(f"unknown key '{path}.{extra[0]}'; {name} accepts: {listed}{hint}")


def _build_cheap_objects(cfg: DictConfig) -> None:
    from hydra.utils import instantiate
    from torch import nn

    import lightning_cocod  # noqa: F401 - the strategy classes, registered
    from lightning_cocod.launch.netns import parse_rate

    if cfg.launcher.get("rate") is not None:
        try:
            parse_rate(cfg.launcher.rate)
        except (TypeError, ValueError):
            raise bad("launcher.rate", cfg.launcher.rate, "null or a tc rate: '300mbit', '1gbit'") from None
    from lightning_cocod.app.fit import checkpoint_callbacks, hetero_callbacks

    built = {section: _build(section, instantiate, cfg[section]) for section in ("strategy", "data")}
    _build("checkpoint", checkpoint_callbacks, cfg, Path(cfg.out_root), None)
    _build("hetero", hetero_callbacks, cfg)
    _check_batch_fits(cfg, built["data"])
    _check_eval_fits(cfg, built["data"])
    strategy = type(built["strategy"]).__name__
    if cfg.checkpoint.every_n_minutes and not hasattr(built["strategy"], "request_checkpoint"):
        raise bad(
            "checkpoint.every_n_minutes",
            cfg.checkpoint.every_n_minutes,
            f"0 with {strategy}, which cannot checkpoint on request (use every_n_steps)",
        )
    # The real network can be large (VGG16): a one-layer stand-in is enough for the module's checks.
    stand_in = {"net": nn.Linear(1, cfg.dataset.num_classes)} if "net" in cfg.model else {}
    _build("model", instantiate, cfg.model, **stand_in)
    _check_cifar_files(cfg)
    _check_gpus(cfg)


def _build(key: str, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return build(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the constructor's own check, said in one line
        raise ConfigError(f"{key}: {first_line(err.__cause__ or err)}") from None


def _check_batch_fits(cfg: DictConfig, data: Any) -> None:
    samples = getattr(data, "num_train_samples", None)
    workers = world_size(cfg)
    if samples is not None and cfg.data.batch_size * workers > samples:
        raise bad(
            "data.batch_size",
            cfg.data.batch_size,
            f"at most {samples // workers} with {workers} workers (one global batch of batch_size x "
            f"workers must fit in the {samples} training samples)",
        )


def _even_eval(samples: int, workers: int, batch: int) -> bool:
    # The rule of data.sharding.eval_batches: each rank's block must fill as many batches as the
    # largest block needs, or the ranks evaluate different numbers of batches and their
    # sync_dist collectives no longer pair up (a crash after the first epoch).
    return samples // workers >= max(1, math.ceil(math.ceil(samples / workers) / batch))


def _check_eval_fits(cfg: DictConfig, data: Any) -> None:
    samples = getattr(data, "num_eval_samples", None)
    batch = getattr(data, "eval_batch_size", None)
    if not isinstance(samples, int) or not isinstance(batch, int):
        return
    workers = world_size(cfg)
    if not _even_eval(samples, workers, batch):
        # A multiple of workers x batch always qualifies: the search ends.
        near = next(n for n in range(max(samples, workers), samples + workers * batch + 1) if _even_eval(n, workers, batch))
        raise bad(
            "data.num_eval_samples",
            samples,
            f"a count every one of the {workers} workers can split into the same number of eval batches "
            f"of at most {batch} samples, none empty (e.g. {near})",
        )


def _check_gpus(cfg: DictConfig) -> None:
    # Only where this process starts the ranks: under torchrun/srun the visible GPUs are per task.
    if cfg.launcher.name != "gpu":
        return
    import torch

    visible = torch.cuda.device_count()
    if visible < cfg.launcher.devices:
        raise bad("launcher.devices", cfg.launcher.devices, f"at most {visible}, the GPUs this machine shows")


def _check_cifar_files(cfg: DictConfig) -> None:
    if not str(cfg.data._target_).endswith("CIFARDataModule") or cfg.data.get("download", False):
        return
    from lightning_cocod.data.cifar import SPECS

    spec = SPECS[cfg.data.dataset]
    root = Path(cfg.data.root)
    if not (root / spec.archive).is_file() and not (root / spec.folder).is_dir():
        raise bad(
            "data.root",
            str(cfg.data.root),
            f"a folder holding {spec.archive} or {spec.folder}/ (or set data.download=true, or COCOD_DATA)",
        )
