"""What is wrong with a composed config, in one line naming the key and what it accepts.

The keys and their types are the schema's (``schema``), which OmegaConf checks while Hydra
composes. Ranges are the constructors': ``check`` builds the strategy, datamodule, callbacks and
the model around a stand-in network once, and says the first one's error as ``<key>: <its
message>``. What remains here is what no constructor can know: names that become folders, the
arithmetic of the world size (a global batch, an epoch's batches on each rank), whether the model
fits the data, the files.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_cocod._errors import ConfigError, bad, first_line
from lightning_cocod._files import unwritable
from lightning_cocod.app.schema import APP_TRAINER_KEYS, compose_error
from lightning_cocod.app.speedup import GOALS
from lightning_cocod.app.user_code import (
    HYDRA_KEYS,
    arguments_of,
    check_module,
    check_own_batch,
    data_node,
    own_data,
)
from lightning_cocod.methods import METHODS, PERIODIC, method_of_class

LAUNCHERS = ("cpu", "gpu", "torchrun", "slurm")  # cpu/gpu start the ranks; torchrun/slurm find them started
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.=,+-]+$")


def method_of(strategy: DictConfig) -> str:
    method = method_of_class(str(strategy.get("_target_", "")))
    if method is None:
        classes = ", ".join(m.strategy_class for m in METHODS.values())
        accepted = f"a class among {classes} (strategy={'|'.join(METHODS)})"
        raise bad("strategy._target_", strategy.get("_target_"), accepted)
    return method


def check(cfg: DictConfig) -> None:
    """Every check of a composed job config (without its ``hydra`` node); ConfigError on the first."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # a broken interpolation (${oc.env:...} unset, a typo)
        raise ConfigError(f"cannot resolve the config: {compose_error(err)}") from None
    for key in ("name", "group", "run_id"):
        # "." and ".." pass the pattern but name no folder of their own: out_root or its parent.
        if not _SAFE_NAME.match(cfg[key]) or cfg[key] in (".", ".."):
            accepted = "a name of letters, digits and _ . = , + - other than . and .. (it names a folder"
            raise bad(key, cfg[key], f"{accepted} under out_root)")
    # seed_everything seeds numpy too, whose seeds are 32-bit unsigned: outside them every worker
    # dies once it has started, instead of here.
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < 2**32:
        raise bad("seed", cfg.seed, f"an integer from 0 to {2**32 - 1}")
    # Zero is no bound the Trainer refuses: it trains nothing and writes the record of a finished run.
    if cfg.max_steps != -1 and not _positive_int(cfg.max_steps):
        raise bad("max_steps", cfg.max_steps, "a positive integer, or -1 (bounded by max_epochs alone)")
    if cfg.max_epochs is not None and not _positive_int(cfg.max_epochs):
        raise bad("max_epochs", cfg.max_epochs, "a positive integer, or null (bounded by max_steps alone)")
    if cfg.max_epochs is None and cfg.max_steps == -1:
        raise bad("max_epochs", None, "a positive integer, or set max_steps: without, training never stops")
    if cfg.target_accuracy is not None and not 0 < cfg.target_accuracy <= 1:
        raise bad("target_accuracy", cfg.target_accuracy, "null or a fraction in (0, 1], e.g. 0.93")
    if cfg.judged_by not in GOALS:
        raise bad("judged_by", cfg.judged_by, " or ".join(GOALS))
    interval = cfg.trainer.val_check_interval
    if not (_positive_int(interval) or (isinstance(interval, float) and 0 < interval <= 1)):
        accepted = (
            "a fraction of an epoch in (0, 1] (0.25: four validations an epoch) or a number of batches >= 1"
        )
        raise bad("trainer.val_check_interval", interval, accepted)
    # Without epochs to count in, a fraction of one means nothing: the Trainer refuses it as every
    # worker builds its own, after the workers have started.
    if isinstance(interval, float) and cfg.trainer.check_val_every_n_epoch is None:
        accepted = (
            "a number of batches >= 1 (counted over the whole run) with trainer.check_val_every_n_epoch=null; "
            "a fraction of an epoch needs check_val_every_n_epoch, e.g. 1"
        )
        raise bad("trainer.val_check_interval", interval, accepted)
    if cfg.progress_every_s < 0:
        raise bad("progress_every_s", cfg.progress_every_s, "seconds between progress lines, >= 0 (0: none)")
    method = method_of(cfg.strategy)
    if cfg.tau not in (None, "auto") and not _positive_int(
        cfg.tau
    ):  # checked for S-SGD too, which ignores it
        accepted = f"optimizer steps per round of {', '.join(PERIODIC)}; the other methods ignore it"
        raise bad(
            "tau",
            cfg.tau,
            f"null (each method's default), a positive integer ({accepted}), or 'auto' (cocod)",
        )
    timeout = cfg.strategy.get("timeout")
    # Below a second gloo's own connect and I/O deadlines expire inside its threads, which abort
    # the process (SIGABRT) instead of raising: a failure that names nothing.
    if "timeout" in cfg.strategy and (not isinstance(timeout, (int, float)) or timeout < 1):
        raise bad("strategy.timeout", timeout, "a number of seconds >= 1 (how long a collective may wait)")
    if cfg.strategy.get("start_method", "popen") != "popen":
        raise bad("strategy.start_method", cfg.strategy.start_method, "'popen' (the ranks exist already)")
    for key in sorted(APP_TRAINER_KEYS.keys() & set(cfg.trainer)):
        raise ConfigError(f"trainer.{key} is set by the app from {APP_TRAINER_KEYS[key]}; set that instead")
    _check_launcher(cfg)
    _check_world(cfg, method)
    _check_out_root(cfg.out_root)
    _check_objects(cfg)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1  # bool is an int to Python


