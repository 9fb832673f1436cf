"""Who a run is: its id, name, method and sizes, the code it ran (version, git commit), and the
condition it was measured under: everything that sets its speed except the method.

A speedup is the ratio of two runs that differ only in the method, so the condition is the run's
resolved config with the method, its options and the run's names and paths taken out, plus what
was measured on the worker rather than asked for: the link as it really was (a rate asked for
without root runs unshaped), threads, device, precision, torch version. Two runs compare when
their conditions are equal; ``condition_id`` is a short digest to group by.

A tuned study gives each method its own learning rate and length of run: settings that change
what a run reaches but not how fast it steps (RECIPE). ``speed_key`` is the condition without
them, so that a method at its tuned settings is still measured against S-SGD at S-SGD's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_cocod import __version__
from lightning_cocod.methods import PERIODIC, method_of_class

_SOURCE = Path(__file__).resolve().parents[2]
NETNS_ENV = "COCOD_LAUNCHER_NETNS"  # the launcher's network namespace, told to the workers it starts
# What does not set a run's speed, or is the method itself (strategy, tau, proportional sampling).
NOT_CONDITION: dict[str | None, tuple[str, ...]] = {
    None: (
        *("strategy", "tau", "seed", "name", "group", "run_id", "out_root", "checkpoint", "logger"),
        # judged_by sets no speed, yet runs judged apart are compared apart: the speedup rule
        # matches it beside condition_id (``speedup.goal_of``), so older records keep their id.
        *("target_accuracy", "judged_by", "progress_every_s"),
    ),
    "hetero": ("proportional", "batch_sizes", "every_n_epochs"),
    "launcher": ("run_id", "timeout_s", "rate", "threads_per_worker"),  # measured instead
    "data": ("root", "download", "seed"),
    "trainer": ("enable_progress_bar", "enable_model_summary"),
}


# What a study tunes per method: the learning rate and its schedule, the length of the run. They
# set no step time, so runs that differ only here are timed against one another (``speed_key``).
RECIPE: dict[str | None, tuple[str, ...]] = {
    None: ("max_epochs", "max_steps"),
    "trainer": ("max_epochs", "max_steps"),
    "model": ("lr", "weight_decay", "warmup_epochs", "max_epochs"),
}


def git_commit(path: Path = _SOURCE) -> tuple[str, bool]:
    """(commit, dirty) of the checkout whose root is ``path``; ("unknown", False) otherwise.

    Only the root counts: an installed package lives in site-packages, often inside a virtualenv
    inside the user's own repository, whose commit says nothing about this code.
    """

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10)
        return done.stdout if done.returncode == 0 else ""

    try:
        top, commit = git("rev-parse", "--show-toplevel", "HEAD").splitlines() or ("", "")
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown", False
    if not top or Path(top).resolve() != Path(path).resolve():
        return "unknown", False
    return commit, bool(git("status", "--porcelain", "--untracked-files=no").strip())


def code_of(record: dict[str, Any]) -> str:
    """The code a run ran, as the report and resolved.yaml name it: the package's version, and
    its commit when it ran from a checkout (runs recorded before versions were kept: the commit)."""
    commit = record.get("git_commit", "unknown")
    git = None if commit == "unknown" else f"git {commit}{'+dirty' if record.get('git_dirty') else ''}"
    if record.get("version") is None:
        return git or "unknown"
    return f"lightning_cocod {record['version']}" + (f" ({git})" if git else "")


def describe_outer_config(outer: Any) -> str | None:
    """An outer optimizer's config (a Hydra ``_partial_`` node, or its plain dict) in words that
    compare equal across runs: "SGD lr 0.7 momentum 0.9 nesterov"; None for none."""
    if isinstance(outer, DictConfig):
        outer = OmegaConf.to_container(outer, resolve=True)
    if not outer:
        return None
    words = [str(outer.get("_target_", "optimizer")).rpartition(".")[2]]
    for key, value in outer.items():
        if key.startswith("_") or value is False or value is None:
            continue
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        words.append(key if value is True else f"{key} {value:g}" if is_number else f"{key} {value}")
    return " ".join(words)


def _default_outer(method: str | None) -> str | None:
    from lightning_cocod.core.outer import DILOCO_OUTER  # torch: only where a run is named

    if method != "diloco":
        return None
    return describe_outer_config({"_target_": DILOCO_OUTER.func.__name__, **DILOCO_OUTER.keywords})


def variant_of(record: dict[str, Any]) -> str | None:
    """What sets a run apart from its method's defaults, as run names and report labels add it:
    a CoCoD merge other than the default ("progress 0.5"), an overlap or an outer optimizer other
    than the method's ("overlap 1", "outer SGD lr 0.35 momentum 0.9 nesterov"), an outer learning-
    rate schedule ("schedule LinearLR start_factor 0.25 total_iters 3"), compressed rounds
    ("int8"), DDP's compression hook ("powersgd") or tau="auto" with a bound other than the
    default ("tau_max 64"). Records from before an option existed ran its default."""
    from lightning_cocod.core.adapt import safe_tau_max
    from lightning_cocod.core.averaging import DEFAULT_PROGRESS  # torch: only where a run is named

    method = record.get("method")
    progress = record.get("progress", 1.0) if method == "cocod" else None
    merge = None if progress is None or progress == DEFAULT_PROGRESS else f"progress {progress:g}"
    overlap = record.get("overlap", 0 if method == "diloco" else None)
    shift = None if overlap == (0 if method == "diloco" else None) else f"overlap {overlap}"
    default_outer = _default_outer(method)
    outer = record.get("outer_optimizer", default_outer)
    outer = None if outer == default_outer else f"outer {outer or 'none'}"
    schedule = record.get("outer_scheduler")
    schedule = f"schedule {schedule}" if schedule else None
    bound = record.get("tau_max") if record.get("tau") == "auto" else None
    bound = None if bound in (None, safe_tau_max(progress or DEFAULT_PROGRESS)) else f"tau_max {bound}"
    parts = [merge, shift, outer, schedule, record.get("compression"), record.get("comm_hook"), bound]
    return ", ".join(p for p in parts if p) or None


def run_name(method: str, tau: Any, workers: int, seed: int, variant: str | None = None) -> str:
    """``cocod-tau4-w2-s0``; a variant adds itself: ``cocod-tau4-progress0.5-int8-w2-s0``."""
    period = f"-tau{tau}" if tau is not None else ""
    extra = "-" + variant.replace(", ", "-").replace(" ", "") if variant else ""
    return f"{method}{period}{extra}-w{workers}-s{seed}"


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]  # a DictConfig's is a dict


def world_size(cfg: DictConfig) -> int:
    return int(cfg.launcher.devices) * int(cfg.launcher.num_nodes)


def make_identity(cfg: DictConfig, job_dir: Path, run_id: str) -> dict[str, Any]:
    """What every record of this run carries (run.json, logger config); the worker adds the
    condition it measured (``measured``)."""
    name = method_of_class(str(cfg.strategy._target_))
    tau = cfg.strategy.get("tau") if name in PERIODIC else None
    progress = float(cfg.strategy.progress) if "progress" in cfg.strategy else None
    options = {
        "method": name,
        "progress": progress,  # CoCoD's merge: x_i <- avg + progress * (x_i - snap_i)
        "compression": cfg.strategy.get("compression"),  # CoCoD's and Local-SGD's codec
        "comm_hook": cfg.strategy.get("comm_hook"),  # S-SGD's DDP hook: then no baseline of speedups
        "tau_max": cfg.strategy.get("tau_max"),  # tau="auto"'s bound, when the run set one
        "overlap": cfg.strategy.get("overlap"),  # the outer round's: steps its all-reduce runs alongside
        "outer_optimizer": describe_outer_config(cfg.strategy.get("outer_optimizer")),
        "outer_scheduler": describe_outer_config(cfg.strategy.get("outer_scheduler")),
    }
    workers = world_size(cfg)
    commit, dirty = git_commit()
    return {
        "id": os.path.relpath(job_dir, Path(cfg.out_root).resolve()),
        "name": run_name(name, tau, workers, cfg.seed, variant_of({**options, "tau": tau})),
        "group": cfg.group,
        "run_id": run_id,
        "tau": tau,
        **options,
        "workers": workers,
        "seed": cfg.seed,
        "global_batch_size": cfg.data.batch_size * workers,
        # The link it really ran over is measured on the worker (``measured``): without root
        # a rate asked for runs unshaped. Model, data and batch are the condition's.
        "rate_requested": cfg.launcher.get("rate"),
        "version": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "dir": str(job_dir),
    }


def net_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def measured(trainer: Any, rate: str | None, topology: str = "loopback") -> dict[str, Any]:
    """What this rank runs under, read off the process and the built Trainer. The link is ``rate``
    only when the launcher put this rank in a shaped namespace (one other than the launcher's,
    named in NETNS_ENV): without root a rate asked for runs unshaped. A link per worker
    ("pernode") is named as such: it is not the shared loopback of the same rate."""
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
        "link": (format_rate(parse_rate(rate)) + ("/node" if topology == "pernode" else ""))
        if shaped
        else "unshaped",
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if accelerator == "cuda" else cpu,
        "accelerator": accelerator,
        "precision": str(trainer.precision),
        "world_size": trainer.world_size,
        "torch": str(torch.__version__),  # a str subclass that YAML loggers would tag as a Python object
    }


def _without(config: dict[str, Any], dropped: dict[str | None, tuple[str, ...]]) -> dict[str, Any]:
    kept = copy.deepcopy(config)
    for section, keys in dropped.items():
        node = kept if section is None else kept.get(section)
        for key in keys if isinstance(node, dict) else ():
            node.pop(key, None)
    return kept


def condition(config: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """``config`` (the resolved config as plain containers) less NOT_CONDITION, plus ``facts``."""
    return {"config": _without(config, NOT_CONDITION), "measured": dict(facts)}


def condition_id(cond: dict[str, Any]) -> str:
    text = json.dumps(cond, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def speed_key(record: dict[str, Any]) -> str | None:
    """The digest of ``record``'s condition less RECIPE: equal for runs that step at the same speed
    whatever their learning rate or length. A record that kept only its condition_id has that."""
    cond = record.get("condition")
    if not isinstance(cond, dict) or not isinstance(cond.get("config"), dict):
        return record.get("condition_id")
    return condition_id({**cond, "config": _without(cond["config"], RECIPE)})
