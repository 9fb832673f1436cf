"""The condition a run was measured under: everything that sets its speed except the method.

A speedup is the ratio of two runs that differ only in the method, so the condition is the run's
resolved config with the method, its options and the run's names and paths taken out, plus what
was measured on the worker rather than asked for: the link as it really was (a rate asked for
without root runs unshaped), threads, device, precision, torch version. Two runs compare when
their conditions are equal; ``condition_id`` is a short digest to group by.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
from typing import Any

NETNS_ENV = "COCOD_LAUNCHER_NETNS"  # the launcher's network namespace, told to the workers it starts
# What does not set a run's speed, or is the method itself (strategy, tau, proportional sampling).
NOT_CONDITION: dict[str | None, tuple[str, ...]] = {
    None: (
        *("strategy", "tau", "seed", "name", "group", "run_id", "out_root", "checkpoint", "logger"),
        *("target_accuracy", "progress_every_s"),
    ),
    "hetero": ("proportional", "batch_sizes", "every_n_epochs"),
    "launcher": ("run_id", "timeout_s", "rate", "threads_per_worker"),  # measured instead
    "data": ("root", "download", "seed"),
    "trainer": ("enable_progress_bar", "enable_model_summary"),
}


def net_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def measured(trainer: Any, rate: str | None) -> dict[str, Any]:
    """What this rank runs under, read off the process and the built Trainer. The link is ``rate``
    only when the launcher put this rank in a shaped namespace (one other than the launcher's,
    named in NETNS_ENV): without root a rate asked for runs unshaped."""
    import torch

    from lightning_cocod.launch.netns import format_rate, parse_rate

    launcher_ns = os.environ.get(NETNS_ENV)
    shaped = rate is not None and launcher_ns is not None and net_namespace() not in (None, launcher_ns)
    accelerator = type(trainer.accelerator).__name__.removesuffix("Accelerator").lower()
    try:  # the CPU's model: platform.processor() says "x86_64" on Linux
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.partition(":")[2].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        cpu = ""
    cpu = f"{cpu or platform.processor() or platform.machine()} x{os.cpu_count()}"
    return {
        "link": format_rate(parse_rate(rate)) if shaped else "unshaped",
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if accelerator == "cuda" else cpu,
        "accelerator": accelerator,
        "precision": str(trainer.precision),
        "world_size": trainer.world_size,
        "torch": str(torch.__version__),  # a str subclass that YAML loggers would tag as a Python object
    }


def condition(config: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """``config`` (the resolved config as plain containers) less NOT_CONDITION, plus ``facts``."""
    kept = copy.deepcopy(config)
    for section, keys in NOT_CONDITION.items():
        node = kept if section is None else kept.get(section)
        for key in keys if isinstance(node, dict) else ():
            node.pop(key, None)
    return {"config": kept, "measured": dict(facts)}


def condition_id(cond: dict[str, Any]) -> str:
    text = json.dumps(cond, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