def _check_out_root(out_root: Any) -> None:
    """``out_root`` can be made and written: its nearest existing folder is probed."""
    existing = Path(out_root).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    problem = f"{existing} is a file" if not existing.is_dir() else unwritable(existing)
    if not out_root or problem:
        raise bad("out_root", out_root, f"a folder this user can write ({problem or 'the path of one'})")


def _check_launcher(cfg: DictConfig) -> None:
    launcher = cfg.launcher
    if launcher.name not in LAUNCHERS:  # a launcher config of one's own names one of these
        raise bad("launcher.name", launcher.name, ", ".join(LAUNCHERS))
    if launcher.name in ("cpu", "gpu") and launcher.num_nodes != 1:
        raise bad(
            "launcher.num_nodes",
            launcher.num_nodes,
            f"1 with launcher={launcher.name}; use launcher=torchrun or slurm",
        )
    if launcher.name in ("cpu", "gpu") and launcher.timeout_s <= 0:
        raise bad("launcher.timeout_s", launcher.timeout_s, "a positive number of seconds")
    if launcher.name in ("torchrun", "slurm") and cfg.run_id in ("none", ""):
        supplier = "torchrun --rdzv-id" if launcher.name == "torchrun" else "SLURM_JOB_ID"
        accepted = f"an id that every rank shares, for the output folders: run_id=... ({supplier} gives one)"
        raise bad("run_id", cfg.run_id, accepted)
    if launcher.get("rate") is not None:
        from lightning_cocod.launch.netns import parse_rate

        try:
            parse_rate(launcher.rate)
        except (TypeError, ValueError):
            raise bad("launcher.rate", launcher.rate, "null or a tc rate: '300mbit', '1gbit'") from None
    from lightning_cocod.launch.cluster import TOPOLOGIES

    if launcher.get("topology", "loopback") not in TOPOLOGIES:
        raise bad("launcher.topology", launcher.topology, " or ".join(TOPOLOGIES))
    if launcher.name == "gpu":  # where this process starts the ranks (under torchrun/srun: per task)
        import torch

        visible = torch.cuda.device_count()
        if visible < launcher.devices:
            raise bad("launcher.devices", launcher.devices, f"at most {visible}, the GPUs this machine shows")


def _check_world(cfg: DictConfig, method: str) -> None:
    """The counts that depend on the number of workers, which no constructor is told."""
    for key in ("launcher.devices", "launcher.num_nodes", "data.batch_size"):
        if not _positive_int(OmegaConf.select(cfg, key)):
            raise bad(key, OmegaConf.select(cfg, key), "a positive integer")
    hetero, workers = cfg.hetero, cfg.launcher.devices * cfg.launcher.num_nodes
    if hetero.batch_sizes is not None:
        sizes, total = list(hetero.batch_sizes), cfg.data.batch_size * workers
        if len(sizes) != workers or min(sizes) < 1 or sum(sizes) != total:
            accepted = f"{workers} positive integers summing to {total} (data.batch_size x workers)"
            raise bad("hetero.batch_sizes", sizes, accepted)
    if (hetero.proportional or hetero.batch_sizes is not None) and method not in PERIODIC:
        raise bad(
            "hetero.proportional",
            hetero.proportional,
            f"false with strategy {method} (it averages uniformly)",
        )
    if hetero.slowdown is not None and len(hetero.slowdown) != workers:
        accepted = f"null or {workers} factors >= 1, one per worker (e.g. [1, 2])"
        raise bad("hetero.slowdown", list(hetero.slowdown), accepted)


