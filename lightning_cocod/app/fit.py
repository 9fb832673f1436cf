"""One rank's share of a run: build everything from the resolved config, fit, test, and on rank 0
write the run record (the logger's final figures, run.json). The run's logger (wandb, CSV or none)
and what the app logs through it beyond step metrics are here too."""

from __future__ import annotations

import logging
import netrc
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig

from lightning_cocod.app.callbacks import CALLBACKS
from lightning_cocod.app.files import resume_checkpoint
from lightning_cocod.app.identity import condition, condition_id, measured, to_plain
from lightning_cocod.app.runs import load_runs, write_finished
from lightning_cocod.app.speedup import speedup
from lightning_cocod.app.user_code import data_node, in_namespace, namespace_of, node_in
from lightning_cocod.trainer import build_trainer

log = logging.getLogger("cocod-train")
FINAL_KEYS = (
    *("test_acc", "steady_step_seconds", "samples_per_second", "train_seconds", "time_to_target_seconds"),
    *("hidden_fraction", "comm_seconds", "exposed_seconds", "rounds", "speedup_vs_ssgd"),
    *("bytes_sent_per_round", "codec_seconds"),
    "finished_at",  # Unix time: which of two S-SGD runs of one condition came first
)
REDACTED = "<redacted>"


def steady_step_seconds(step_ends: list[float], warmup: int, period: int) -> float | None:
    """Mean step time over whole rounds after ``warmup`` steps; a short run gives up the warm-up
    (and then whole rounds) rather than report nothing. None with fewer than two steps."""
    from lightning_cocod.figures import steady_step_seconds as over_whole_periods

    n = len(step_ends)
    for w, p in ((warmup, period), (max(1, min(warmup, n - period)), period), (1, 1)):
        try:
            return over_whole_periods(step_ends, w, p)
        except ValueError:
            continue
    return None


