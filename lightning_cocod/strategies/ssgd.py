"""S-SGD: Lightning's own DDPStrategy, with this package's reliability."""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_cocod._options import invalid, positive_int
from lightning_cocod.strategies.common import StrategyCommon

COMM_HOOKS = ("bf16", "fp16", "powersgd")


def _bf16_hook_on_gloo(process_group, bucket):  # type: ignore[no-untyped-def]
    """torch's bf16_compress_hook, under a name DDP does not refuse without NCCL: DDP turns that
    hook down by name on a build without CUDA, though gloo reduces bf16 as well. (No annotations:
    DDP compares them with its own classes, and this module's are strings.)"""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def comm_hook_options(comm_hook: str | None, powersgd_rank: int) -> dict[str, Any]:
    """DDPStrategy's ``ddp_comm_hook``/``ddp_comm_state`` for one of torch's own gradient
    compression hooks, by name: the baselines a user of DDP would pick on a slow link."""
    if comm_hook is None:
        return {}
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if comm_hook in ("bf16", "fp16"):
        return {"ddp_comm_hook": getattr(default_hooks, f"{comm_hook}_compress_hook")}
    if comm_hook == "powersgd":
        positive_int("SSGDStrategy", "powersgd_rank", powersgd_rank)
        # Compressed from the second step on (torch's default waits 1,000 steps): the comparison
        # with compressed CoCoD rounds is then about compression for the whole run.
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=2
        )
        return {"ddp_comm_hook": powerSGD_hook.powerSGD_hook, "ddp_comm_state": state}
    raise invalid("SSGDStrategy", "comm_hook", comm_hook, ", ".join(["None", *COMM_HOOKS]))


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

    ``comm_hook`` compresses the gradients with one of torch's DDP communication hooks: "bf16"
    or "fp16" (half the bytes), or "powersgd" (low-rank, ``powersgd_rank``, with error feedback).
    """

    def __init__(
        self,
        *,
        timeout: Any = None,
        start_method: str = "popen",
        comm_hook: str | None = None,
        powersgd_rank: int = 1,
        **ddp_options: Any,
    ) -> None:
        hook = comm_hook_options(comm_hook, powersgd_rank)
        if hook and "ddp_comm_hook" in ddp_options:
            raise ValueError("SSGDStrategy: give comm_hook or ddp_comm_hook, not both")
        self.comm_hook = comm_hook
        super().__init__(**ddp_options, **hook, **self._common_init(timeout, start_method))

    @override
    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is None or self.root_device.type == "cuda":
            return super()._register_ddp_hooks()
        # Lightning registers communication hooks on CUDA only; torch runs them on gloo as well,
        # which the comparison on CPU workers needs.
        hook = _bf16_hook_on_gloo if self.comm_hook == "bf16" else self._ddp_comm_hook
        self.model.register_comm_hook(state=self._ddp_comm_state, hook=hook)
