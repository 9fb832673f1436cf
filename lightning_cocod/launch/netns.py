"""A private network namespace whose loopback is a rate-limited link.

Every byte the workers of a run exchange over 127.0.0.1 crosses the namespace's loopback, so one
token-bucket filter there shapes all of a run's traffic like one shared link:

    ip netns add NAME
    ip netns exec NAME ip link set lo up
    ip netns exec NAME tc qdisc add dev lo root tbf rate RATE burst BURST latency 100ms
    ip netns exec NAME <workers on 127.0.0.1>
    ip netns del NAME

With a latency, a netem qdisc delays every packet before the tbf shapes it (a kernel without
netem is refused with a one-line error). `cluster.py` builds the other topology, one namespace
per worker, from the same parts.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

# Module-level so a test can point it at a binary that fails, to exercise the fallback.
IP = "ip"

_UNSHAPED_WORDS = {"none", "unshaped"}
# tc's kbit/mbit/gbit are SI (1000-based); so are these, so a rate reads the same in both.
_UNITS = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_MIN_BURST_BYTES = 256 * 1024
# tbf needs burst >= rate / HZ or it can never send at the full rate; 250 is the lowest HZ in
# common kernel configs, so rate_bytes / 250 is enough whatever HZ this kernel was built with.
_LOWEST_HZ = 250
_LATENCY = "100ms"
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")


def parse_rate(rate: str | int | None) -> int | None:
    """Bits per second for a tc-style rate ("300mbit", "1gbit", "500kbit"); None for no shaping."""
    if rate is None:
        return None
    if isinstance(rate, bool):
        raise TypeError(f"rate {rate!r} is not understood: use a string like '300mbit', bits/s, or None")
    if isinstance(rate, int):
        if rate <= 0:
            raise ValueError(f"rate {rate!r} is not understood: bits per second must be positive")
        return rate
    text = rate.strip().lower()
    if text in _UNSHAPED_WORDS:
        return None
    match = _RATE_RE.match(text)
    bps = None
    if match:
        try:
            bps = Decimal(match.group(1)) * _UNITS[match.group(2)]
        except InvalidOperation:
            bps = None
    # A fraction of a bit per second cannot be given to tc, and zero would stall every worker.
    if bps is None or bps <= 0 or bps != bps.to_integral_value():
        raise ValueError(
            f"rate {rate!r} is not understood: use a number followed by kbit, mbit or gbit "
            f"(e.g. 300mbit), or 'none'"
        )
    return int(bps)


def parse_latency(latency: str | float | None) -> float | None:
    """Seconds for a tc-style time ("50us", "0.2ms", "1s"); None for no added delay."""
    if latency is None:
        return None
    if isinstance(latency, (int, float)) and not isinstance(latency, bool):
        if not latency >= 0:
            raise ValueError(f"latency {latency!r} is not understood: seconds must be >= 0")
        return float(latency) or None
    text = str(latency).strip().lower()
    if text in _UNSHAPED_WORDS or text == "0":
        return None
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(
            f"latency {latency!r} is not understood: use a number followed by us, ms or s (e.g. 50us), or 'none'"
        )
    return float(Decimal(match.group(1)) * Decimal(str(_DURATION_UNITS[match.group(2)]))) or None


def format_latency(seconds: float | None) -> str:
    """A time as tc reads it, in whole microseconds; 'none' for None."""
    return "none" if seconds is None else f"{round(seconds * 1e6)}us"


def format_rate(bps: int | None) -> str:
    """The shortest tc-style spelling of a rate; 'unshaped' for None."""
    if bps is None:
        return "unshaped"
    for unit, scale in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if bps >= scale:
            value = Decimal(bps) / scale
            text = format(value.normalize(), "f")
            return f"{text}{unit}"
    return f"{bps}bit"


def describe_link(bps: int | None, delay: float | None) -> str:
    return format_rate(bps) + (f" with {format_latency(delay)} delay" if delay is not None else "")


def burst_bytes(bps: int, floor: int = _MIN_BURST_BYTES) -> int:
    """The token bucket of a link at `bps`: one timer tick's worth at the rate, at least `floor`."""
    return max(floor, -(-bps // (8 * _LOWEST_HZ)))


LOOPBACK_ENV = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


class LatencyUnsupported(RuntimeError):
    """An added delay was asked for and this kernel cannot delay packets (no netem)."""


@dataclass(frozen=True)
class ShapedLink:
    """What `shaped_namespace` set up: `name` is None and `reason` says why when unshaped."""

    name: str | None
    rate: int | None
    reason: str | None = None
    burst: int | None = None
    latency: float | None = None

    @property
    def shaped(self) -> bool:
        return self.name is not None

    @property
    def in_namespaces(self) -> bool:
        """Whether the ranks run in namespaces made for this run (where any port is free)."""
        return self.name is not None

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` as run inside the namespace (unchanged when unshaped)."""
        if self.name is None:
            return list(cmd)
        return [IP, "netns", "exec", self.name, *cmd]

    def rank_command(self, cmd: list[str], rank: int) -> list[str]:
        """Every rank shares the one namespace."""
        return self.wrap(cmd)

    def rank_env(self, rank: int) -> dict[str, str]:
        # gloo and tensorpipe otherwise pick the interface the hostname resolves to, which does
        # not exist inside the namespace and would take the traffic off the shaped loopback.
        return dict(LOOPBACK_ENV)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    # Never trust an inherited stdin: a hung `ip` waiting on a terminal would stall the cleanup.
    proc = subprocess.run(
        [IP, *args], check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{IP} {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    try:
        proc = _ip("netns", "list", check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    # Lines look like "NAME" or "NAME (id: 3)".
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    try:
        proc = _ip("netns", "pids", name, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def kill_namespace_processes(name: str, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process inside the namespace and wait for them to go; returns those killed.

    `ip netns del` only removes the name: a process still inside keeps the namespace (and the
    workers' sockets) alive, so they must be gone first.
    """
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        pids = [pid for pid in namespace_pids(name) if pid != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)


def delete_namespace(name: str) -> None:
    kill_namespace_processes(name)
    if name in list_namespaces():
        _ip("netns", "del", name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_namespaces(name_prefix: str) -> list[str]:
    """Delete namespaces this module named for a launcher process that no longer exists.

    Only a SIGKILLed launcher leaves one behind; its name embeds the launcher's pid, so a
    namespace of a live run (this one's or a concurrent one's) is never touched.
    """
    # A cluster's namespaces add a role ("-sw", "-n3") to the same name.
    pattern = re.compile(rf"^{re.escape(name_prefix)}-(\d+)-[0-9a-f]+(?:-[a-z0-9]+)?$")
    removed = []
    for name in list_namespaces():
        match = pattern.match(name)
        if match and not _pid_alive(int(match.group(1))):
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                delete_namespace(name)
                removed.append(name)
    return removed


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so a second Ctrl-C cannot cut a cleanup short.

    A held signal is delivered (and raises) as soon as the block is left.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM/SIGHUP so that `finally` blocks get to clean up."""


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception for the duration of the block.

    By default they end Python at once, skipping every `finally`, which would leave the namespace
    and the workers behind. A handler someone else installed is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, _frame):
        raise Terminated(128 + signum)

    installed = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            installed[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def shape_device(namespace: str, device: str, bps: int | None, burst: int | None, delay: float | None) -> None:
    """Rate-limit (tbf) and delay (netem, as the root, the tbf beneath it) what `device` sends.

    Raises LatencyUnsupported when a delay is asked for and the kernel has no netem.
    """
    tc = ("netns", "exec", namespace, "tc", "qdisc", "add", "dev", device)
    tbf = ("tbf", "rate", f"{bps}bit", "burst", f"{burst}b", "latency", _LATENCY)
    if delay is None:
        if bps is not None:
            _ip(*tc, "root", *tbf)
        return
    proc = _ip(*tc, "root", "handle", "1:", "netem", "delay", format_latency(delay), "limit", "100000", check=False)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise LatencyUnsupported(
            f"cannot add a one-way delay of {format_latency(delay)}: tc could not create a netem qdisc "
            f"({why}), which this kernel may lack; run without a latency (the links then have their "
            "own, measured latency)"
        )
    if bps is not None:
        _ip(*tc, "parent", "1:1", "handle", "10:", *tbf)


def _try_create(name: str, bps: int | None, burst: int | None, delay: float | None) -> str | None:
    """Create and shape the namespace; the reason it could not be done, or None."""
    try:
        _ip("netns", "add", name)
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        return f"could not create a network namespace: {err}"
    try:
        _ip("netns", "exec", name, IP, "link", "set", "lo", "up")
        shape_device(name, "lo", bps, burst, delay)
    except LatencyUnsupported:
        delete_namespace(name)
        raise
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        delete_namespace(name)
        return f"could not shape the namespace's loopback: {err}"
    return None


@contextlib.contextmanager
def shaped_namespace(
    rate: str | int | None, name_prefix: str = "cocod", latency: str | float | None = None
) -> Iterator[ShapedLink]:
    """A fresh network namespace whose loopback runs at `rate`, deleted on exit whatever happens.

    `latency` adds that one-way delay to every packet (netem; LatencyUnsupported without it).
    Without root, or when the namespace cannot be made, the block still runs, unshaped, and a
    one-line warning on stderr says so: a comparison that silently ran at full speed would be
    worse than no comparison.
    """
    bps = parse_rate(rate)
    delay = parse_latency(latency)
    with terminate_as_exception():
        if bps is None and delay is None:
            yield ShapedLink(name=None, rate=None, reason="no rate requested")
            return
        if os.geteuid() != 0:
            reason = "network namespaces need root"
        else:
            remove_stale_namespaces(name_prefix)
            # The pid lets remove_stale_namespaces tell a dead run's namespace from a live one.
            name = f"{name_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
            burst = burst_bytes(bps) if bps is not None else None
            created = False
            try:
                # Held signals make setup all-or-nothing: an interrupt arriving mid-setup is
                # raised only once `created` says whether there is a namespace to delete.
                with signals_deferred():
                    reason = _try_create(name, bps, burst, delay)
                    created = reason is None
                if created:
                    yield ShapedLink(name=name, rate=bps, burst=burst, latency=delay)
                    return
            finally:
                if created:
                    with signals_deferred():
                        delete_namespace(name)
        _warn(f"running UNSHAPED instead of at {describe_link(bps, delay)}: {reason}")
        yield ShapedLink(name=None, rate=None, reason=reason)
