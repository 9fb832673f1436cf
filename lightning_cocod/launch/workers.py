"""Start the ranks of one gloo run as separate processes, optionally behind slow links (the
topologies of ``launch_workers``).

Each rank is a `python -m MODULE` / `python SCRIPT` / `MODULE:FUNCTION` process given the env://
variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, NODE_RANK). Because LOCAL_RANK is
set, Lightning's LightningEnvironment reports `creates_processes_externally`, so a worker's
`Trainer(devices=world_size, num_nodes=1, ...)` becomes that one rank instead of spawning more.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_cocod._files import atomic_write, open_to_write
from lightning_cocod.exit_codes import PREEMPTED_EXIT_CODE
from lightning_cocod.launch.cluster import Link, network
from lightning_cocod.launch.netns import Terminated, signals_deferred, terminate

RESULT_ENV = "COCOD_RESULT_PATH"
_RESULT = "rank{}.result.json"  # in the run's log folder, one for each rank
# Runs a "module:function" target and hands its return value over as `write_result` does.
_CALL_FUNCTION = """\
import pkgutil, sys
result = pkgutil.resolve_name(sys.argv[1])(*sys.argv[2:])
from lightning_cocod.launch.workers import write_result
write_result(result)
"""
# Variables that make Lightning pick SLURM/TorchElastic/LSF/MPI instead of LightningEnvironment,
# which would then take world size and ranks from the outer job rather than from this launcher.
_FOREIGN_CLUSTER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "JSM_", "OMPI_", "PMI_", "PMIX_")
_FOREIGN_CLUSTER_KEYS = {"GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE"}
# Below Linux's ephemeral range (32768+): a rank connecting to the store before rank 0 listens can
# be handed MASTER_PORT itself as its source port and connect to itself.
_PORT_RANGE = (20000, 32000)


class LaunchError(RuntimeError):
    """A run started by `launch_workers` did not produce results; a subclass's ``fields`` name the
    arguments after the message, which become attributes."""

    fields: tuple[str, ...] = ()

    def __init__(self, message: str, *values: Any) -> None:
        # `args` holds every argument, so that the error unpickles whole (in a sweep's parent
        # process); the message is the first.
        super().__init__(message, *values)
        self.__dict__.update(zip(self.fields, values))

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WorkerFailed(LaunchError):
    fields = ("rank", "returncode", "stderr_tail", "log_dir")


class WorkersPreempted(LaunchError):
    """Every rank stopped at the same step on a preemption signal (exit code 75), after writing
    its checkpoint: the run can be resumed. ``interrupted``: the signal was Ctrl-C (SIGINT) to
    the launcher, which passed it on as a stop."""

    fields = ("log_dir", "interrupted")
    interrupted = False


class WorkersTimedOut(LaunchError):
    fields = ("running_ranks", "log_dir")


def write_result(result: Any, path: str | os.PathLike | None = None) -> None:
    """Called by a worker to hand its JSON-serialisable result to the launcher."""
    # Whole or absent, even if the worker is killed mid-write.
    atomic_write(path or os.environ[RESULT_ENV], json.dumps(result))


def rank_and_world_size(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This process's global rank and the run's number of ranks, as the launcher that started it
    says: `launch_workers` and torchrun set RANK and WORLD_SIZE (env://), srun SLURM_PROCID and
    SLURM_NTASKS; rank 0 of 1 outside any launch."""
    rank = env.get("RANK", env.get("SLURM_PROCID", "0"))
    return int(rank), int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))


def _module_root(module_name: str) -> Path | None:
    """The folder from which `module_name` was imported here (None: it has no file)."""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None:
        return None
    return Path(file).resolve().parents[module_name.count(".") + (Path(file).name == "__init__.py")]


def worker_command(target: str | Callable, args: Sequence[Any], python: str) -> tuple[list[str], list[str]]:
    """The command line for one rank, and the directories its PYTHONPATH needs for the target.

    `target` is a module ("lightning_cocod.bench_worker"), a script ("tests/w.py"), a
    "module:function" spec, or a top-level function; a function's return value becomes the result.
    """
    str_args = [str(a) for a in args]
    # -P: `python -c` and `-m` would put the current folder first on sys.path, so a folder named
    # like the package there (the clone's own folder, one level up) or a stray lightning_cocod.py
    # would be imported in every worker instead of the installed package. A script's own folder
    # is still put first, as the script expects.
    safe, paths = [python, "-P"], []
    if callable(target):
        module, qualname = target.__module__, target.__qualname__
        if module == "__main__" or "<locals>" in qualname:
            raise ValueError(
                f"worker target {qualname!r} must be a top-level function of an importable module, "
                f"not of {module!r}"
            )
        paths = [str(root)] if (root := _module_root(module)) else []
        target = f"{module}:{qualname}"
    elif target.endswith(".py") or os.sep in target:
        script = Path(target).resolve()
        if not script.is_file():
            raise FileNotFoundError(f"worker script {target!r} does not exist")
        return [python, str(script), *str_args], []
    if ":" in target:
        return [*safe, "-c", _CALL_FUNCTION, target, *str_args], paths
    return [*safe, "-m", target, *str_args], []