def threads_per_rank(launcher: DictConfig, env: Mapping[str, str]) -> int:
    """Compute threads of one rank: ``launcher.threads_per_worker``; else OMP_NUM_THREADS (the
    cpu/gpu launchers set it, as torchrun does for several processes a node); else the cores of
    the task (SLURM_CPUS_PER_TASK) or of the node shared by its ranks, so ranks never fight."""
    if launcher.get("threads_per_worker"):
        return int(launcher.threads_per_worker)
    if env.get("OMP_NUM_THREADS"):
        return int(env["OMP_NUM_THREADS"])
    if env.get("SLURM_CPUS_PER_TASK"):
        return int(env["SLURM_CPUS_PER_TASK"])
    ranks_here = int(env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE") or launcher.devices)
    return max(1, (os.cpu_count() or 1) // ranks_here)


def fit_run(cfg: DictConfig, job_dir: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """Fit and test on this rank; rank 0 returns the run record, the others ``{"rank": r}``.

    The record is computed here only: rank 0 finds its speedup among the run.json records of its
    group under ``out_root``, logs it and writes it; the launcher's console line prints the same record.
    """
    import pytorch_lightning as pl
    import torch
    from hydra.utils import instantiate

    import lightning_cocod  # noqa: F401 - registers the strategy names
    from lightning_cocod.app.agreement import SameConfig, must_agree
    from lightning_cocod.callbacks import AccuracyTimeline, StepTimer

    torch.set_num_threads(threads_per_rank(cfg.launcher, os.environ))
    pl.seed_everything(cfg.seed, workers=True)
    data, model = instantiate(data_node(cfg.data)), instantiate(cfg.model)
    # The module's namespace (pytorch_lightning or lightning.pytorch) is the run's: preflight
    # refused a module of neither.
    namespace = namespace_of(model) or "pytorch_lightning"
    data, strategy = in_namespace(data, namespace), instantiate(node_in(cfg.strategy, namespace))
    resume = resume_checkpoint(cfg, job_dir, verify=False)  # the launcher verified it
    timer = StepTimer()
    timeline = AccuracyTimeline(timer, metric="val/acc", target=cfg.target_accuracy)
    logger = build_logger(node_in(cfg.logger, namespace), job_dir, identity)
    callbacks = [
        SameConfig(must_agree(cfg)),  # first: before any callback of the list talks to the other ranks
        timer,
        timeline,
        *(c for build in CALLBACKS.values() for c in build(cfg, job_dir, resume, identity["name"])),
    ]
    callbacks = [in_namespace(c, namespace) for c in callbacks]
    launcher = cfg.launcher
    trainer = build_trainer(
        namespace,
        **to_plain(cfg.trainer),
        accelerator=launcher.accelerator,
        devices=launcher.devices,
        num_nodes=launcher.num_nodes,
        enable_checkpointing=any(isinstance(c, pl.callbacks.Checkpoint) for c in callbacks),
        strategy=strategy,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=str(job_dir),
    )
    config = to_plain(cfg)
    cond = condition(
        config, measured(trainer, cfg.launcher.get("rate"), cfg.launcher.get("topology", "loopback"))
    )
    identity = {
        **identity,
        "condition": cond,
        "condition_id": condition_id(cond),
        "link": cond["measured"]["link"],
    }
    if logger:  # the run's identity (git commit included) and its resolved config, as hyper-parameters
        logger.log_hyperparams({"run": identity, "cfg": redact(config)})
    trainer.fit(model, datamodule=data, ckpt_path=resume)
    train_seconds = timer.elapsed  # before testing adds to the clock
    # Lightning's DDPStrategy keeps no CommStats.
    comm = strategy.comm_stats.summary() if hasattr(strategy, "comm_stats") else {}
    tested = trainer.test(model, datamodule=data, verbose=False)[0]
    if trainer.global_rank != 0:
        return {"rank": trainer.global_rank}

    period = identity["tau"] if isinstance(identity["tau"], int) else 1  # tau="auto" varies
    step = steady_step_seconds(timer.step_ends, cfg.step_time_warmup, period)
    record = {
        **identity,
        "test_acc": tested.get("test/acc"),
        "steady_step_seconds": step,
        "samples_per_second": identity["global_batch_size"] / step if step else None,
        "train_seconds": train_seconds,
        "steps": trainer.global_step,
        "steps_trained": len(timer.step_ends),  # by this invocation: fewer than steps when resumed
        "resumed_from": resume,
        # What the OpenMP runtime was given when torch loaded (torch's own count is the condition's).
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "target_accuracy": cfg.target_accuracy,
        "judged_by": cfg.judged_by,
        "time_to_target_seconds": timeline.time_to_target,
        # With no finished round there is no share to speak of (CommStats would say 1.0).
        "hidden_fraction": comm.get("hidden_fraction") if comm.get("rounds") else None,
        "comm_seconds": comm.get("comm_seconds"),
        "exposed_seconds": comm.get("exposed_seconds"),
        "rounds": comm.get("rounds"),
        # What this rank put on the wire per round (compressed rounds: their encoded bytes), and the
        # codec's own seconds in all.
        "bytes_sent_per_round": comm["bytes_sent"] / comm["rounds"] if comm.get("rounds") else None,
        "codec_seconds": comm.get("codec_seconds"),
        # (step, tau) at the start and at every change: the periods tau="auto" settled on.
        "tau_history": [list(entry) for entry in getattr(strategy, "tau_history", [])] or None,
        "timeline": timeline.points,
        "finished_at": time.time(),
    }
    # Its own earlier record (a finished run resumed to train further) is not another run; the rule
    # itself keeps to the run's group.
    skipped = "passed over %s in search of this run's S-SGD baseline: %s"
    runs = load_runs([Path(cfg.out_root)], lambda path, why: log.warning(skipped, path, why))
    value, base = speedup(record, [*(r for r in runs if r["id"] != record["id"]), record])
    record.update(speedup_vs_ssgd=value, speedup_baseline=base)
    log_final(logger, record, trainer.global_step)
    write_finished(job_dir, config, record)
    return record


def wandb_mode(env: Mapping[str, str] = os.environ) -> str:
    """WANDB_MODE when set; "disabled" under pytest (a test opts in by setting WANDB_MODE);
    "online" when an API key is available; otherwise "offline" (``wandb sync`` uploads later)."""
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    if "PYTEST_CURRENT_TEST" in env:
        return "disabled"
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        in_netrc = netrc.netrc(env.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        in_netrc = False
    return "online" if env.get("WANDB_API_KEY") or in_netrc else "offline"


def redact(value: Any, secret: str | None = None) -> Any:
    """``value`` with any string holding the wandb API key replaced, so a config that interpolates
    it (``${oc.env:WANDB_API_KEY}``) can still be saved and logged."""
    secret = os.environ.get("WANDB_API_KEY") if secret is None else secret
    if isinstance(value, dict):
        return {k: redact(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secret) for v in value]
    return REDACTED if secret and isinstance(value, str) and secret in value else value


def build_logger(node: DictConfig, job_dir: Path, identity: dict[str, Any]) -> Any:
    """The Lightning logger of ``node`` writing under ``job_dir``; False for logger=none.

    A CSV log goes to ``version`` unless that folder already holds a metrics.csv (a resumed run, or
    a new one in the same run folder), which Lightning's CSV writer would delete: then to the next
    free ``v1``, ``v2``, ... beside it, as checkpoints get last-v1.ckpt. (None: Lightning numbers.)
    """
    if not node or "_target_" not in node:
        return False
    from hydra.utils import instantiate

    extra: dict[str, Any] = {"save_dir": str(job_dir)}
    if str(node._target_).endswith("CSVLogger"):
        folder = job_dir / str(node.get("name", "csv"))
        versions = [node.get("version"), *(f"v{n}" for n in range(1, 10_000))]
        extra["version"] = next(
            v for v in versions if v is None or not (folder / str(v) / "metrics.csv").exists()
        )
    if str(node._target_).endswith("WandbLogger"):
        method, tags = identity["method"], list(node.get("tags", []))
        extra.update(name=identity["name"], mode=wandb_mode(), tags=[*tags, method], job_type=method)
    return instantiate(node, **extra)


def log_final(logger: Any, record: dict[str, Any], step: int) -> None:
    """Final figures as ``final/<key>``; the accuracy (and loss) timeline as lists in the wandb
    summary and as ``curve/*`` rows in a CSV log (wandb would drop rows whose step goes back in time)."""
    if not logger:
        return
    finals = {f"final/{k}": float(record[k]) for k in FINAL_KEYS if record.get(k) is not None}
    logger.log_metrics(finals, step=step)
    timeline = record.get("timeline", [])
    if type(logger).__name__ == "WandbLogger":
        points = [[p["seconds"], p["accuracy"]] for p in timeline]
        losses = [[p["seconds"], p["loss"]] for p in timeline if "loss" in p]
        summary = {**finals, "final/timeline": points, **({"final/loss_timeline": losses} if losses else {})}
        logger.experiment.summary.update(summary)
        if record.get("speedup_baseline"):
            logger.experiment.summary["final/speedup_baseline"] = record["speedup_baseline"]
        logger.experiment.finish()  # a torchrun multirun fits the next job in this same process
        return
    for p in timeline:
        loss = {"curve/loss": p["loss"]} if p.get("loss") is not None else {}
        curve = {"curve/seconds": p["seconds"], "curve/accuracy": p["accuracy"], **loss}
        logger.log_metrics(curve, step=p["step"])
    logger.save()
