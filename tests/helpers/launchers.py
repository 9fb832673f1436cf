"""What the launcher tests look at from outside: the namespaces and processes a run leaves, and
a launcher forked, signalled once its workers are up, and waited for."""

import multiprocessing
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def unique_prefix() -> str:
    """A namespace prefix no other test or run uses."""
    return f"cocodtest{uuid.uuid4().hex[:6]}"


def namespaces_with(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def processes_with(token: str) -> list[int]:
    """Live processes whose command line contains `token` (zombies have an empty one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry))
    return found


def has_left_our_network(pid: int) -> bool:
    """Whether process `pid` has entered another network namespace. `ip netns exec` is listed
    with the wrapped command line before it enters one, so seeing the line is not enough."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def signal_once_started(
    target: Callable[..., Any],
    args: tuple,
    marker_dir: Path,
    ranks: int,
    sig: int,
    while_running: Callable[[], None] = lambda: None,
) -> int | None:
    """Runs ``target(*args)`` in a forked launcher (no second import of Lightning); once
    ``ranks`` workers have left their ``started.*`` file in ``marker_dir``, calls
    ``while_running`` and sends ``sig`` to the launcher. Returns its exit code. It waits for
    events, however long they take: the calling test's own timeout is the guard against a hang."""
    launcher = multiprocessing.get_context("fork").Process(target=target, args=args)
    launcher.start()
    try:
        while len(list(marker_dir.glob("started.*"))) < ranks:
            assert launcher.is_alive(), "the launcher ended before its workers started"
            time.sleep(0.05)
        while_running()
        os.kill(launcher.pid, sig)
        launcher.join()
    finally:
        launcher.kill()
        launcher.join()
    return launcher.exitcode
