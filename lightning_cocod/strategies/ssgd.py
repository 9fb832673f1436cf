"""S-SGD: Lightning's own DDPStrategy, with this package's reliability."""

from __future__ import annotations

from typing import Any

from lightning_cocod.strategies.base import StrategyCommon


class SSGDMethod(StrategyCommon):
    """Synchronous SGD: ``x <- x - lr * mean_j grad_j`` every step, by Lightning's DDPStrategy
    (bucketed gradient all-reduce overlapped with backward): the strongest honest synchronous
    baseline, unchanged in what it computes.

    What this adds to DDPStrategy is the reliability the other strategies of this package have:
    ``timeout`` in seconds or a timedelta, validated; a stop on SIGTERM/SIGUSR1 to any one rank
    (all ranks stop at the next step after a checkpoint, ``fit`` raises ``Preempted``) instead of
    Lightning's rank-0-only broadcast, which stalls the other ranks; ``request_checkpoint()``;
    ``WorkerLostError`` from any collective a dead peer breaks; checkpoints written whole with a
    checksum, and verified when loaded. Every other option goes to DDPStrategy as it is.
    """

    def __init__(self, *, timeout: Any = None, start_method: str = "popen", **ddp_options: Any) -> None:
        super().__init__(**ddp_options, **self._common_init(timeout, start_method))