def _free_port(link: Link) -> int:
    if link.in_namespaces:
        # A namespace made for this run has no listeners yet: any port is free there.
        return random.randrange(*_PORT_RANGE)
    for port in random.sample(range(*_PORT_RANGE), 200):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    raise LaunchError(f"no free port on 127.0.0.1 in {_PORT_RANGE[0]}-{_PORT_RANGE[1]}")


def _run_env(env: dict[str, str] | None, pythonpath: list[str]) -> dict[str, str]:
    """What every rank's environment starts from: this process's with `env` on top, less what
    would make Lightning take the ranks from an outer job, with the target's folders on PYTHONPATH."""
    run_env = {
        k: v
        for k, v in {**os.environ, **(env or {})}.items()
        if k not in _FOREIGN_CLUSTER_KEYS and not k.startswith(_FOREIGN_CLUSTER_PREFIXES)
    }
    if pythonpath:
        run_env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [run_env.get("PYTHONPATH")])])
    run_env["PYTHONUNBUFFERED"] = "1"  # a killed worker's last words are what the failure report quotes
    return run_env


def _start(
    link: Link,
    cmd: list[str],
    rank: int,
    world_size: int,
    port: int,
    run_env: dict[str, str],
    log_dir: Path,
    cwd: str | os.PathLike | None,
    setup: Callable[[], None],
) -> subprocess.Popen:
    """Rank `rank` at its place in the network, its output to its logs, in a session of its own."""
    env = {
        **run_env,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "NODE_RANK": "0",
        RESULT_ENV: str(log_dir / _RESULT.format(rank)),
        **link.rank_env(rank),  # MASTER_ADDR and the interface gloo must use, per the topology
    }
    # The run's folder may be one others can write: a log never goes through a link planted in its place.
    stdout, stderr = (open_to_write(log_dir / f"rank{rank}.{stream}") for stream in ("stdout", "stderr"))
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        return subprocess.Popen(
            link.wrap(cmd, rank),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=setup,  # noqa: PLW1509 - see _child_setup_factory
        )


def _child_setup_factory() -> Callable[[], None]:
    prctl = getattr(ctypes.CDLL(None), "prctl", None)  # Linux only
    parent = os.getpid()

    def setup() -> None:
        # The launcher spawns with SIGINT/SIGTERM held; the worker must receive them again.
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if prctl is not None:
            # A launcher killed with SIGKILL runs no cleanup: the kernel then ends the workers.
            prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os._exit(1)

    return setup


