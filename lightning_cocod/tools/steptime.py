"""The product's training step against a bare PyTorch loop of the same model and batch.

    python -m lightning_cocod.tools.steptime --model resnet18 --batch-size 128 --steps 60 --accelerator gpu
    python -m lightning_cocod.tools.steptime --accelerator gpu --sync-report     # where the host waits on the GPU
    python -m lightning_cocod.tools.steptime --accelerator gpu --allreduce 2     # the model's all-reduce alone

(a) the bare loop: the network, SGD with momentum, one batch already on the device, nothing else;
(b) the product: ``ClassifierModule`` + ``SyntheticDataModule`` (gather, crop, flip, normalise on
the device) through a single-process Lightning ``Trainer``. Both take ``--warmup`` steps first and
time ``--steps`` steps with a device sync only at the two ends, so a host that runs ahead of the
GPU is not charged for it and one that holds the GPU up is. ``--allreduce N`` times the all-reduce
of one flat model-sized buffer among N ranks placed as the benchmark places them, the yardstick
for the communication time a strategy reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightning_cocod.callbacks import ProgressLine
from lightning_cocod.figures import steady_step_seconds
from lightning_cocod.launch import launch_workers, rank_and_world_size
from lightning_cocod.models import MODEL_NAMES, build_model
from lightning_cocod.tools import worker
from lightning_cocod.tools.compare import BOUND, require_at_least


def device_for(accelerator: str, index: int = 0) -> torch.device:
    worker.check_accelerator(accelerator, torch.cuda.device_count() if accelerator == "gpu" else 0)
    return torch.device("cpu") if accelerator == "cpu" else torch.device("cuda", index)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop_seconds(
    model: str,
    batch_size: int,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str = "32-true",
    channels_last: bool = False,
) -> float:
    """Seconds per step of the plainest loop over the same network and batch."""
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    net = build_model(model, 10).to(device, memory_format=layout)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch_size, 3, 32, 32, device=device).contiguous(memory_format=layout)
    y = torch.randint(0, 10, (batch_size,), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")

    def step() -> None:
        with autocast:
            loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - started) / steps


class WindowSync(pl.Callback):
    """Synchronizes the device at the two ends of the timed window, before the StepTimer listed
    after it reads the clock; with ``sync_report`` (CUDA) the warm-up's second half runs with
    CUDA's sync debugging on and every synchronizing call is counted by the Python line that made it."""

    def __init__(self, warmup: int, steps: int, device: torch.device, sync_report: bool = False) -> None:
        self.ends, self.device = (warmup, warmup + steps), device
        self.report_from = warmup // 2 if sync_report and device.type == "cuda" and warmup >= 2 else None
        self.syncs: Counter[str] = Counter()
        self._catcher: Any = None

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.report_from:
            self._catcher = warnings.catch_warnings(record=True)
            self._records = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.ends[0] and self._catcher is not None:
            torch.cuda.set_sync_debug_mode(0)
            self._catcher.__exit__(None, None, None)
            self._catcher = None
            syncs = (r for r in self._records if "synchroniz" in str(r.message))
            self.syncs.update(f"{r.filename}:{r.lineno}" for r in syncs)
        if trainer.global_step in self.ends:
            synchronize(self.device)

    def report(self) -> dict[str, Any]:
        if self.report_from is None:
            return {}
        steps = self.ends[0] - self.report_from
        return {
            "steps": steps,
            "syncs_per_step": sum(self.syncs.values()) / steps,
            "by_line": dict(self.syncs.most_common(10)),
        }


def product_seconds(
    model: str,
    batch_size: int,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str = "32-true",
    channels_last: bool = False,
    sync_report: bool = False,
) -> tuple[float, dict[str, Any]]:
    """Seconds per step of the package's own pipeline, as the benchmark's bound runs it (one
    process, no process group), and the sync report (empty unless asked)."""
    window = WindowSync(warmup, steps, device, sync_report)
    spec = {
        "method": BOUND,
        "model": model,
        "data": "synthetic",
        "batch_size": batch_size,
        "lr": 0.05,
        "seed": 0,
        "steps": warmup + steps,
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "precision": precision,
        "channels_last": channels_last,
        "threads": torch.get_num_threads(),
    }
    result = worker.run(spec, callbacks=[window, ProgressLine("product (Trainer)", every_s=10.0)])
    return steady_step_seconds(result["step_ends"], warmup), window.report()


