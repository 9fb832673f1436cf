"""A cluster on one machine: every worker in a namespace of its own, with its own shaped link.

    switch namespace   br0 -- p0, p1, ... pN-1            tbf on pI: node I's download
    node I namespace   cocod  10.213.0.(I+1)/24 (+ lo)    tbf on cocod: node I's upload

Each node reaches the bridge through a veth pair whose two ends are both shaped to the per-node
rate, so N workers behave as N machines with their own NICs on a non-blocking switch (the
bridge forwards in software, far faster than the rates shaped here); an optional one-way delay
(netem) sits on each node's upload. The shared-loopback topology (`netns.shaped_namespace`)
instead squeezes all of a run's traffic through one pipe.

The veth pairs are created from the switch namespace straight into the node namespaces, so the
host's own namespace never holds an interface of a run: the bridge and veth names are unique
because the namespaces holding them are (launcher pid + random), and deleting the namespaces
removes everything, including what a SIGKILLed launcher left (`remove_stale_namespaces`).
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from lightning_cocod.launch import netns
from lightning_cocod.launch.netns import (
    ShapedLink,
    _ip,
    burst_bytes,
    namespaces_or_unshaped,
    parse_latency,
    parse_rate,
    shape_device,
    shaped_namespace,
)

TOPOLOGIES = ("loopback", "pernode")
# Bytes a link may send at once after idling. A per-node link's bucket is small next to a
# model (tokens saved while a worker computes would otherwise let part of every all-reduce pass
# at full speed), but must hold what the link sends while the kernel's timer is late: 4 ms at
# the rate (tbf's own rule of rate / HZ for the lowest common HZ) or 16 KiB (ten frames), whichever is more.
_MIN_LINK_BURST = 16 * 1024
NODE_IFNAME = "cocod"  # the same in every node namespace: GLOO_SOCKET_IFNAME names it
SUBNET = "10.213.0"  # private, and only ever configured inside namespaces of a run
MAX_NODES = 253  # host addresses .1-.253 of the /24


@dataclass(frozen=True)
class Cluster:
    """What `pernode_cluster` set up: rank i runs in `nodes[i]` at `address(i)`."""

    switch: str
    nodes: tuple[str, ...]
    rate: int | None
    burst: int | None = None
    in_namespaces = True

    @staticmethod
    def address(rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def wrap(self, cmd: Sequence[str], rank: int) -> list[str]:
        return [netns.IP, "netns", "exec", self.nodes[rank], *cmd]

    def rank_env(self, rank: int) -> dict[str, str]:
        # Rank 0's store listens on its node's address; gloo must use the node's own veth.
        return {
            "MASTER_ADDR": self.address(0),
            "GLOO_SOCKET_IFNAME": NODE_IFNAME,
            "TP_SOCKET_IFNAME": NODE_IFNAME,
        }


Link = Cluster | ShapedLink  # what a run's ranks are started in: `wrap`, `rank_env`, `address`


def burst_of(topology: str, bps: int) -> int:
    """The bucket, in bytes, of a link of this topology at `bps`."""
    return burst_bytes(bps, floor=_MIN_LINK_BURST) if topology == "pernode" else burst_bytes(bps)


@contextlib.contextmanager
def pernode_cluster(
    nodes: int, rate: str | int | None, latency: str | float | None = None, name_prefix: str = "cocod"
) -> Iterator[Link]:
    """`nodes` namespaces on one bridge, each link shaped to `rate` both ways, deleted on exit.

    Without root, or where the topology cannot be built, the block runs on the plain loopback (an
    unshaped ShapedLink), as `namespaces_or_unshaped` says.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"a per-node cluster has 1 to {MAX_NODES} nodes (one /24), got {nodes!r}")
    bps, delay = parse_rate(rate), parse_latency(latency)
    burst = burst_of("pernode", bps) if bps is not None else None

    def build(base: str) -> Cluster:
        """The switch, then each node and its shaped veth pair; raises on the first failure."""
        sw = f"{base}-sw"
        cluster = Cluster(sw, tuple(f"{base}-n{rank}" for rank in range(nodes)), bps, burst)
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for rank, node in enumerate(cluster.nodes):
            port = f"p{rank}"
            _ip("netns", "add", node)
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", NODE_IFNAME, "netns", node)
            _ip("-n", sw, "link", "set", port, "master", "br0", "up")
            _ip("-n", node, "addr", "add", f"{cluster.address(rank)}/24", "dev", NODE_IFNAME)
            _ip("-n", node, "link", "set", NODE_IFNAME, "up")
            _ip("-n", node, "link", "set", "lo", "up")
            shape_device(node, NODE_IFNAME, bps, burst, delay)
            shape_device(sw, port, bps, burst, None)
        return cluster

    instead_of = "on one loopback instead of per-node links"
    with namespaces_or_unshaped(name_prefix, build, instead_of, bps, delay) as link:
        yield link


