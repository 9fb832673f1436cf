"""``cocod-train`` (also ``python -m lightning_cocod.app.train``): a Hydra app over the repository's conf/.

    cocod-train experiment=smoke
    cocod-train -m experiment=smoke strategy=ssgd,cocod,local_sgd tau=2,4,8 seed=0,1,2

Every job of the command line is composed once and checked before the first runs (one-line
error, exit code 2; ``preflight``). A sweep runs its S-SGD jobs first and runs a job that only
changes a period the method lacks (S-SGD at another tau) once. Then each Hydra job either starts
its ranks itself (launcher=cpu|gpu: ``launch_workers`` runs ``worker_main`` in N processes that
build ``Trainer(devices=N)`` from the job's workers/job.yaml) or is itself one rank among processes
made by torchrun/srun (launcher=torchrun|slurm). Lightning's popen launcher is never asked to start
processes: it re-executes sys.argv, which under ``-m`` would re-run the whole sweep in every child.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_cocod._errors import ConfigError, first_line
from lightning_cocod.app.files import (
    check_run_folder,
    claim,
    is_rank_zero,
    newest_checkpoint,
    resume_checkpoint,
)
from lightning_cocod.app.fit import redact
from lightning_cocod.app.identity import make_identity, to_plain, world_size
from lightning_cocod.app.preflight import config_dir, refuse
from lightning_cocod.app.runs import load_runs, read_start, write_start
from lightning_cocod.app.schema import compose_error
from lightning_cocod.exit_codes import PREEMPTED_EXIT_CODE

log = logging.getLogger("cocod-train")
WORKER_TARGET = "lightning_cocod.app.train:worker_main"
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a program ended by Ctrl-C
NO_CHECKPOINT = "no checkpoint was written, so it cannot be resumed"


def run(cfg: DictConfig) -> float | None:
    """One Hydra job; returns the test accuracy (rank 0 of a torchrun/SLURM job, or the launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        if is_rank_zero():
            continuing = cfg.checkpoint.resume in ("last", "auto")
            claim(job_dir, continuing, "hydra.sweep.dir" if multirun else "run_id")
        finished = job_dir / "run.json"
        if cfg.checkpoint.resume == "auto" and finished.is_file():
            # A requeued sweep runs every job again: those that ended keep their records as they are.
            def unreadable(path: Path, why: str) -> None:
                raise ConfigError(
                    f"{path} is not a run record ({why}), so checkpoint.resume=auto cannot tell whether that "
                    "run finished; move it aside to continue the run from its newest checkpoint"
                )

            record = load_runs([finished], unreadable)[0]
            what = "%s: finished already (%s); checkpoint.resume=auto leaves it as it is"
            log.info(what, record.get("name"), job_dir)
            return record.get("test_acc")
        # Before any worker starts or any file is rewritten (a single run's was checked before Hydra ran).
        resume = resume_checkpoint(cfg, job_dir, verify=multirun)
        check_run_folder(cfg, job_dir)
    except ConfigError as err:
        raise SystemExit(f"cocod-train: error: {err}") from None
    # The folder Hydra made names the run: a sweep's folder, or the run's own (hydra.run.dir given).
    identity = make_identity(cfg, job_dir, (job_dir.parent if multirun else job_dir).name)
    workers = world_size(cfg)
    batch = f"global batch {identity['global_batch_size']} = {cfg.data.batch_size} per rank x {workers}"
    log.info("%s: %d worker(s), %s; output %s", identity["name"], workers, batch, job_dir)
    if resume:
        from lightning_cocod.rounds.checkpoint import saved_step

        log.info("%s: resumed from %s at step %s", identity["name"], resume, saved_step(resume))
    config = redact(to_plain(cfg))
    config["run_id"] = config["launcher"]["run_id"] = identity["run_id"]
    try:
        # One writer for the files every rank would write: the launcher for cpu/gpu (whatever RANK
        # it inherits: its workers read them), rank 0 under torchrun/SLURM.
        if cfg.launcher.name in ("cpu", "gpu") or is_rank_zero():
            write_start(job_dir, config, identity)
        if cfg.launcher.name in ("cpu", "gpu"):
            record = _launch(cfg, job_dir, workers, identity["name"])
        else:
            from lightning_cocod.app.fit import fit_run

            record = fit_run(OmegaConf.create(config), job_dir, identity)
    except BaseException as err:
        from lightning_cocod import Preempted
        from lightning_cocod.launch import WorkersPreempted
        from lightning_cocod.launch.netns import Terminated

        # Read from the checkpoints only where an ending names it (every rank would load them).
        name, hint = identity["name"], lambda: _resume_hint(job_dir, hydra_cfg, multirun)
        # Stopped by SIGTERM/SIGUSR1 with a checkpoint: the strategy's Preempted in this very
        # process (torchrun/SLURM), or ranks that all exited with its code (cpu/gpu launchers).
        if isinstance(err, (Preempted, WorkersPreempted)):
            # Ctrl-C stopped the workers as a preemption does (they checkpointed), but it was asked
            # for at this terminal: the shell's code for it, not the scheduler's requeue code.
            interrupted = getattr(err, "interrupted", False)
            if is_rank_zero():
                print(_preempted_line(name, err, hint(), interrupted), flush=True)
            raise SystemExit(INTERRUPTED_EXIT_CODE if interrupted else PREEMPTED_EXIT_CODE) from None
        if isinstance(err, Terminated):
            # The workers did not stop together (one had not started its fit, or died of the
            # signal): without this line the app would end with the signal's code and no word.
            print(_stopped_line(name, err, hint()), file=sys.stderr, flush=True)
            raise
        failure = _worker_failure(err)
        if failure is None:
            raise
        raise SystemExit(f"cocod-train: error: {name}: {failure}; {hint() or NO_CHECKPOINT}") from None
    if "test_acc" in record:
        log.info(final_line(record))
    return record.get("test_acc")


def final_line(record: dict[str, Any]) -> str:
    """The console's summary of a finished run: the same record as run.json and the logs."""
    if record.get("speedup_baseline"):
        over = f" (over {record['speedup_baseline']}, link {record.get('link')})"
    else:
        over = (
            f" (no S-SGD run in group {record['group']} with this condition (link {record.get('link')}) "
            f"and seed {record['seed']} yet)"
        )
    step, speedup = record.get("steady_step_seconds"), record.get("speedup_vs_ssgd")
    return (
        f"{record['name']}: test acc {record['test_acc']:.4f}, steady step "
        f"{'unknown' if step is None else f'{step:.4f} s'}, speedup vs S-SGD "
        f"{'unknown' if speedup is None else f'{speedup:.3f}x'}{over}"
    )


def _worker_failure(err: BaseException) -> str | None:
    """One line for a run that lost a worker or diverged, or None for an error of our own code,
    whose traceback is the useful report. A rank that raised is named with its exception's line."""
    import lightning_cocod
    from lightning_cocod import launch

    if isinstance(err, launch.WorkerFailed):
        what = first_line(err).partition("; logs in ")[0]
        lines = [line.strip() for line in err.stderr_tail.splitlines() if line.strip()]
        said = f": {lines[-1]}" if err.returncode > 0 and lines else ""
        return f"{what}{said}; logs in {err.log_dir}"
    if isinstance(err, launch.LaunchError):
        return first_line(err)
    from lightning_cocod.app.agreement import ConfigMismatch

    kinds = (
        lightning_cocod.WorkerLostError,
        lightning_cocod.RendezvousError,
        lightning_cocod.NonFiniteError,
        ConfigMismatch,
    )
    return f"{type(err).__name__}: {first_line(err)}" if isinstance(err, kinds) else None


def _stopped_line(name: str, err: SystemExit, hint: str | None) -> str:
    """The ending of a run that a SIGTERM/SIGHUP to the app stopped before its workers could stop
    together at a step (``launch_workers`` re-raises the signal then)."""
    import signal

    code = err.code if isinstance(err.code, int) else 0
    try:
        what = signal.Signals(code - 128).name
    except ValueError:
        what = f"exit code {code}"
    resume = hint or NO_CHECKPOINT
    return f"cocod-train: {name}: stopped by {what} before its workers could stop together; {resume}"


def _preempted_line(name: str, err: BaseException, hint: str | None, interrupted: bool = False) -> str:
    what = "interrupted (Ctrl-C)" if interrupted else "preempted"
    return f"{name}: {what}; {hint}" if hint else f"{name}: {what} ({first_line(err)}); {NO_CHECKPOINT}"


def _resume_hint(job_dir: Path, hydra_cfg: Any, multirun: bool) -> str | None:
    """``checkpoint <path>; resume with: <command>`` for the newest checkpoint of the job, or None."""
    saved = newest_checkpoint(job_dir)
    if saved is None:
        return None
    task = list(hydra_cfg.overrides.task)
    keep = [o for o in task if not o.startswith(("checkpoint.resume=", "run_id=", "hydra.run.dir="))]
    # A sweep's job folder, or one given by hand, is named in full; a single run's by its run_id.
    named = multirun or any(o.startswith("hydra.run.dir=") for o in task)
    where = [f"hydra.run.dir={job_dir}"] if named else [f"run_id={job_dir.name}"]
    overrides = [*keep, *where, "checkpoint.resume=last"]
    if hydra_cfg.runtime.choices.get("launcher") in ("torchrun", "slurm"):
        how = "launch it again as before (torchrun / sbatch), with the overrides"
        return f"checkpoint {saved}; to resume, {how}: {shlex.join(overrides)}"
    return f"checkpoint {saved}; resume with: {shlex.join(['cocod-train', *overrides])}"


def _launch(cfg: DictConfig, job_dir: Path, workers: int, title: str) -> dict[str, Any]:
    from lightning_cocod.app.callbacks import progress_path
    from lightning_cocod.app.fit import threads_per_rank
    from lightning_cocod.app.identity import NETNS_ENV, net_namespace
    from lightning_cocod.launch import launch_workers
    from lightning_cocod.launch.progress import ProgressRelay

    threads = threads_per_rank(cfg.launcher, {})  # the cores shared by the workers, whatever this shell says
    rate = cfg.launcher.get("rate")
    topology = cfg.launcher.get("topology", "loopback")
    if rate and os.geteuid() == 0:  # without root the launcher warns that it runs unshaped
        where = "a loopback" if topology == "loopback" else "a link per worker, each"
        log.info("workers talk over %s shaped to %s", where, rate)
    relay = ProgressRelay(progress_path(job_dir), title, cfg.progress_every_s, log.info)
    env = {"OMP_NUM_THREADS": str(threads)}
    if net_namespace():  # a worker in another namespace than this was put behind the shaped link
        env[NETNS_ENV] = net_namespace()
    results = launch_workers(
        WORKER_TARGET,
        world_size=workers,
        rate=rate,
        topology=topology,
        args=[str(job_dir)],
        timeout_s=cfg.launcher.timeout_s,
        output_dir=job_dir / "workers",
        env=env,
        on_tick=relay.tick if cfg.progress_every_s else None,
    )
    return results[0]


def worker_main(job_dir: str) -> dict[str, Any]:
    """Entry of one rank started by ``launch_workers``: the job as its launcher saved it."""
    from lightning_cocod.app.fit import fit_run

    # Workers start with `python -P` (the package never shadowed by the user's folder); a model or
    # datamodule of the user's own, in that folder, is found after the package.
    sys.path.append(os.getcwd())
    cfg, identity = read_start(Path(job_dir))
    return fit_run(cfg, Path(job_dir), identity)


def main() -> None:
    import hydra
    from hydra.core.plugins import Plugins
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from hydra_plugins.lightning_cocod import CocodSweeper

    sys.path.append(os.getcwd())  # the user's own modules (model._target_=mymod.MyModule), after the package
    # Hydra finds plugins by listing hydra_plugins/, which an editable install's finder hides
    # (pkgutil sees no modules behind it): the app's sweeper is registered by hand.
    Plugins.instance().register(CocodSweeper)
    # Hydra re-raises what it refuses while composing, rather than print it in several lines.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")(run)()
    except ConfigError as err:
        refuse(err)
    except (HydraException, OmegaConfBaseException) as err:
        refuse(compose_error(err))
    except KeyboardInterrupt:
        # Outside a run's workers (those say how they stopped and how to resume): nothing to resume.
        print("cocod-train: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