def _tail(log_dir: Path, rank: int, lines: int = 20) -> str:
    """The last lines `rank` wrote to its stderr."""
    try:
        with open(log_dir / f"rank{rank}.stderr", "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def oom_kill_counts() -> dict[str, int] | None:
    """The kernel's OOM-kill counters of this process's memory cgroup and its ancestors, by file
    (cgroup v2 ``memory.events``, v1 ``memory.oom_control``), or None where none can be read. An
    ancestor's counter moves when its limit (a container's, a job's) is the one that was hit."""
    counts: dict[str, int] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            places = [
                (Path("/sys/fs/cgroup"), "memory.events"),
                (Path("/sys/fs/cgroup/unified"), "memory.events"),
            ]
        elif "memory" in controllers.split(","):
            places = [(Path("/sys/fs/cgroup/memory"), "memory.oom_control")]
        else:
            continue
        for root, name in places:
            # Inside a cgroup namespace the mount's root is this cgroup itself: the path is not there.
            folder = root / path.lstrip("/")
            while True:
                with contextlib.suppress(OSError, ValueError):
                    for entry in (folder / name).read_text().splitlines():
                        key, _, value = entry.partition(" ")
                        if key == "oom_kill":
                            counts[str(folder / name)] = int(value)
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
    return counts or None


class _MemoryKills:
    """Whether the kernel's OOM killer struck since the workers started: what a SIGKILL that
    nobody here sent most often is, and what a user must be told to look at."""

    def __init__(self, read: Callable[[], dict[str, int] | None]) -> None:
        self.read = read
        self.before = read()

    def since(self) -> int:
        after = self.read()
        if self.before is None or after is None:
            return 0
        return max((after[k] - n for k, n in self.before.items() if k in after), default=0)


def _describe_exit(code: int, memory: _MemoryKills | None = None) -> str:
    if code >= 0:
        return f"exited with code {code}"
    if code == -signal.SIGKILL and memory is not None and (kills := memory.since()) > 0:
        return (
            f"was killed by SIGKILL, probably out of memory (the kernel's OOM killer killed {kills} process(es) "
            "of this run's memory cgroup since the workers started)"
        )
    with contextlib.suppress(ValueError):
        return f"was killed by {signal.Signals(-code).name}"
    return f"was killed by signal {-code}"


def _failed(rank: int, code: int, what: str, log_dir: Path, quote: bool = True) -> WorkerFailed:
    """`what` happened to `rank` (its exit code `code`), with the last lines of its stderr."""
    tail = _tail(log_dir, rank)
    quoted = f"\n--- rank {rank} stderr (last lines) ---\n{tail}" if quote else ""
    return WorkerFailed(f"{what}; logs in {log_dir}{quoted}", rank, code, tail, str(log_dir))


def _read_results(world_size: int, log_dir: Path) -> list[Any]:
    results = []
    for rank in range(world_size):
        path = log_dir / _RESULT.format(rank)
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            what = (
                f"rank {rank} exited 0 but left no readable result at {path} ({err}); "
                "a worker must call lightning_cocod.launch.write_result"
            )
            raise _failed(rank, 0, what, log_dir, quote=False) from None
    return results


def launch_workers(
    target: str | Callable,
    world_size: int,
    rate: str | int | None = None,
    args: Sequence[Any] = (),
    *,
    timeout_s: float,
    output_dir: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    name_prefix: str = "cocod",
    grace_s: float = 5.0,
    python: str = sys.executable,
    cwd: str | os.PathLike | None = None,
    on_tick: Callable[[], None] | None = None,
    topology: str = "loopback",
    latency: str | float | None = None,
    stop_grace_s: float = 300.0,
    read_oom_kills: Callable[[], dict[str, int] | None] = oom_kill_counts,
) -> list[Any]:
    """Run `world_size` ranks of `target` over links shaped to `rate`.

    `topology` "loopback": all ranks on 127.0.0.1 in one namespace, one shaped loopback for the
    whole run; "pernode": each rank in its own namespace, its own link of `rate` each way to a
    common bridge, rendezvous at rank 0's address. `latency` adds a one-way delay (netem).

    Returns each rank's result (what it passed to `write_result`, or the function's return value),
    ordered by rank. Raises WorkerFailed on the first rank to exit non-zero and WorkersTimedOut
    after `timeout_s`; either way every worker and the namespace are gone before it returns.
    Logs are `rankN.stdout` / `rankN.stderr` in `output_dir`; without one, a temporary directory is
    used, removed after success and kept (and named in the error) after a failure. `on_tick` is
    called about twice a second while the workers run (a progress display).

    Preemption: ranks that stop together on a signal exit with PREEMPTED_EXIT_CODE after writing
    their checkpoint; once one does, the others get `stop_grace_s` to do the same, and
    WorkersPreempted is raised. SIGTERM/SIGHUP to this process is passed on to the workers with
    the same grace (they agree on a step and checkpoint), rather than killing them at once.

    A rank killed by SIGKILL while ``read_oom_kills`` (the kernel's OOM-kill counters) went up is
    said to be probably out of memory.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    cmd, pythonpath = worker_command(target, args, python)
    log_dir = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="cocod-launch-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world_size):
        (log_dir / _RESULT.format(rank)).unlink(missing_ok=True)
    run_env = _run_env(env, pythonpath)

    with network(topology, world_size, rate, latency, name_prefix=name_prefix) as link:
        port = _free_port(link)
        procs: list[subprocess.Popen] = []
        exits: queue.Queue[tuple[int, int]] = queue.Queue()
        # The ranks started and watched (a thread awaits each one's exit), and those still running.
        watched: list[int] = []
        pending: set[int] = set()
        setup = _child_setup_factory()
        memory = _MemoryKills(read_oom_kills)
        try:
            # Held signals: an interrupt cannot leave a started worker out of `procs`, and the
            # waiter threads inherit the held mask, so the main thread alone handles Ctrl-C. A
            # signal that came meanwhile is raised as the block is left, so that is still in
            # the `try` that turns it into a stop of the workers: they may already be running
            # (the signal came once they were up), and a stop must reach them.
            with signals_deferred():
                for rank in range(world_size):
                    procs.append(_start(link, cmd, rank, world_size, port, run_env, log_dir, cwd, setup))
                for rank, proc in enumerate(procs):
                    waiter = lambda r=rank, p=proc: exits.put((r, p.wait()))
                    threading.Thread(target=waiter, daemon=True, name=f"cocod-wait-rank{rank}").start()
                    watched.append(rank)
                    pending.add(rank)
            _wait(procs, exits, pending, timeout_s, log_dir, grace_s, on_tick, stop_grace_s, memory)
        except (Terminated, KeyboardInterrupt) as stop:
            # Ctrl-C too: the workers run in sessions of their own, so a terminal's SIGINT
            # reaches only this process; they are asked to stop as a preemption asks them, and
            # checkpoint. To the workers themselves, not their process groups: a worker's own
            # children (data loaders) killed under it would turn the stop into a crash. A
            # worker that had not yet installed its handler dies of the signal instead, and
            # the stop is re-raised: nothing was checkpointed.
            for rank in pending:
                with contextlib.suppress(ProcessLookupError):
                    procs[rank].send_signal(signal.SIGTERM)
            try:
                _wait(procs, exits, pending, stop_grace_s, log_dir, grace_s, on_tick, stop_grace_s, memory)
            except WorkersPreempted as preempted:
                preempted.interrupted = isinstance(stop, KeyboardInterrupt)
                raise
            except LaunchError:
                raise stop from None
            if len(watched) < world_size:
                # Only where the held signal still reached Python (a thread of the caller's
                # that does not hold it took it): not every rank was started.
                raise stop from None
            # Every rank had finished its work (the signal came as they ended, during their
            # test, say): the run is whole, and its results are what the caller asked for.
            what = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else f"signal {stop.code - 128}"
            print(
                f"launch_workers: {what} came as the workers were finishing; they finished, and their "
                "results are kept",
                file=sys.stderr,
                flush=True,
            )
        finally:
            with signals_deferred():
                terminate(procs, grace_s)
    results = _read_results(world_size, log_dir)
    if output_dir is None:  # after a failure it is kept, and named in the error
        shutil.rmtree(log_dir, ignore_errors=True)
    return results


def _exits(
    exits: queue.Queue, pending: set[int], within_s: float, on_tick: Callable[[], None] | None = None
) -> Iterator[tuple[int, int]]:
    """(rank, exit code) as each rank in ``pending`` (updated in place) exits, for ``within_s`` at most."""
    deadline = time.monotonic() + within_s
    while pending and (remaining := deadline - time.monotonic()) > 0:
        try:
            rank, code = exits.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            if on_tick is not None:
                on_tick()
            continue
        pending.discard(rank)
        yield rank, code


def _wait(
    procs: list[subprocess.Popen],
    exits: queue.Queue,
    pending: set[int],
    timeout_s: float,
    log_dir: Path,
    grace_s: float,
    on_tick: Callable[[], None] | None,
    stop_grace_s: float,
    memory: _MemoryKills | None = None,
) -> None:
    """Until every rank in ``pending`` (updated in place) has exited; a rank that fails or stops on
    a preemption signal, or ``timeout_s`` passing, ends every worker and raises."""
    for rank, code in _exits(exits, pending, timeout_s, on_tick):
        if code == PREEMPTED_EXIT_CODE:
            # The others stop at the same step, each within a round.
            failed = [(r, c) for r, c in _exits(exits, pending, stop_grace_s) if c != PREEMPTED_EXIT_CODE]
            terminate(procs, grace_s)
            if not pending and not failed:
                raise WorkersPreempted(
                    f"all {len(procs)} ranks stopped at one step on a preemption signal, after writing "
                    f"their checkpoint (exit code {PREEMPTED_EXIT_CODE}); logs in {log_dir}",
                    str(log_dir),
                )
            rank, code = failed[0] if failed else (min(pending), -signal.SIGKILL)
            how = _describe_exit(code, memory) if failed else "did not stop with it and was killed"
            raise _failed(rank, code, f"a rank stopped on a preemption signal but rank {rank} {how}", log_dir)
        if code != 0:
            # Ranks that fail on their own soon after are usually reacting to this one (their
            # peer vanished), so they are only listed; those we terminate are not failures.
            also = []
            while not exits.empty():  # this thread alone takes from it
                other, other_code = exits.get_nowait()
                if other_code != 0:
                    also.append(f"rank {other} {_describe_exit(other_code, memory)}")
            terminate(procs, grace_s)
            also_text = f" (also: {', '.join(also)})" if also else ""
            raise _failed(rank, code, f"rank {rank} {_describe_exit(code, memory)}{also_text}", log_dir)
    if pending:
        terminate(procs, grace_s)
        running = sorted(pending)
        tails = "".join(f"\n--- rank {r} stderr (last lines) ---\n{_tail(log_dir, r, 5)}" for r in running)
        what = f"workers did not finish within {timeout_s:g} s; killed ranks {running} (logs in {log_dir})"
        raise WorkersTimedOut(what + tails, running, str(log_dir))
