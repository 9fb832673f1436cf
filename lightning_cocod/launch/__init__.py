"""Launch the ranks of a run as local processes, over one shaped loopback or a shaped link per node."""

from lightning_cocod.launch.cluster import TOPOLOGIES, Cluster, network, pernode_cluster
from lightning_cocod.launch.netns import (
    LatencyUnsupported,
    ShapedLink,
    format_latency,
    format_rate,
    parse_latency,
    parse_rate,
    shaped_namespace,
)
from lightning_cocod.launch.workers import (
    RESULT_ENV,
    LaunchError,
    WorkerFailed,
    WorkersPreempted,
    WorkersTimedOut,
    launch_workers,
    rank_and_world_size,
    write_result,
)

__all__ = [
    "RESULT_ENV",
    "TOPOLOGIES",
    "Cluster",
    "LatencyUnsupported",
    "LaunchError",
    "ShapedLink",
    "WorkerFailed",
    "WorkersPreempted",
    "WorkersTimedOut",
    "format_latency",
    "format_rate",
    "launch_workers",
    "network",
    "parse_latency",
    "parse_rate",
    "pernode_cluster",
    "rank_and_world_size",
    "shaped_namespace",
    "write_result",
]
