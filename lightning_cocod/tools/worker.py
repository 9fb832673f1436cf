"""One rank of a comparison run, started by ``lightning_cocod.launch.launch_workers``.

``python -m lightning_cocod.tools.worker '<spec json>'`` trains one method through a real Lightning
``Trainer`` and writes what the demo and the benchmark need: step end times, accuracy against
wall time, the strategy's communication figures, peak memory. The method "bound" is the
compute-only bound: the same steps on a single-process Trainer with no process group at all.

``spec["accelerator"]`` is "cpu" (default: gloo) or "gpu": with a GPU per rank, rank i trains on
cuda:i over NCCL; with fewer GPUs than ranks every rank shares cuda:0 over gloo on CUDA tensors
(NCCL refuses two ranks on one device). The bound then runs on the same device(s). The result's
``placement`` says which. ``precision`` and ``channels_last`` pass to the Trainer and the model.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch

import lightning_cocod
from lightning_cocod import methods
from lightning_cocod.callbacks import (
    AccuracyTimeline,
    ProgressLine,
    ProportionalSampling,
    SimulatedSlowdown,
    StepTimer,
)
from lightning_cocod.data import DigitsDataModule, SyntheticDataModule
from lightning_cocod.launch import rank_and_world_size, write_result
from lightning_cocod.models import ClassifierModule, build_model
from lightning_cocod.tools.compare import BOUND
from lightning_cocod.trainer import build_trainer

_DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")


def make_strategy(
    method: str,
    tau: int | str,
    backend: str | None = None,
    tau_max: int | None = None,
    compression: str | None = None,
    comm_hook: str | None = None,
    powersgd_rank: int | None = None,
    overlap: int | None = None,
) -> Any:
    """The table entry's strategy class; "bound" is a single-process Trainer's own ("auto").
    ``backend`` None keeps each strategy's default (gloo on CPU, NCCL on GPU); ``tau_max`` None
    keeps CoCoDStrategy's default bound of tau="auto" (``SAFE_TAU_MAX``); CoCoDStrategy itself
    refuses one with a fixed tau, the other strategies would drop it silently, as they would
    ``compression`` (periodic methods' rounds), ``overlap`` (the outer round's, ``OVERLAPPED``)
    and ``comm_hook`` / ``powersgd_rank`` (S-SGD's DDP hooks): each is refused here for a method
    that takes none."""
    if method == BOUND:
        return "auto"
    entry = methods.method(method)
    if tau_max is not None and not entry.adaptive:
        raise ValueError(f"tau_max={tau_max!r} bounds tau='auto' only; {method!r} takes none")
    if compression is not None and not entry.periodic:
        raise ValueError(
            f"compression={compression!r} compresses rounds of {', '.join(methods.PERIODIC)} only; "
            f"{method!r} has none (S-SGD: comm_hook)"
        )
    if overlap is not None and method not in methods.OVERLAPPED:
        raise ValueError(
            f"overlap={overlap!r} overlaps rounds of {', '.join(methods.OVERLAPPED)} only; {method!r} takes none"
        )
    if (comm_hook is not None or powersgd_rank is not None) and method != "ssgd":
        raise ValueError(f"comm_hook={comm_hook!r} is a DDP hook of ssgd only; {method!r} takes none")
    options = {
        "process_group_backend": backend,
        "tau": tau if entry.periodic else None,
        "tau_max": tau_max,
        "compression": compression,
        "comm_hook": comm_hook,
        "powersgd_rank": powersgd_rank,
        "overlap": overlap,
    }
    strategy_class = getattr(lightning_cocod, entry.strategy_class)
    return strategy_class(**{key: value for key, value in options.items() if value is not None})


def check_accelerator(accelerator: str, gpus: int) -> None:
    """ValueError unless ``accelerator`` is "cpu", or "gpu" with ``gpus`` CUDA devices to use."""
    if accelerator not in ("cpu", "gpu"):
        raise ValueError(f"accelerator={accelerator!r} is not understood; accepted: 'cpu', 'gpu'")
    if accelerator == "gpu" and gpus < 1:
        raise ValueError(
            "accelerator='gpu' but torch sees no CUDA device; accepted: 'cpu', or 'gpu' on a machine with one"
        )


def placement(
    accelerator: str, method: str, world_size: int, rank: int, gpus: int, one_device: bool = False
) -> dict:
    """Where one rank trains: the Trainer's device arguments, the environment they need, and a
    record of the choice (``devices``, ``backend``, ``ranks_per_device``).

    Ranks that share one device are each a "node" of one device (``num_nodes=world_size``,
    ``NODE_RANK=rank``, ``LOCAL_RANK=0``): that is how Lightning's environment puts every rank on
    device 0, where ``devices=world_size`` would ask for one device per rank. ``one_device``
    forces that layout even with a device per rank (the 2-ranks-on-one-GPU comparison).
    """
    check_accelerator(accelerator, gpus)
    distributed = method != BOUND and world_size > 1
    shared = one_device or accelerator == "cpu" or gpus < world_size
    gpu_devices = ["cuda:0"] if shared else [f"cuda:{r}" for r in range(world_size)]
    record = {
        "accelerator": accelerator,
        "devices": ["cpu"] if accelerator == "cpu" else gpu_devices,
        "backend": ("gloo" if shared else "nccl") if distributed else None,
        "ranks_per_device": world_size if distributed and shared else 1,
    }
    nodes = distributed and (one_device or (shared and accelerator == "gpu"))
    if not distributed:  # the bound: this rank alone, on the device it would train on
        devices = [0 if shared else rank] if accelerator == "gpu" else 1
    else:
        devices = 1 if nodes else world_size
    trainer = {"accelerator": accelerator, "devices": devices, "num_nodes": world_size if nodes else 1}
    env = {"LOCAL_RANK": "0", "NODE_RANK": str(rank)} if nodes else {}
    return {"trainer": trainer, "env": env, "record": record}


def describe_placement(record: dict) -> str:
    """One line for a benchmark's header, e.g. "2 ranks share cuda:0 (gloo on CUDA tensors)"."""
    if record["accelerator"] == "cpu":
        return "CPU workers (gloo)"
    if record["ranks_per_device"] > 1:
        return (
            f"{record['ranks_per_device']} ranks share {record['devices'][0]} "
            "(gloo on CUDA tensors: NCCL needs a GPU per rank)"
        )
    return f"one GPU per rank ({', '.join(record['devices'])}, NCCL)"


def make_data(spec: dict[str, Any], world_size: int) -> pl.LightningDataModule:
    if spec["data"] == "digits":
        return DigitsDataModule(batch_size=spec["batch_size"], seed=spec["seed"])
    if spec["data"] == "synthetic":
        # By default enough samples that no epoch boundary falls inside the timed steps;
        # proportional sampling re-splits at epoch boundaries, so it asks for short epochs.
        samples = spec["batch_size"] * world_size * (spec.get("epoch_steps") or spec["steps"] + 1)
        return SyntheticDataModule(
            num_samples=samples, batch_size=spec["batch_size"], seed=spec["seed"], num_eval_samples=64
        )
    raise ValueError(f"data {spec['data']!r} is not one of digits, synthetic")


def run(spec: dict[str, Any], callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    """Trains ``spec`` on this rank and returns its figures. ``callbacks`` are called before the
    step timer at every hook: a device sync of theirs lands inside the step it waits for."""
    torch.set_num_threads(spec.get("threads", 1))
    method = spec["method"]
    rank, world_size = rank_and_world_size()
    accelerator = spec.get("accelerator", "cpu")
    gpus = torch.cuda.device_count() if accelerator == "gpu" else 0
    where = placement(accelerator, method, world_size, rank, gpus, bool(spec.get("one_device", False)))
    if method == BOUND:  # no process group: drop what would make Lightning join one
        for key in _DIST_ENV:
            os.environ.pop(key, None)
    os.environ.update(where["env"])
    pl.seed_everything(spec["seed"], verbose=False)
    data = make_data(spec, 1 if method == BOUND else world_size)
    in_channels = 1 if spec["data"] == "digits" else 3
    net = build_model(spec["model"], 10, in_channels=in_channels, **spec.get("model_kwargs", {}))
    model = ClassifierModule(
        net,
        lr=spec["lr"],
        momentum=0.9,
        weight_decay=spec.get("weight_decay", 5e-4),
        schedule="none",
        channels_last=bool(spec.get("channels_last", False)),
    )
    timer = StepTimer()
    timeline = AccuracyTimeline(timer)
    callbacks = [*callbacks, timer, timeline]
    if spec.get("progress_path") and rank == 0:
        # The launcher's rank, not the trainer's: in the bound every worker is a rank 0 of its own.
        callbacks.append(ProgressLine(spec["title"], every_s=1.0, path=spec["progress_path"]))
    if spec.get("slowdown"):  # the bound of a heterogeneous run: each worker alone, at its own speed
        callbacks.append(SimulatedSlowdown([spec["slowdown"][rank]] if method == BOUND else spec["slowdown"]))
    sampling = None
    if spec.get("proportional") and method != BOUND:
        sampling = ProportionalSampling(global_batch_size=spec["batch_size"] * world_size)
        callbacks.append(sampling)
    evaluate = bool(spec.get("evaluate", False))
    # On the CPU each strategy keeps its default backend (gloo), so those runs stay as they were.
    backend = where["record"]["backend"] if accelerator == "gpu" else None
    trainer = build_trainer(
        **where["trainer"],
        strategy=make_strategy(
            method,
            spec.get("tau", 4),
            backend,
            spec.get("tau_max"),
            spec.get("compression"),
            spec.get("comm_hook"),
            spec.get("powersgd_rank"),
            spec.get("overlap"),
        ),
        precision=spec.get("precision") or "32-true",
        max_steps=spec.get("steps") or -1,
        max_epochs=spec.get("epochs"),
        limit_val_batches=1.0 if evaluate else 0,
        callbacks=callbacks,
    )
    trainer.fit(model, datamodule=data)
    train_seconds = timer.elapsed  # before testing adds to the clock
    test_acc = float(trainer.test(model, datamodule=data, verbose=False)[0]["test/acc"]) if evaluate else None
    stats = getattr(trainer.strategy, "comm_stats", None)
    return {
        "method": method,
        "rank": rank,
        "world_size": 1 if method == BOUND else world_size,
        "tau": spec.get("tau"),
        "step_ends": timer.step_ends,
        "train_seconds": train_seconds,
        "timeline": timeline.points,
        "test_acc": test_acc,
        "comm": stats.summary() if stats is not None else None,
        "rounds": [
            [
                r.launch_step,
                r.finish_step,
                r.comm_seconds,
                r.exposed_seconds,
                r.bytes_sent,
                r.bytes_received,
                r.codec_seconds,
            ]
            for r in (stats.rounds if stats is not None else [])
        ],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "model_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
        # The most flat-buffer memory the strategy held at once.
        "buffer_bytes": rounds.peak_buffer_bytes
        if (rounds := getattr(trainer.strategy, "rounds", None))
        else 0,
        "tau_history": getattr(trainer.strategy, "tau_history", None),
        "placement": where["record"],
        "batch_split_history": sampling.history if sampling is not None else None,
    }


if __name__ == "__main__":
    write_result(run(json.loads(sys.argv[1])))
