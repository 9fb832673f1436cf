"""What CoCoD-SGD, Local-SGD and Pipe-SGD share: a DDPStrategy without the DDP wrapper, whose
hooks drive the algorithm's ``Rounds`` (``lightning_cocod.rounds``, where what a round does lives).

``SyncStrategyBase`` builds the strategy's ``TrainerRounds`` (``driver.py``: what only Lightning
adds to the rounds), which ``StrategyCommon``'s hooks call, and overrides the Lightning hooks only
these strategies change: the initial broadcast in place of DDP's, checkpoints and evaluation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_cocod.rounds.base import Rounds, broadcast_from_rank_zero
from lightning_cocod.rounds.options import PASSED_ON
from lightning_cocod.strategies.common import StrategyCommon
from lightning_cocod.strategies.driver import TrainerRounds

# The DDPStrategy options we pass on (``rounds.options``); DDPStrategy passes any other keyword on
# to DistributedDataParallel, whose own are read from it.
_PASSED_ON = (*PASSED_ON, "precision_plugin")
_DDP_ONLY_OPTIONS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


def of_rounds(name: str) -> property:
    """The strategy's attribute ``name`` is its rounds'."""
    return property(
        lambda self: getattr(self.rounds, name), lambda self, value: setattr(self.rounds, name, value)
    )


class SyncStrategyBase(StrategyCommon):
    """Base of CoCoD-SGD, Local-SGD and Pipe-SGD; not registered itself. A subclass passes its
    ``Rounds`` (built with the strategy's own name for its messages) to ``__init__``."""

    comm_stats = of_rounds("comm_stats")
    weight = of_rounds("weight")  # this rank's share in every average; a sampling callback may set it
    _steps = of_rounds("steps")  # one count of optimizer steps, for the requests and the rounds

    def __init__(
        self,
        rounds: Callable[..., Rounds],
        *,
        average_buffers: bool = True,
        on_nonfinite: str = "raise",
        timeout: Any = None,
        start_method: str = "popen",
        **options: Any,
    ) -> None:
        name = type(self).__name__
        unsupported = {k: v for k, v in options.items() if k not in _PASSED_ON}
        if unsupported:
            bad = ", ".join(f"{k}={v!r}" for k, v in unsupported.items())
            wrapper = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
            why = (
                "they configure DDP's wrapper or comm hooks, which this strategy does not use"
                if set(unsupported) & ({*_DDP_ONLY_OPTIONS, *wrapper} - {"self", "module"})
                else "it accepts the algorithm's own options plus process_group_backend, timeout, start_method"
            )
            raise TypeError(f"{name} got unsupported option(s) {bad}: {why}")
        self.rounds = rounds(name, average_buffers=average_buffers, on_nonfinite=on_nonfinite)
        self.driver = TrainerRounds(self, self.rounds)
        super().__init__(**options, **self._common_init(timeout, start_method))

    def _options(self) -> dict[str, Any]:
        return self.rounds.options()

    def _request_lag(self) -> int:
        return self.rounds.request_lag()

    @override
    def configure_ddp(self) -> None:
        # No DistributedDataParallel: no per-step gradient all-reduce.
        broadcast_from_rank_zero(self.lightning_module)
        self.driver.start()

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Runs on every rank inside dump_checkpoint, before the file is written: the right
        # moment to make the weights consistent (save_checkpoint would be too late).
        self.driver.sync()
        return super().lightning_module_state_dict()

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self.driver.park_and_average()

    @override
    def on_validation_end(self) -> None:
        super().on_validation_end()
        self.rounds.unpark()

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self.driver.park_and_average()

    @override
    def on_test_end(self) -> None:
        super().on_test_end()
        self.rounds.unpark()
