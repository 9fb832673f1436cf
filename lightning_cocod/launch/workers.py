"""Start the ranks of one gloo run as separate processes, optionally behind slow links.

By default every rank runs on 127.0.0.1 in one namespace whose loopback is shaped (one link the
whole run shares); with ``topology="pernode"`` each rank runs in a namespace of its own behind
its own shaped link to a common bridge (``cluster.py``), at its own address.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_cocod._files import atomic_write
from lightning_cocod.exit_codes import PREEMPTED_EXIT_CODE
from lightning_cocod.launch.cluster import Cluster, network
from lightning_cocod.launch.netns import ShapedLink, Terminated, signals_deferred

RESULT_ENV = "COCOD_RESULT_PATH"
# Runs a "module:function" target and hands its return value over as `write_result` does.
_CALL_FUNCTION = """\
import importlib, sys
module, _, qualname = sys.argv[1].partition(":")
obj = importlib.import_module(module)
for part in qualname.split("."):
    obj = getattr(obj, part)
result = obj(*sys.argv[2:])
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
_STDERR_TAIL_LINES = 20


class LaunchError(RuntimeError):
    """A run started by `launch_workers` did not produce results."""


class WorkerFailed(LaunchError):
    def __init__(self, message: str, rank: int, returncode: int, stderr_tail: str, log_dir: str):
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.log_dir = log_dir

    def __reduce__(self):
        # The default would call __init__ with the message alone and fail to unpickle in a parent.
        return type(self), (str(self), self.rank, self.returncode, self.stderr_tail, self.log_dir)


class WorkersPreempted(LaunchError):
    """Every rank stopped at the same step on a preemption signal (exit code 75), after writing
    its checkpoint: the run can be resumed. ``interrupted``: the signal was Ctrl-C (SIGINT) to
    the launcher, which passed it on as a stop."""

    def __init__(self, message: str, log_dir: str, interrupted: bool = False):
        super().__init__(message)
        self.log_dir = log_dir
        self.interrupted = interrupted

    def __reduce__(self):
        return type(self), (str(self), self.log_dir, self.interrupted)


class WorkersTimedOut(LaunchError):
    def __init__(self, message: str, running_ranks: list[int], log_dir: str):
        super().__init__(message)
        self.running_ranks = running_ranks
        self.log_dir = log_dir

    def __reduce__(self):
        return type(self), (str(self), self.running_ranks, self.log_dir)


def write_result(result: Any, path: str | os.PathLike | None = None) -> None:
    """Called by a worker to hand its JSON-serialisable result to the launcher."""
    # Whole or absent, even if the worker is killed mid-write.
    atomic_write(path or os.environ[RESULT_ENV], json.dumps(result))


def _module_root(module_name: str) -> Path | None:
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    root = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    for _ in range(depth):
        root = root.parent
    return root


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
    safe = [python, "-P"]
    if callable(target):
        module, qualname = target.__module__, target.__qualname__
        if module == "__main__" or "<locals>" in qualname:
            raise ValueError(
                f"worker target {qualname!r} must be a top-level function of an importable module, "
                f"not of {module!r}"
            )
        root = _module_root(module)
        paths = [str(root)] if root else []
        target = f"{module}:{qualname}"
        return [*safe, "-c", _CALL_FUNCTION, target, *str_args], paths
    if target.endswith(".py") or os.sep in target:
        script = Path(target).resolve()
        if not script.is_file():
            raise FileNotFoundError(f"worker script {target!r} does not exist")
        return [python, str(script), *str_args], []
    if ":" in target:
        return [*safe, "-c", _CALL_FUNCTION, target, *str_args], []
    return [*safe, "-m", target, *str_args], []


