"""The run's logger (wandb, CSV or none) and what the app logs through it beyond step metrics."""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

FINAL_KEYS = (
    *("test_acc", "steady_step_seconds", "samples_per_second", "train_seconds", "time_to_target_seconds"),
    *("hidden_fraction", "comm_seconds", "exposed_seconds", "rounds", "speedup_vs_ssgd"),
    *("bytes_sent_per_round", "codec_seconds"),
    "finished_at",  # Unix time: which of two S-SGD runs of one condition came first
)
REDACTED = "<redacted>"


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


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]  # a DictConfig's is a dict


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


def log_start(logger: Any, identity: dict[str, Any], config: dict[str, Any]) -> None:
    """The run's identity (git commit included) and its resolved config, as hyper-parameters."""
    if logger:
        logger.log_hyperparams({"run": identity, "cfg": redact(config)})


def log_final(logger: Any, record: dict[str, Any], step: int) -> None:
    """Final figures as ``final/<key>``; the accuracy timeline as a list in the wandb summary and
    as ``curve/*`` rows in a CSV log (wandb would drop rows whose step goes back in time)."""
    if not logger:
        return
    finals = {f"final/{k}": float(record[k]) for k in FINAL_KEYS if record.get(k) is not None}
    logger.log_metrics(finals, step=step)
    timeline = record.get("timeline", [])
    if type(logger).__name__ == "WandbLogger":
        points = [[p["seconds"], p["accuracy"]] for p in timeline]
        logger.experiment.summary.update({**finals, "final/timeline": points})
        if record.get("speedup_baseline"):
            logger.experiment.summary["final/speedup_baseline"] = record["speedup_baseline"]
        logger.experiment.finish()  # a torchrun multirun fits the next job in this same process
        return
    for p in timeline:
        logger.log_metrics({"curve/seconds": p["seconds"], "curve/accuracy": p["accuracy"]}, step=p["step"])
    logger.save()