def _target_nodes(node: Any, path: str = "") -> list[tuple[str, DictConfig]]:
    found = []
    if isinstance(node, DictConfig):
        found += [(path, node)] if "_target_" in node else []
        for key, value in node.items():
            found += _target_nodes(value, f"{path}.{key}" if path else str(key))
    return found


def _check_objects(cfg: DictConfig) -> None:
    """Every ``_target_`` imports and takes its keys; the cheap objects are built once, so their
    own checks run; the data holds a global batch and splits evenly for evaluation."""
    import pytorch_lightning as pl
    from hydra.utils import get_object, instantiate
    from torch import nn

    from lightning_cocod.app.callbacks import CALLBACKS

    for path, node in [*_target_nodes(cfg), ("trainer", cfg.trainer)]:
        try:
            target = pl.Trainer if path == "trainer" else get_object(node._target_)
        except Exception as err:  # noqa: BLE001 - any import failure is a config error here
            raise bad(f"{path}._target_", node._target_, f"an importable class ({first_line(err)})") from None
        _check_signature(path, target, node)
    _check_few_values(typing.get_type_hints(pl.Trainer.__init__), cfg.trainer)
    built = {key: _build(key, instantiate, data_node(cfg[key])) for key in ("strategy", "data")}
    for key, callbacks in CALLBACKS.items():
        _build(key, callbacks, cfg, Path(cfg.out_root), None, "a title")
    if cfg.checkpoint.every_n_minutes and not hasattr(built["strategy"], "request_checkpoint"):
        accepted = f"0 with {type(built['strategy']).__name__}, which cannot checkpoint on request"
        raise bad(
            "checkpoint.every_n_minutes", cfg.checkpoint.every_n_minutes, f"{accepted} (use every_n_steps)"
        )
    # The real network can be large (VGG16): a one-layer stand-in is enough for the module's checks.
    stand_in = {"net": nn.Linear(1, cfg.dataset.num_classes)} if "net" in cfg.model else {}
    model = _build("model", instantiate, cfg.model, **stand_in)
    check_module(cfg.model._target_, model)
    _check_model_data(cfg, model, built["data"])
    _check_data(cfg, built["data"])
    check_own_batch(cfg, built["data"])


def _check_signature(path: str, target: Any, node: DictConfig) -> None:
    if path == "data" and own_data(node):
        return  # built from the keys it names (user_code.data_node); check_own_data checks the rest
    accepted = arguments_of(target)
    if accepted is None:
        return  # takes anything; its own checks run when it is built
    accepted -= set(APP_TRAINER_KEYS) if path == "trainer" else set()
    extra = sorted(set(node) - accepted - HYDRA_KEYS)
    if extra:
        hint = ""
        if path == "model" and set(extra) & _package_model_keys():
            # Only the target replaced: the model group's keys are the package's module's.
            hint = f"; a module of your own: ~model +model._target_={node._target_}"
        elif path == "model" and node[extra[0]] is not None:  # Hydra deletes no key whose value is null
            hint = f" (drop it: ~model.{extra[0]})"
        elif path == "model":
            hint = f" (take model.{extra[0]} off the command line)"
        name = getattr(target, "__name__", str(target))
        raise ConfigError(
            f"unknown key '{path}.{extra[0]}'; {name} accepts: {', '.join(sorted(accepted))}{hint}"
        )


def _package_model_keys() -> set[str]:
    """The keys of the model group's options (ClassifierModule's); a module of one's own starts from none."""
    from lightning_cocod.models import ClassifierModule

    return set(inspect.signature(ClassifierModule).parameters)


def _few_values(kind: Any) -> list[Any] | None:
    """The values an annotation allows when they are few (Literals, bool, None), else None."""
    if kind in (bool, type(None)):
        return [True, False] if kind is bool else [None]
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    if typing.get_origin(kind) in (Union, types.UnionType):
        parts = [_few_values(a) for a in typing.get_args(kind)]
        return None if None in parts else [v for part in parts for v in part]
    return None


def _check_few_values(hints: dict[str, Any], node: DictConfig) -> None:
    """The Trainer arguments that take one of a few values (precision, deterministic, and those
    added with +trainer.KEY), which OmegaConf cannot type and the Trainer checks only as it fits."""
    for key, value in node.items():
        values = _few_values(hints.get(key))
        # type() too: True == 1 and 16 == 16.0, but neither is a precision Lightning knows.
        if values is not None and not any(value == v and type(value) is type(v) for v in values):
            words = (
                "null" if v is None else str(v).lower() if isinstance(v, bool) else repr(v) for v in values
            )
            raise bad(f"trainer.{key}", value, f"one of {', '.join(words)}")


