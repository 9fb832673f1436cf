"""A run's files: what its workers start from, and the record of a finished run.

``workers/job.yaml`` and ``workers/identity.json`` are what the cpu/gpu launchers hand the
ranks. ``resolved.yaml`` (the config, the code on its first line) and ``run.json`` (the record
``fit_run`` computes: identity, condition, final figures; ``app.runs`` reads it back) describe a
finished run: they are written when it ends, and at the start only where the folder has none
yet, so a resumed run that fails leaves the records of the run it continued as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lightning_cocod._files import atomic_write
from lightning_cocod.app.identity import code_of

JOB_CONFIG, JOB_IDENTITY = "workers/job.yaml", "workers/identity.json"


def _resolved_yaml(config: dict[str, Any], identity: dict[str, Any]) -> str:
    return f"# code: {code_of(identity)}\n" + OmegaConf.to_yaml(OmegaConf.create(config))


def write_start(job_dir: Path, config: dict[str, Any], identity: dict[str, Any]) -> None:
    """The workers' inputs; ``resolved.yaml`` too when this folder holds no run yet."""
    text = _resolved_yaml(config, identity)
    atomic_write(job_dir / JOB_CONFIG, text)
    atomic_write(job_dir / JOB_IDENTITY, json.dumps(identity, indent=1))
    if not (job_dir / "resolved.yaml").exists():
        atomic_write(job_dir / "resolved.yaml", text)


def read_start(job_dir: Path) -> tuple[Any, dict[str, Any]]:
    return OmegaConf.load(job_dir / JOB_CONFIG), json.loads((job_dir / JOB_IDENTITY).read_text())


def write_finished(job_dir: Path, config: dict[str, Any], record: dict[str, Any]) -> None:
    atomic_write(job_dir / "resolved.yaml", _resolved_yaml(config, record))
    atomic_write(job_dir / "run.json", json.dumps(record, indent=1))