def allreduce_worker(spec_json: str) -> dict[str, Any]:
    """One rank of ``--allreduce``: the strategies' collective (scale, then a SUM all-reduce of one
    flat buffer of the model's size), launch to completion, on the benchmark's placement."""
    spec = json.loads(spec_json)
    rank, world_size = rank_and_world_size()
    gpus = torch.cuda.device_count() if spec["accelerator"] == "gpu" else 0
    record = worker.placement(spec["accelerator"], "allreduce", world_size, rank, gpus)["record"]
    device = device_for(spec["accelerator"], 0 if record["ranks_per_device"] > 1 else rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(record["backend"] or "gloo", rank=rank, world_size=world_size)  # "or": one rank
    try:
        numel = sum(p.numel() for p in build_model(spec["model"], 10).parameters())
        bucket = torch.randn(numel, device=device)
        times = []
        for i in range(spec["warmup"] + spec["repeats"]):
            synchronize(device)
            dist.barrier()
            started = time.perf_counter()
            bucket.mul_(1.0 / world_size)
            dist.all_reduce(bucket, async_op=True).wait()
            synchronize(device)
            if i >= spec["warmup"]:
                times.append(time.perf_counter() - started)
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "seconds": times, "placement": record, "bytes": numel * 4}


def allreduce_seconds(model: str, workers: int, accelerator: str) -> dict[str, Any]:
    spec = {"model": model, "accelerator": accelerator, "warmup": 3, "repeats": 10}
    # By name: run as ``python -m``, this module is __main__, which a worker cannot import.
    target = "lightning_cocod.tools.steptime:allreduce_worker"
    results = launch_workers(target, workers, None, [json.dumps(spec)], timeout_s=300)
    per_call = [max(calls) for calls in zip(*(r["seconds"] for r in results))]  # done when the last rank is
    return {
        "median_seconds": statistics.median(per_call),
        "seconds": per_call,
        **{k: results[0][k] for k in ("placement", "bytes")},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_cocod.tools.steptime", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="resnet18", choices=MODEL_NAMES)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument(
        "--sync-report", action="store_true", help="count host syncs in the product's warm-up (CUDA)"
    )
    parser.add_argument(
        "--allreduce", type=int, default=0, metavar="N", help="also time the all-reduce alone on N ranks"
    )
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    require_at_least(parser, args, batch_size=1, steps=1, warmup=1)
    if args.allreduce == 1 or args.allreduce < 0:
        parser.error(f"--allreduce needs at least 2 ranks, got {args.allreduce}")
    try:
        args.device = device_for(args.accelerator)
    except ValueError as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.type == "cpu":
        torch.set_num_threads(1)  # the benchmark's workers run one thread each
    where = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU (1 thread)"
    # Both loops: the same network, batch, steps, device and number format.
    same = {k: getattr(args, k) for k in ("model", "batch_size", "steps", "warmup", "device", "precision")}
    same["channels_last"] = args.channels_last
    print(
        f"steptime: {args.model}, batch {args.batch_size}, {args.steps} timed steps after {args.warmup}, "
        f"{args.precision}{', channels_last' if args.channels_last else ''}, on {where}"
    )
    bare = bare_loop_seconds(**same)
    print(f"bare PyTorch loop:  {1000 * bare:8.2f} ms/step")
    product, report = product_seconds(**same, sync_report=args.sync_report)
    print(f"product (Trainer):  {1000 * product:8.2f} ms/step  = {product / bare:.2f}x the bare loop")
    figures: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k != "device"},
        "device": where,
        "bare_seconds": bare,
        "product_seconds": product,
        "ratio": product / bare,
        "sync_report": report,
    }
    if report:
        print(
            f"host syncs per product step (warm-up, {report['steps']} steps): {report['syncs_per_step']:.1f}"
        )
        for line, count in report["by_line"].items():
            print(f"  {count:4d}  {line}")
    if args.allreduce:
        alone = allreduce_seconds(args.model, args.allreduce, args.accelerator)
        figures["allreduce"] = alone
        where, count = alone["placement"], len(alone["seconds"])
        print(
            f"all-reduce alone ({args.allreduce} ranks, {alone['bytes'] / 1e6:.1f} MB, {where['backend']} on "
            f"{', '.join(where['devices'])}): {1000 * alone['median_seconds']:.1f} ms (median of {count})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
