"""``cocod-train`` (also ``python -m lightning_cocod.train``): a Hydra app over the repository's conf/.

    cocod-train experiment=smoke
    cocod-train -m experiment=smoke strategy=cocod,local_sgd strategy.tau=2,4,8 seed=0,1,2

Every job of the command line is composed and checked first (one-line error, exit code 2). Then
each Hydra job either starts its ranks itself (launcher=cpu|gpu: ``launch_workers`` runs
``worker_main`` in N processes that build ``Trainer(devices=N)`` from the job's resolved.yaml) or
is itself one rank among processes made by torchrun/srun (launcher=torchrun|slurm). Lightning's
popen launcher is never asked to start processes: it re-executes sys.argv, which under
``-m`` would re-run the whole sweep in every child.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_cocod.app.checks import ConfigError, check_values, resume_checkpoint
from lightning_cocod.app.identity import make_identity, world_size
from lightning_cocod.app.loggers import redact, to_plain
from lightning_cocod.app.preflight import config_dir, preflight

log = logging.getLogger("cocod-train")
WORKER_TARGET = "lightning_cocod.train:worker_main"


def _run_id(job_dir: Path, multirun: bool) -> str:
    # The folder Hydra made, rather than cfg.run_id: a ${now:...} run_id would read a later second.
    return (job_dir.parent if multirun else job_dir).name


def _write_job(cfg: DictConfig, identity: dict[str, Any], job_dir: Path) -> None:
    config = redact(to_plain(cfg))
    config["run_id"] = config["launcher"]["run_id"] = identity["run_id"]
    (job_dir / "resolved.yaml").write_text(
        f"# git commit {identity['git_commit']}{' (uncommitted changes)' if identity['git_dirty'] else ''}\n"
        + OmegaConf.to_yaml(OmegaConf.create(config))
    )
    (job_dir / "run.json").write_text(json.dumps(identity, indent=1))


def run(cfg: DictConfig) -> float | None:
    """One Hydra job; returns the test accuracy (rank 0 of a torchrun/SLURM job, or the launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from lightning_cocod.app.fit import fit_run

    check_values(cfg)
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        resume_checkpoint(cfg, job_dir)  # before any worker starts or any file is rewritten
    except ConfigError as err:
        raise SystemExit(f"cocod-train: error: {err}") from None
    identity = make_identity(cfg, job_dir, _run_id(job_dir, hydra_cfg.mode == RunMode.MULTIRUN))
    workers = world_size(cfg)
    log.info(
        "%s: %d worker(s), global batch %d = %d per rank x %d; output %s",
        identity["name"],
        workers,
        identity["global_batch_size"],
        cfg.data.batch_size,
        workers,
        job_dir,
    )
    if cfg.launcher.name in ("cpu", "gpu"):
        _write_job(cfg, identity, job_dir)
        record = _launch(cfg, job_dir, workers)
    else:
        # torchrun sets RANK, srun SLURM_PROCID: one writer for the files every rank would write.
        if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
            _write_job(cfg, identity, job_dir)
        record = fit_run(OmegaConf.create(redact(to_plain(cfg))), job_dir, identity)
    if "test_acc" in record:
        log.info(
            "%s: test acc %.4f, steady step %s s, speedup vs S-SGD %s",
            identity["name"],
            record["test_acc"],
            _fmt(record["steady_step_seconds"]),
            _fmt(record["speedup_vs_ssgd"]),
        )
    return record.get("test_acc")


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3f}"


def _launch(cfg: DictConfig, job_dir: Path, workers: int) -> dict[str, Any]:
    from lightning_cocod.launch import launch_workers

    threads = cfg.launcher.get("threads_per_worker") or max(1, (os.cpu_count() or 1) // workers)
    if cfg.launcher.get("rate"):
        log.info(
            "workers talk over a loopback shaped to %s (unshaped, with a warning, without root)",
            cfg.launcher.rate,
        )
    results = launch_workers(
        WORKER_TARGET,
        world_size=workers,
        rate=cfg.launcher.get("rate"),
        args=[str(job_dir)],
        timeout_s=cfg.launcher.timeout_s,
        output_dir=job_dir / "workers",
        env={"OMP_NUM_THREADS": str(threads)},
    )
    return results[0]


def worker_main(job_dir: str) -> dict[str, Any]:
    """Entry of one rank started by ``launch_workers``: the job as its launcher saved it."""
    from lightning_cocod.app.fit import fit_run

    job = Path(job_dir)
    cfg = OmegaConf.load(job / "resolved.yaml")
    identity = json.loads((job / "run.json").read_text())
    assert isinstance(cfg, DictConfig)
    return fit_run(cfg, job, identity)


def main() -> None:
    import hydra

    try:
        preflight(sys.argv[1:])
        conf = config_dir()
    except ConfigError as err:
        print(f"cocod-train: error: {err}", file=sys.stderr)
        sys.exit(2)
    hydra.main(config_path=str(conf), config_name="train", version_base="1.3")(run)()


if __name__ == "__main__":
    main()
