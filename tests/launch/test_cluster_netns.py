"""The per-node topology: one namespace per worker, its own shaped veth to a bridge.

Rates are checked by timing real transfers against the hand-computed time at the rate; the
expected times use the frame overhead tbf counts (a 1514-byte frame per 1448 bytes of TCP
payload) and the bucket a link keeps after idling.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lightning_cocod.launch import LatencyUnsupported, launch_workers, netns, parse_latency, pernode_cluster
from lightning_cocod.launch.cluster import (
    MAX_NODES,
    NODE_IFNAME,
    Cluster,
    burst_of,
    network,
    round_trip_seconds,
    transfer_times,
)
from tests.helpers.launchers import (
    has_left_our_network,
    namespaces_with,
    processes_with,
    signal_once_started,
    unique_prefix,
)

HELPERS = Path(__file__).resolve().parents[1] / "_launch_workers"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces, veth, bridges and tc need root"
)


def _netem_available() -> bool:
    name = f"cocodnetem{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        probe = [
            "ip",
            "netns",
            "exec",
            name,
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "netem",
            "delay",
            "1ms",
        ]
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


# --- inputs ----------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text, seconds",
    [
        ("50us", 50e-6),
        ("0.2ms", 0.2e-3),
        ("1s", 1.0),
        (" 3MS ", 3e-3),
        ("none", None),
        ("0", None),
        (None, None),
    ],
)
def test_parse_latency_reads_tc_times(text, seconds):
    assert parse_latency(text) == (pytest.approx(seconds) if seconds else None)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["50 us", "10ns", "fast", "-1ms", "ms", ""])
def test_parse_latency_rejects_other_strings_in_one_line(text):
    with pytest.raises(ValueError) as info:
        parse_latency(text)
    assert repr(text) in str(info.value) and "us, ms or s" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("nodes", [0, MAX_NODES + 1, True, 2.0])
def test_node_count_outside_one_subnet_is_a_one_line_error(nodes):
    with (
        pytest.raises(ValueError, match=rf"1 to {MAX_NODES} nodes") as info,
        pernode_cluster(nodes, "10mbit"),
    ):
        pass
    assert "\n" not in str(info.value)


@pytest.mark.timeout(10)
def test_unknown_topology_names_the_accepted_ones():
    with pytest.raises(ValueError, match="'mesh' is not understood; accepted: loopback, pernode"):
        network("mesh", 2, "10mbit")


@pytest.mark.timeout(10)
def test_a_node_bucket_is_small_next_to_a_model_but_covers_a_timer_tick():
    assert burst_of("pernode", 10_000_000) == 16 * 1024  # 4 ms at 10 Mbit/s is only 5 kB
    assert burst_of("pernode", 1_000_000_000) == 500_000  # 4 ms at 1 Gbit/s
    assert burst_of("loopback", 10_000_000) == 256 * 1024  # the shared loopback keeps its own


@pytest.mark.timeout(10)
def test_without_root_it_runs_on_the_loopback_and_says_so(monkeypatch, capfd):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pernode_cluster(4, "100mbit") as link:
        assert not link.in_namespaces and "root" in link.reason
        assert link.rank_env(3)["MASTER_ADDR"] == "127.0.0.1" and link.wrap(["x"], 3) == ["x"]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "WARNING" in line]
    assert (
        len(warnings) == 1
        and "UNSHAPED" in warnings[0]
        and "per-node" in warnings[0]
        and "100mbit" in warnings[0]
    )


@pytest.mark.timeout(10)
def test_each_rank_is_told_its_own_namespace_address_and_interface():
    cluster = Cluster(switch="s", nodes=("a", "b", "c"), rate=None)
    assert cluster.wrap(["python", "w.py"], 2) == ["ip", "netns", "exec", "c", "python", "w.py"]
    assert cluster.rank_env(2) == {
        "MASTER_ADDR": "10.213.0.1",  # rank 0's node: the rendezvous
        "GLOO_SOCKET_IFNAME": NODE_IFNAME,
        "TP_SOCKET_IFNAME": NODE_IFNAME,
    }
    assert [cluster.address(r) for r in range(3)] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]


# --- the topology --------------------------------------------------------------------------------


@needs_root
@pytest.mark.timeout(30)
def test_every_node_reaches_the_others_through_its_own_interface_only():
    prefix = unique_prefix()
    with pernode_cluster(3, None, name_prefix=prefix) as cluster:
        assert sorted(namespaces_with(prefix)) == sorted([cluster.switch, *cluster.nodes])
        for rank in range(3):
            links = subprocess.run(
                cluster.wrap(["ip", "-o", "link"], rank), capture_output=True, text=True, check=True
            )
            names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.stdout.splitlines())
            assert names == sorted(["lo", NODE_IFNAME])
            addrs = subprocess.run(
                cluster.wrap(["ip", "-o", "-4", "addr"], rank), capture_output=True, text=True, check=True
            )
            assert f"{cluster.address(rank)}/24" in addrs.stdout
        # Round trips around the ring of nodes: each pair exchanges its messages (how long that
        # takes is the machine's business, not this test's).
        trips = [round_trip_seconds(cluster, src, (src + 1) % 3, count=20) for src in range(3)]
        print(f"round trips between nodes: {[f'{1e6 * t:.0f} us' for t in trips]}")
        assert all(t > 0 for t in trips)
    assert namespaces_with(prefix) == []


@needs_root
@pytest.mark.timeout(60)
def test_each_node_link_is_shaped_both_ways_behind_a_non_blocking_switch():
    nbytes, bps = 1_000_000, 16_000_000

    def span(times):  # from the first flow's start to the last one's end
        return max(end for _, end in times) - min(start for start, _ in times)

    with pernode_cluster(4, "16mbit", name_prefix=unique_prefix()) as cluster:
        # Frames on the wire, less the bucket the idle link sends at once, at the rate.
        one_flow = (nbytes * 1514 / 1448 - cluster.burst) * 8 / bps  # 0.515 s
        # Flows on different links: neither slows the other (each crosses an upload and a download).
        apart = transfer_times(cluster, [(0, 1), (2, 3)], nbytes)
        # Two flows into node 2 (its download) and two out of node 3 (its upload), all at once.
        shared = transfer_times(cluster, [(0, 2), (1, 2), (3, 0), (3, 1)], nbytes)
    into_one, out_of_one = shared[:2], shared[2:]
    print(
        f"expected {one_flow:.3f} s; apart {[round(b - a, 3) for a, b in apart]}, "
        f"into one {span(into_one):.3f}, out of one {span(out_of_one):.3f}"
    )
    # No flow beats its link's rate (a bound no machine's speed can move): the links are shaped.
    assert all(end - start > 0.9 * one_flow for start, end in apart)
    # Through one node's link, in or out, two flows take twice as long: both ways are shaped.
    assert span(into_one) > 1.8 * one_flow and span(out_of_one) > 1.8 * one_flow
    # Flows on different links run at the full rate: each took less than halfway between one
    # flow's time and two sharing a link (0.75 of the shared spans measured here, under the same
    # load), where flows that shared a link would take as long as the shared ones.
    assert all(end - start < 0.75 * min(span(into_one), span(out_of_one)) for start, end in apart)
    for flows in (apart, shared):  # they did run at the same time
        assert max(start for start, _ in flows) < min(end for _, end in flows)


@needs_root
@pytest.mark.timeout(30)
def test_exception_inside_removes_every_namespace_and_its_processes():
    prefix, token = unique_prefix(), uuid.uuid4().hex
    with pytest.raises(KeyError), pernode_cluster(3, "100mbit", name_prefix=prefix) as cluster:
        sleeper = subprocess.Popen(
            cluster.wrap([sys.executable, "-c", "import time; time.sleep(30)", token], 2)
        )
        while not has_left_our_network(sleeper.pid):  # (the test's timeout guards against a hang)
            assert sleeper.poll() is None, "the sleeper ended before it was seen"
            time.sleep(0.05)
        assert len(namespaces_with(prefix)) == 4
        raise KeyError("inside the block")
    assert namespaces_with(prefix) == [] and processes_with(token) == []
    assert sleeper.wait(timeout=5) == -signal.SIGKILL


@needs_root
@pytest.mark.timeout(30)
def test_namespaces_of_a_dead_launcher_are_reclaimed_and_a_live_ones_kept():
    prefix = unique_prefix()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [f"{prefix}-{dead.pid}-abc123-sw", f"{prefix}-{dead.pid}-abc123-n0"]
    live = f"{prefix}-{os.getpid()}-abc123-n0"
    for name in (*stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with pernode_cluster(2, "100mbit", name_prefix=prefix) as cluster:
            assert sorted(namespaces_with(prefix)) == sorted([live, cluster.switch, *cluster.nodes])
    finally:
        for name in (*stale, live):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    assert namespaces_with(prefix) == []


@needs_root
@pytest.mark.timeout(30)
@pytest.mark.parametrize("topology", ["pernode", "loopback"])
def test_a_latency_this_kernel_cannot_add_is_one_line_and_leaves_nothing(topology):
    prefix = unique_prefix()
    if _netem_available():
        with network(topology, 2, "100mbit", latency="5ms", name_prefix=prefix) as link:
            trip = round_trip_seconds(link, count=10)
        # pernode: on node 0's and node 1's uploads; loopback: on lo, which both ways cross.
        assert trip >= 2 * 5e-3
    else:
        with (
            pytest.raises(LatencyUnsupported) as info,
            network(topology, 2, "100mbit", "5ms", name_prefix=prefix),
        ):
            pass
        message = str(info.value)
        assert (
            "\n" not in message
            and "netem" in message
            and "5000us" in message
            and "without a latency" in message
        )
    assert namespaces_with(prefix) == []


# --- workers in the topology ------------------------------------------------------------------------


@needs_root
@pytest.mark.timeout(60)
def test_workers_rendezvous_over_the_bridge_from_their_own_namespaces(tmp_path):
    prefix = unique_prefix()
    results = launch_workers(
        str(HELPERS / "allreduce_worker.py"),
        3,
        "1gbit",
        timeout_s=50,
        output_dir=tmp_path,
        name_prefix=prefix,
        topology="pernode",
    )
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["sum"] == [6.0] * 4 for r in results)
    spaces = {r["net_ns"] for r in results}
    assert len(spaces) == 3 and os.readlink("/proc/self/ns/net") not in spaces
    assert namespaces_with(prefix) == []


def _launch_sleepers(prefix: str, marker_dir: str) -> None:
    launch_workers(
        str(HELPERS / "sleeping_worker.py"),
        3,
        "100mbit",
        args=[marker_dir],
        timeout_s=60,
        output_dir=Path(marker_dir, "logs"),
        name_prefix=prefix,
        topology="pernode",
    )


@needs_root
@pytest.mark.timeout(40)
def test_terminated_launcher_removes_every_node_and_worker(tmp_path):
    prefix = unique_prefix()

    def running() -> None:
        assert len(namespaces_with(prefix)) == 4

    exitcode = signal_once_started(
        _launch_sleepers,
        (prefix, str(tmp_path)),
        tmp_path,
        3,
        signal.SIGTERM,
        while_running=running,
    )
    assert exitcode == 128 + signal.SIGTERM
    assert namespaces_with(prefix) == [] and processes_with(str(tmp_path)) == []
