"""Launch the ranks of a run as local processes, optionally over a rate-limited loopback."""

from lightning_cocod.launch.netns import ShapedLink, format_rate, parse_rate, shaped_namespace
from lightning_cocod.launch.workers import (
    RESULT_ENV,
    LaunchError,
    WorkerFailed,
    WorkersTimedOut,
    launch_workers,
    write_result,
)

__all__ = [
    "RESULT_ENV",
    "LaunchError",
    "ShapedLink",
    "WorkerFailed",
    "WorkersTimedOut",
    "format_rate",
    "launch_workers",
    "parse_rate",
    "shaped_namespace",
    "write_result",
]
