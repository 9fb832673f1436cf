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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

# Module-level so a test can point it at a binary that fails, to exercise the fallback.
IP = "ip"

_UNSHAPED_WORDS = {"none", "unshaped"}
# tc's kbit/mbit/gbit are SI (1000-based); so are these, so a rate reads the same in both.
_UNITS = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_MIN_BURST_BYTES = 256 * 1024
# tbf needs burst >= rate / HZ or it can never send at the full rate; 250 is the lowest HZ in
# common kernel configs, so rate_bytes / 250 is enough whatever HZ this kernel was built with.
_LOWEST_HZ = 250
_DURATION_UNITS = {"us": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1)}
_SETUP_ERRORS = (RuntimeError, OSError, subprocess.SubprocessError)


def _quantity(
    value: object, what: str, units: dict[str, int | Decimal], example: str, valid: Callable[[Decimal], bool]
) -> Decimal | None:
    """A number and one of `units` as tc writes them ("2.5gbit", "50us"), in the base unit; None
    for 'none'. Anything else, or a quantity that is not `valid`, is a one-line error."""
    text = str(value).strip().lower()
    if text in _UNSHAPED_WORDS:
        return None
    match = re.fullmatch(rf"(\d+(?:\.\d+)?)({'|'.join(units)})", text)
    quantity = Decimal(match[1]) * units[match[2]] if match else None
    if quantity is None or not valid(quantity):
        *most, last = units
        raise ValueError(
            f"{what} {value!r} is not understood: use a number followed by {', '.join(most)} or {last} "
            f"(e.g. {example}), or 'none'"
        )
    return quantity


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
    # A fraction of a bit per second cannot be given to tc, and zero would stall every worker.
    bps = _quantity(rate, "rate", _UNITS, "300mbit", lambda q: q > 0 and q == q.to_integral_value())
    return None if bps is None else int(bps)


def parse_latency(latency: str | float | None) -> float | None:
    """Seconds for a tc-style time ("50us", "0.2ms", "1s"); None for no added delay."""
    if latency is None:
        return None
    if isinstance(latency, (int, float)) and not isinstance(latency, bool):
        if not latency >= 0:
            raise ValueError(f"latency {latency!r} is not understood: seconds must be >= 0")
        return float(latency) or None
    if str(latency).strip() == "0":
        return None
    seconds = _quantity(latency, "latency", _DURATION_UNITS, "50us", lambda q: True)
    return float(seconds) if seconds else None


def format_latency(seconds: float | None) -> str:
    """A time as tc reads it, in whole microseconds; 'none' for None."""
    return "none" if seconds is None else f"{round(seconds * 1e6)}us"


def format_rate(bps: int | None) -> str:
    """The shortest tc-style spelling of a rate; 'unshaped' for None."""
    if bps is None:
        return "unshaped"
    for unit, scale in reversed(_UNITS.items()):  # the largest unit first
        if bps >= scale:
            return f"{format((Decimal(bps) / scale).normalize(), 'f')}{unit}"
    return f"{bps}bit"