def network(
    topology: str,
    nodes: int,
    rate: str | int | None,
    latency: str | float | None = None,
    name_prefix: str = "cocod",
) -> contextlib.AbstractContextManager[Link]:
    """The links of a run: one shared loopback ("loopback") or a link per node ("pernode")."""
    if topology == "loopback":
        return shaped_namespace(rate, name_prefix=name_prefix, latency=latency)
    if topology == "pernode":
        return pernode_cluster(nodes, rate, latency, name_prefix=name_prefix)
    raise ValueError(f"topology {topology!r} is not understood; accepted: {', '.join(TOPOLOGIES)}")


# -- measuring the links ------------------------------------------------------------------------

# Run with `python -c` inside the namespaces: stdlib only, so a probe costs a bare interpreter.
# "serve ADDR NBYTES COUNT": print the port, then COUNT times receive NBYTES and answer one byte.
# "send ADDR PORT NBYTES COUNT START": from monotonic time START, COUNT times send NBYTES and await
# the answer, printing when each exchange began and ended (monotonic seconds, the machine's clock
# in every namespace). An exchange of one byte is a round trip.
_PROBE = """\
import socket, sys, time
role, addr, *rest = sys.argv[1:]
if role == "serve":
    nbytes, count = map(int, rest)
    server = socket.create_server((addr, 0))
    print(server.getsockname()[1], flush=True)
    conn = server.accept()[0]
else:
    port, nbytes, count = map(int, rest[:3])
    conn = socket.create_connection((addr, port))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if role == "send":
    time.sleep(max(0.0, float(rest[3]) - time.monotonic()))
for _ in range(count):
    if role == "serve":
        received = len(conn.recv(nbytes, socket.MSG_WAITALL))  # all of it, unless the peer left
        if received < nbytes:
            raise SystemExit(f"peer closed after {received} of {nbytes} bytes")
        conn.sendall(b"k")
    else:
        began = time.monotonic()
        conn.sendall(b"x" * nbytes)
        if conn.recv(1) != b"k":
            raise SystemExit("no answer from the receiver")
        print(began, time.monotonic())
"""


def _probe(
    link: Link, flows: Sequence[tuple[int, int]], nbytes: int, count: int, timeout_s: float
) -> list[list[tuple[float, float]]]:
    """For each (source rank, destination rank) flow, when each of its `count` exchanges began and ended."""
    python = [sys.executable, "-P"]  # -P: nothing from the current folder (see workers.worker_command)
    servers, clients = [], []
    pipe = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "text": True, "start_new_session": True}
    try:
        for _, dst in flows:
            cmd = [*python, "-c", _PROBE, "serve", link.address(dst), str(nbytes), str(count)]
            servers.append(subprocess.Popen(link.wrap(cmd, dst), **pipe))
        ports = [server.stdout.readline().strip() for server in servers]
        # A common start, so concurrent flows overlap although their interpreters start apart.
        start = repr(time.monotonic() + 0.5 + 0.1 * len(flows))
        for (src, dst), port in zip(flows, ports):
            cmd = [*python, "-c", _PROBE, "send", link.address(dst), port, str(nbytes), str(count), start]
            clients.append(subprocess.Popen(link.wrap(cmd, src), **pipe))
        outputs = []
        for client in clients:
            out, _ = client.communicate(timeout=timeout_s)
            if client.returncode != 0:
                raise RuntimeError(
                    f"link probe failed (exit code {client.returncode}); output: {out.strip()!r}"
                )
            times = [float(word) for word in out.split()]
            outputs.append(list(zip(times[::2], times[1::2])))
        return outputs
    finally:
        netns.terminate([*clients, *servers], grace_s=0)


def transfer_times(
    link: Link, flows: Sequence[tuple[int, int]], nbytes: int, timeout_s: float = 60
) -> list[tuple[float, float]]:
    """When each (source rank, destination rank) flow began and finished delivering `nbytes`
    (time.monotonic), all started together (unless an interpreter starts later than 0.5 s)."""
    return [exchanges[0] for exchanges in _probe(link, flows, nbytes, 1, timeout_s)]


def round_trip_seconds(link: Link, src: int = 0, dst: int = 1, count: int = 200) -> float:
    """Median round trip of one byte between two ranks over TCP (no Nagle): twice the one-way latency
    plus two passes through each side's network stack."""
    return statistics.median(end - began for began, end in _probe(link, [(src, dst)], 1, count, 30)[0])


def measured_round_trip(
    topology: str, rate: str | int | None, latency: str | float | None = None
) -> float | None:
    """The round trip between two ranks of a fresh network of this kind; None when it would run
    unshaped on the host (no root), which says nothing about the links asked for."""
    with network(topology, 2, rate, latency, name_prefix="cocod-probe") as link:
        return round_trip_seconds(link) if link.in_namespaces else None
