"""The options every front-end of the rounds shares (the Trainer strategies, the loop API and the
Fabric strategies): the launchers, the DDPStrategy options passed on, the collective timeout, a
rank's weight, and the check that every rank was given the same."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from lightning_cocod._options import invalid, is_number

# The ways a DDPStrategy (Trainer or Fabric) starts its processes.
START_METHODS = ("popen", "spawn", "fork", "forkserver")
# The DDPStrategy options passed on, besides the precision (``precision_plugin`` under the Trainer,
# ``precision`` under Fabric). The others configure the DDP wrapper or its comm hooks, which no
# strategy of ours builds.
PASSED_ON = (
    "accelerator",
    "parallel_devices",
    "cluster_environment",
    "checkpoint_io",
    "process_group_backend",
)
# torch's default for gloo/nccl process groups; Lightning's DDPStrategy uses the same.
DEFAULT_TIMEOUT = timedelta(seconds=1800)


def start_method(owner: str, value: Any) -> str:
    if value not in START_METHODS:
        raise invalid(owner, "start_method", value, "one of " + ", ".join(map(repr, START_METHODS)))
    return value


def parse_timeout(owner: str, value: Any) -> timedelta:
    """Seconds (what a YAML config can say) or a timedelta, positive and finite."""
    if value is None:
        return DEFAULT_TIMEOUT
    seconds = (
        value.total_seconds()
        if isinstance(value, timedelta)
        else float(value)
        if is_number(value)
        else math.nan
    )
    if not (math.isfinite(seconds) and seconds > 0):
        raise invalid(owner, "timeout", value, "a positive number of seconds or a datetime.timedelta")
    return timedelta(seconds=seconds)


def check_weight(owner: str, weight: Any, option: str = "weight") -> float | None:
    """A rank's share of every average: None (the plain mean) or a number in (0, 1]."""
    if weight is not None and not (is_number(weight) and 0 < weight <= 1):
        raise invalid(owner, option, weight, "None (the plain mean) or a number in (0, 1]")
    return weight


def disagreement(
    values: list[dict[str, Any]], remedy: str = "every rank must be started with the same config"
) -> str | None:
    """The first key on which a rank differs from rank 0 (``values``: every rank's, gathered), in
    words ending with ``remedy``, or None."""
    for key, mine in values[0].items():
        for rank, other in enumerate(values[1:], start=1):
            if other.get(key) != mine:
                return (
                    f"rank {rank} disagrees with rank 0 on {key}: {mine!r} on rank 0, "
                    f"{other.get(key)!r} on rank {rank}; {remedy}"
                )
    return None