def _build(key: str, build: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return build(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the constructor's own check, said in one line
        raise ConfigError(f"{key}: {first_line(err.__cause__ or err)}") from None


def _even_eval(samples: int, workers: int, batch: int) -> bool:
    # The rule of data.sharding.eval_batches: each rank's block must fill as many batches as the
    # largest block needs, or the ranks evaluate different numbers of batches and their
    # sync_dist collectives no longer pair up (a crash after the first epoch).
    return samples // workers >= max(1, math.ceil(math.ceil(samples / workers) / batch))


def _check_model_data(cfg: DictConfig, model: Any, data: Any) -> None:
    """The package's GPT against its data: token ids its embedding holds, in blocks its positions
    cover. Otherwise each worker fails at its first batch (an IndexError in the embedding, a block
    longer than the positions, an embedding of float images)."""
    from lightning_cocod.models.gpt import GPTModule

    if not isinstance(model, GPTModule):
        return
    vocab, length = getattr(data, "vocab_size", None), getattr(data, "block_size", None)
    if vocab is None or length is None:
        if own_data(cfg.data):
            return  # a module of the user's own that does not say its vocabulary: its batches tell
        accepted = (
            f"token data for {type(model).__name__} (model=gpt): data=markov, or a module of your own; "
            f"{type(data).__name__} gives no token ids"
        )
        raise bad("data._target_", cfg.data._target_, accepted)
    if model.net.tok.num_embeddings < vocab:
        accepted = f"at least {vocab}, the data's vocabulary (data.vocab_size, which the default follows)"
        raise bad("model.vocab_size", model.net.tok.num_embeddings, accepted)
    if model.net.block_size < length:  # a shorter block is fine: its positions are a prefix
        accepted = f"at least {length}, the data's block length (data.block_size, which the default follows)"
        raise bad("model.block_size", model.net.block_size, accepted)


def _train_batches(cfg: DictConfig, samples: int, workers: int) -> int:
    """The training batches of an epoch on each rank: the sharded sampler's whole global batches,
    within the Trainer's limit_train_batches (its rule: a count, or a fraction rounded down)."""
    batches = samples // (cfg.data.batch_size * workers)
    limit = cfg.trainer.get("limit_train_batches")
    if isinstance(limit, float):
        return int(batches * limit)
    return batches if limit is None else min(batches, limit)


def _check_data(cfg: DictConfig, data: Any) -> None:
    from lightning_cocod.data.base import InMemoryDataModule

    workers = cfg.launcher.devices * cfg.launcher.num_nodes
    samples = getattr(data, "num_train_samples", None)
    if samples is not None and cfg.data.batch_size * workers > samples:
        accepted = (
            f"at most {samples // workers} with {workers} workers (one global batch of batch_size x "
            f"workers must fit in the {samples} training samples)"
        )
        raise bad("data.batch_size", cfg.data.batch_size, accepted)
    # The Trainer refuses a validation interval longer than an epoch as each worker's first epoch
    # starts, when epochs are what it validates in. The package's modules' epochs are known here.
    interval = cfg.trainer.val_check_interval
    if (
        isinstance(data, InMemoryDataModule)
        and samples is not None
        and _positive_int(interval)
        and cfg.trainer.check_val_every_n_epoch is not None
        and cfg.trainer.get("limit_val_batches", 1.0) != 0
    ):
        batches = _train_batches(cfg, samples, workers)
        if interval > batches:
            accepted = (
                f"at most {batches}, the training batches of an epoch on each of the {workers} workers "
                f"({samples} samples in global batches of {cfg.data.batch_size} x {workers}), a fraction "
                "of an epoch in (0, 1], or a count over the whole run with trainer.check_val_every_n_epoch=null"
            )
            raise bad("trainer.val_check_interval", interval, accepted)
    samples, batch = getattr(data, "num_eval_samples", None), getattr(data, "eval_batch_size", None)
    if isinstance(samples, int) and isinstance(batch, int) and not _even_eval(samples, workers, batch):
        # A multiple of workers x batch always qualifies: the search ends.
        near = next(
            n
            for n in range(max(samples, workers), samples + workers * batch + 1)
            if _even_eval(n, workers, batch)
        )
        accepted = (
            f"a count every one of the {workers} workers can split into the same number of eval batches "
            f"of at most {batch} samples, none empty (e.g. {near})"
        )
        raise bad("data.num_eval_samples", samples, accepted)
    if str(cfg.data._target_).endswith("CIFARDataModule") and not cfg.data.get("download", False):
        from lightning_cocod.data.cifar import SPECS

        spec, root = SPECS[cfg.data.dataset], Path(cfg.data.root)
        if not (root / spec.archive).is_file() and not (root / spec.folder).is_dir():
            accepted = f"a folder holding {spec.archive} or {spec.folder}/"
            raise bad(
                "data.root", str(cfg.data.root), f"{accepted} (or set data.download=true, or COCOD_DATA)"
            )