def _free_port(link: ShapedLink | Cluster) -> int:
    if link.in_namespaces:
        # A namespace made for this run has no listeners yet: any port is free there.
        return random.randrange(*_PORT_RANGE)
    for _ in range(200):
        port = random.randrange(*_PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LaunchError(f"no free port on 127.0.0.1 in {_PORT_RANGE[0]}-{_PORT_RANGE[1]}")


def _worker_env(
    base: dict[str, str],
    rank: int,
    world_size: int,
    port: int,
    result: Path,
    pythonpath: list[str],
    network_env: dict[str, str],
) -> dict[str, str]:
    env = {
        k: v
        for k, v in base.items()
        if k not in _FOREIGN_CLUSTER_KEYS and not k.startswith(_FOREIGN_CLUSTER_PREFIXES)
    }
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    env.update(
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        # A killed worker's last words are what the failure report quotes.
        PYTHONUNBUFFERED="1",
    )
    env.update(network_env)  # MASTER_ADDR and the interface gloo must use, per the topology
    env[RESULT_ENV] = str(result)
    return env


def _child_setup_factory() -> Callable[[], None]:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def setup() -> None:
        # The launcher spawns with SIGINT/SIGTERM held; the worker must receive them again.
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if prctl is not None:
            # A launcher killed with SIGKILL runs no cleanup: the kernel then ends the workers.
            prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

    return setup


def _tail(path: Path, lines: int = _STDERR_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        # Each worker leads its own process group, so its own children (data loaders) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def _terminate(procs: list[subprocess.Popen], grace_s: float) -> None:
    alive = [p for p in procs if p.poll() is None]
    _signal_groups(alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    _signal_groups(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _read_results(world_size: int, result_paths: list[Path], log_dir: Path) -> list[Any]:
    results = []
    for rank in range(world_size):
        try:
            results.append(json.loads(result_paths[rank].read_text()))
        except (OSError, ValueError) as err:
            raise WorkerFailed(
                f"rank {rank} exited 0 but left no readable result at {result_paths[rank]} ({err}); "
                f"a worker must call lightning_cocod.launch.write_result; logs in {log_dir}",
                rank,
                0,
                _tail(log_dir / f"rank{rank}.stderr"),
                str(log_dir),
            ) from None
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
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    cmd, pythonpath = worker_command(target, args, python)
    log_dir = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="cocod-launch-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    result_paths = [log_dir / f"rank{rank}.result.json" for rank in range(world_size)]
    for path in result_paths:
        path.unlink(missing_ok=True)
    base_env = dict(os.environ if env is None else {**os.environ, **env})

    ok = False
    with network(topology, world_size, rate, latency, name_prefix=name_prefix) as link:
        port = _free_port(link)
        procs: list[subprocess.Popen] = []
        exits: queue.Queue[tuple[int, int]] = queue.Queue()
        # The ranks started and watched (a thread awaits each one's exit), and those still running.
        watched: list[int] = []
        pending: set[int] = set()
        setup = _child_setup_factory()
        try:
            try:
                # Held signals: an interrupt cannot leave a started worker out of `procs`, and the
                # waiter threads inherit the held mask, so the main thread alone handles Ctrl-C. A
                # signal that came meanwhile is raised as the block is left, so that is still in
                # the `try` that turns it into a stop of the workers: they may already be running
                # (the signal came once they were up), and a stop must reach them.
                with signals_deferred():
                    for rank in range(world_size):
                        with (
                            open(log_dir / f"rank{rank}.stdout", "wb") as out,
                            open(log_dir / f"rank{rank}.stderr", "wb") as err,
                        ):
                            procs.append(
                                subprocess.Popen(
                                    link.rank_command(cmd, rank),
                                    env=_worker_env(
                                        base_env,
                                        rank,
                                        world_size,
                                        port,
                                        result_paths[rank],
                                        pythonpath,
                                        link.rank_env(rank),
                                    ),
                                    cwd=cwd,
                                    stdin=subprocess.DEVNULL,
                                    stdout=out,
                                    stderr=err,
                                    start_new_session=True,
                                    preexec_fn=setup,  # noqa: PLW1509 - see _child_setup_factory
                                )
                            )
                    for rank, proc in enumerate(procs):
                        threading.Thread(
                            target=lambda r=rank, p=proc: exits.put((r, p.wait())),
                            daemon=True,
                            name=f"cocod-wait-rank{rank}",
                        ).start()
                        watched.append(rank)
                        pending.add(rank)
                _wait(procs, exits, pending, timeout_s, log_dir, grace_s, on_tick, stop_grace_s)
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
                    _wait(procs, exits, pending, stop_grace_s, log_dir, grace_s, on_tick, stop_grace_s)
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
                _warn_late_stop(stop)
            results = _read_results(world_size, result_paths, log_dir)
            ok = True
            return results
        finally:
            with signals_deferred():
                _terminate(procs, grace_s)
                if ok and output_dir is None:
                    shutil.rmtree(log_dir, ignore_errors=True)


def _warn_late_stop(stop: BaseException) -> None:
    what = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else f"signal {stop.code - 128}"
    print(
        f"launch_workers: {what} came as the workers were finishing; they finished, and their results "
        "are kept",
        file=sys.stderr,
        flush=True,
    )


def _await_preempted(
    procs: list[subprocess.Popen], exits: queue.Queue, pending: set[int], log_dir: Path, grace_s: float,
    stop_grace_s: float,
) -> None:
    """One rank left on a preemption: the others stop at the same step, each within a round."""
    deadline = time.monotonic() + stop_grace_s
    others = []
    while pending and time.monotonic() < deadline:
        try:
            rank, code = exits.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except queue.Empty:
            continue
        pending.discard(rank)
        others.append((rank, code))
    _terminate(procs, grace_s)
    failed = [(rank, code) for rank, code in others if code != PREEMPTED_EXIT_CODE]
    if not pending and not failed:
        raise WorkersPreempted(
            f"all {len(procs)} ranks stopped at one step on a preemption signal, after writing their "
            f"checkpoint (exit code {PREEMPTED_EXIT_CODE}); logs in {log_dir}",
            str(log_dir),
        )
    rank, code = failed[0] if failed else (min(pending), -signal.SIGKILL)
    tail = _tail(log_dir / f"rank{rank}.stderr")
    raise WorkerFailed(
        f"a rank stopped on a preemption signal but rank {rank} "
        f"{_describe_exit(code) if failed else 'did not stop with it and was killed'}; logs in {log_dir}\n"
        f"--- rank {rank} stderr (last lines) ---\n{tail}",
        rank,
        code,
        tail,
        str(log_dir),
    )


def _wait(
    procs: list[subprocess.Popen],
    exits: queue.Queue,
    pending: set[int],
    timeout_s: float,
    log_dir: Path,
    grace_s: float,
    on_tick: Callable[[], None] | None = None,
    stop_grace_s: float = 300.0,
) -> None:
    """Until every rank in ``pending`` (updated in place) has exited."""
    deadline = time.monotonic() + timeout_s
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _terminate(procs, grace_s)
            running = sorted(pending)
            tails = "".join(
                f"\n--- rank {r} stderr (last lines) ---\n{_tail(log_dir / f'rank{r}.stderr', 5)}"
                for r in running
            )
            raise WorkersTimedOut(
                f"workers did not finish within {timeout_s:g} s; killed ranks {running} "
                f"(logs in {log_dir}){tails}",
                running,
                str(log_dir),
            )
        try:
            rank, code = exits.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            if on_tick is not None:
                on_tick()
            continue
        pending.discard(rank)
        if code == PREEMPTED_EXIT_CODE:
            _await_preempted(procs, exits, pending, log_dir, grace_s, stop_grace_s)
        if code != 0:
            # Ranks that fail on their own soon after are usually reacting to this one (their
            # peer vanished), so they are only listed; those we terminate are not failures.
            also = []
            while True:
                try:
                    other, other_code = exits.get_nowait()
                except queue.Empty:
                    break
                if other_code != 0:
                    also.append(f"rank {other} {_describe_exit(other_code)}")
            _terminate(procs, grace_s)
            tail = _tail(log_dir / f"rank{rank}.stderr")
            also_text = f" (also: {', '.join(also)})" if also else ""
            raise WorkerFailed(
                f"rank {rank} {_describe_exit(code)}{also_text}; logs in {log_dir}\n"
                f"--- rank {rank} stderr (last lines) ---\n{tail}",
                rank,
                code,
                tail,
                str(log_dir),
            )
