"""A function run on N gloo ranks in forked processes, as torchrun would run a plain script: each
rank initialises the default group itself. Bounded in time: a rank still running at the deadline
is killed and the test fails."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(fn: Callable[..., Any], rank: int, world: int, port: int, out: Path, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
        payload: tuple = ("ok", fn(rank, *args))
    except BaseException as err:  # noqa: BLE001 - reported to the test
        payload = ("error", f"{type(err).__name__}: {err}", traceback.format_exc())
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps(payload))
    os._exit(0)  # no atexit handlers of the parent's pytest in a forked child


def run_ranks(
    fn: Callable[..., Any], out: Path, *args: Any, world: int = 2, timeout: float = 90
) -> list[tuple]:
    """``("ok", fn(rank, *args))`` or ``("error", "Type: message", traceback)`` of every rank."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.pkl"):
        stale.unlink()
    port, context = _free_port(), multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(fn, r, world, port, out, args)) for r in range(world)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + timeout
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, process in enumerate(ranks) if process.is_alive()]
    for process in ranks:
        process.kill()
        process.join()
    assert not hung, f"rank(s) {hung} still ran after {timeout} s"
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def results(payloads: list[tuple]) -> list[Any]:
    """Every rank's return value, or a failure showing the first rank's traceback."""
    failed = [p for p in payloads if p[0] != "ok"]
    assert not failed, failed[0][2]
    return [p[1] for p in payloads]