def burst_bytes(bps: int, floor: int = _MIN_BURST_BYTES) -> int:
    """The token bucket of a link at `bps`: one timer tick's worth at the rate, at least `floor`."""
    return max(floor, -(-bps // (8 * _LOWEST_HZ)))


class LatencyUnsupported(RuntimeError):
    """An added delay was asked for and this kernel cannot delay packets (no netem)."""


@dataclass(frozen=True)
class ShapedLink:
    """What `shaped_namespace` set up: `name` is None and `reason` says why when unshaped."""

    name: str | None
    rate: int | None
    reason: str | None = None

    @property
    def in_namespaces(self) -> bool:
        """Whether the ranks run in namespaces made for this run (where any port is free)."""
        return self.name is not None

    shaped = in_namespaces

    @staticmethod
    def address(rank: int) -> str:
        return "127.0.0.1"

    def wrap(self, cmd: Sequence[str], rank: int = 0) -> list[str]:
        """`cmd` as rank `rank` runs it: in the one namespace every rank shares (as is when unshaped)."""
        return list(cmd) if self.name is None else [IP, "netns", "exec", self.name, *cmd]

    def rank_env(self, rank: int) -> dict[str, str]:
        # gloo and tensorpipe otherwise pick the interface the hostname resolves to, which does
        # not exist inside the namespace and would take the traffic off the shaped loopback.
        return {"MASTER_ADDR": self.address(rank), "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    # Never trust an inherited stdin: a hung `ip` waiting on a terminal would stall the cleanup.
    proc = subprocess.run([IP, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{IP} {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip_words(*args: str) -> list[str]:
    """The first word of each line `ip` prints, or nothing where it cannot run."""
    try:
        return [line.split()[0] for line in _ip(*args, check=False).stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def kill_namespace_processes(name: str, wait_s: float = 5.0) -> None:
    """SIGKILL every process inside the namespace and wait for them to go.

    `ip netns del` only removes the name: a process still inside keeps the namespace (and the
    workers' sockets) alive, so they must be gone first.
    """
    me, deadline = os.getpid(), time.monotonic() + wait_s
    while True:
        pids = [int(pid) for pid in _ip_words("netns", "pids", name) if pid.isdigit() and int(pid) != me]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        # Each process leads a group of its own, so its own children (a worker's data loaders) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def terminate(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to those of `procs` still running, SIGKILL to all after `grace_s`; each must lead a
    process group of its own (start_new_session)."""
    alive = [p for p in procs if p.poll() is None]
    _signal_groups(alive, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    _signal_groups(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def delete_namespaces(chosen: Callable[[str], bool]) -> None:
    """Delete every namespace whose name is `chosen`, and the processes in it. Cleanup goes on past
    a failure, which is only reported: it runs in `finally` blocks, where raising would hide the
    error that brought it there."""
    for name in _ip_words("netns", "list"):  # lines look like "NAME" or "NAME (id: 3)"
        if chosen(name):
            kill_namespace_processes(name)
            try:
                _ip("netns", "del", name)
            except _SETUP_ERRORS as err:
                _warn(f"could not delete network namespace {name}: {err}")


def remove_stale_namespaces(name_prefix: str) -> None:
    """Delete namespaces this module named for a launcher process that no longer exists.

    Only a SIGKILLed launcher leaves one behind; its name embeds the launcher's pid, so a
    namespace of a live run (this one's or a concurrent one's) is never touched.
    """
    # A cluster's namespaces add a role ("-sw", "-n3") to the same name.
    pattern = re.compile(rf"^{re.escape(name_prefix)}-(\d+)-[0-9a-f]+(?:-[a-z0-9]+)?$")

    def of_a_dead_launcher(name: str) -> bool:
        found = pattern.match(name)
        return found is not None and not os.path.exists(f"/proc/{found[1]}")

    delete_namespaces(of_a_dead_launcher)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so a second Ctrl-C cannot cut a cleanup short.

    A held signal is delivered (and raises) as soon as the block is left.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
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

    installed = {
        sig: signal.signal(sig, _raise)
        for sig in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(sig) == signal.SIG_DFL
    }
    try:
        yield
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def shape_device(
    namespace: str, device: str, bps: int | None, burst: int | None, delay: float | None
) -> None:
    """Rate-limit (tbf) and delay (netem, as the root, the tbf beneath it) what `device` sends.

    Raises LatencyUnsupported when a delay is asked for and the kernel has no netem.
    """
    tc = ("netns", "exec", namespace, "tc", "qdisc", "add", "dev", device)
    tbf = ("tbf", "rate", f"{bps}bit", "burst", f"{burst}b", "latency", "100ms")
    if delay is None:
        if bps is not None:
            _ip(*tc, "root", *tbf)
        return
    proc = _ip(
        *tc, "root", "handle", "1:", "netem", "delay", format_latency(delay), "limit", "100000", check=False
    )
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise LatencyUnsupported(
            f"cannot add a one-way delay of {format_latency(delay)}: tc could not create a netem qdisc "
            f"({why}), which this kernel may lack; run without a latency (the links then have their "
            "own, measured latency)"
        )
    if bps is not None:
        _ip(*tc, "parent", "1:1", "handle", "10:", *tbf)


Built = TypeVar("Built")


@contextlib.contextmanager
def namespaces_or_unshaped(
    name_prefix: str, build: Callable[[str], Built], instead_of: str, bps: int | None, delay: float | None
) -> Iterator[Built | ShapedLink]:
    """What `build(base)` makes of namespaces named `base` or `base-ROLE` for links of `bps` and
    `delay`, deleted on exit whatever happens; SIGTERM/SIGHUP meanwhile raise `Terminated`, so
    that the deletion runs.

    Without root, or when `build` fails, the block still runs, unshaped, on the host's loopback,
    and a one-line warning on stderr says so (running UNSHAPED `instead_of` the links asked for):
    a comparison that silently ran at full speed would be worse than no comparison. A latency
    this kernel cannot add (LatencyUnsupported) is raised instead, leaving nothing behind.
    """
    with terminate_as_exception():
        reason = "network namespaces need root"
        if os.geteuid() == 0:
            remove_stale_namespaces(name_prefix)
            # The pid lets remove_stale_namespaces tell a dead run's namespaces from a live one's.
            base = f"{name_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
            built = None
            try:
                # Held signals: an interrupt mid-setup is raised only in the `finally` below,
                # which deletes whatever part of the namespaces exists by then.
                with signals_deferred():
                    try:
                        built = build(base)
                    except LatencyUnsupported:
                        raise
                    except _SETUP_ERRORS as err:
                        reason = f"could not create the shaped network: {err}"
                if built is not None:
                    yield built
                    return
            finally:
                with signals_deferred():
                    # `base` itself, or a part of the whole named after it (a cluster's base-sw, base-n3)
                    delete_namespaces(lambda name: name == base or name.startswith(f"{base}-"))
        delayed = f" with {format_latency(delay)} delay" if delay is not None else ""
        _warn(f"running UNSHAPED {instead_of} at {format_rate(bps)}{delayed}: {reason}")
        yield ShapedLink(name=None, rate=None, reason=reason)


@contextlib.contextmanager
def shaped_namespace(
    rate: str | int | None, name_prefix: str = "cocod", latency: str | float | None = None
) -> Iterator[ShapedLink]:
    """A fresh network namespace whose loopback runs at `rate`, deleted on exit whatever happens.

    `latency` adds that one-way delay to every packet (netem). Without root, or where the
    namespace cannot be made, the block runs unshaped, as `namespaces_or_unshaped` says.
    """
    bps, delay = parse_rate(rate), parse_latency(latency)
    if bps is None and delay is None:
        with terminate_as_exception():
            yield ShapedLink(name=None, rate=None, reason="no rate requested")
        return
    burst = burst_bytes(bps) if bps is not None else None

    def build(name: str) -> ShapedLink:
        _ip("netns", "add", name)
        _ip("netns", "exec", name, IP, "link", "set", "lo", "up")
        shape_device(name, "lo", bps, burst, delay)
        return ShapedLink(name=name, rate=bps)

    with namespaces_or_unshaped(name_prefix, build, "instead of", bps, delay) as link:
        yield link
