"""What CoCoD-SGD, Local-SGD and Pipe-SGD share: a DDPStrategy without the DDP wrapper, whose
hooks drive the algorithm's ``Rounds`` (``lightning_cocod.rounds``, where what a round does lives).

This layer adds what only Lightning has: the initial broadcast in place of DDP's, the
dedicated process group, the optimizer step's closure, evaluation on the averaged model, each
rank's optimizer and random state in a checkpoint, and the figures sent to the loggers.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from typing_extensions import override

from lightning_cocod.core import CommStats
from lightning_cocod.core.comm import TorchDistCommunicator
from lightning_cocod.rounds.base import Rounds, broadcast_from_rank_zero
from lightning_cocod.rounds.checkpoint import STATE_KEY, gather_to_rank_zero, rng_state, set_rng_state
from lightning_cocod.rounds.options import PASSED_ON, check_weight
from lightning_cocod.strategies.common import StrategyCommon

log = logging.getLogger(__name__)

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
        super().__init__(**options, **self._common_init(timeout, start_method))
        self._comm: TorchDistCommunicator | None = None  # the rounds' own process group
        self._codec_comm: TorchDistCommunicator | None = None  # compressed rounds' exchange
        self._restored: dict[str, Any] | None = None  # from a checkpoint, applied at set-up

    def _options(self) -> dict[str, Any]:
        return self.rounds.options()

    def _request_lag(self) -> int:
        return self.rounds.request_lag()

    # -- set-up ------------------------------------------------------------------------------

    def _open_round_group(self) -> None:
        new_group = lambda: TorchDistCommunicator.on_new_group(
            self.root_device, backend=self._process_group_backend, timeout=self._timeout
        )
        if self.world_size > 1:
            self._comm = new_group()
            if self.rounds.codec is not None:  # compressed rounds talk on a group of their own
                self._codec_comm = new_group()

    def _attach(self) -> None:
        requests = self._requests.comm if self._requests is not None else None
        self.rounds.attach(
            self.lightning_module,
            self._comm,
            rank=self.global_rank,
            world_size=self.world_size,
            device=self.root_device,
            control=requests,
            codec_comm=self._codec_comm,
        )

    @override
    def configure_ddp(self) -> None:
        # No DistributedDataParallel: no per-step gradient all-reduce.
        broadcast_from_rank_zero(self.lightning_module)
        self._attach()
        self.rounds.start()
        self._logged_rounds = 0
        if self._restored is not None:
            self.rounds.load_state(self._restored["strategy"])
            mine = self._own_restored_state()
            if mine is not None:
                # This rank's own share (rank 0's is in the strategy state of older checkpoints).
                self.rounds.weight = check_weight(
                    self.rounds.owner, mine.get("weight", self.rounds.weight), "the checkpoint's weight"
                )
                self.rounds.load_rank_state(mine.get("rounds", {}))

    def _check_fit(self) -> None:
        if len(self.optimizers) != 1:
            raise ValueError(
                f"{type(self).__name__} supports exactly one optimizer, configure_optimizers returned "
                f"{len(self.optimizers)}: a round counts the steps of one optimizer"
            )
        self.rounds.optimizers = self.optimizers

    # -- the step ----------------------------------------------------------------------------

    def _begin_step(self) -> None:
        with self._collective("launching a round"):
            self.rounds.run(self.rounds.begin_step)

    def _exchanging_after(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        def closure_then_exchange() -> Any:
            result = closure()
            with self._collective("exchanging gradients"):
                self.rounds.run(self.rounds.exchange)
            return result

        return closure_then_exchange

    def _end_step(self) -> None:
        with self._collective("finishing a round"):
            self.rounds.run(self.rounds.end_step)

    def _abandon_in_flight(self) -> None:
        self.rounds.abandon()

    def _log_rounds(self) -> None:
        """The last finished round's figures, straight to the loggers at their cadence (floats: a
        ``LightningModule.log`` of a float would make a device tensor, a host sync on a GPU)."""
        trainer = self.lightning_module.trainer
        finished = len(self.rounds.comm_stats.rounds)
        if self.global_rank != 0 or not trainer.loggers or finished == self._logged_rounds:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
            return
        self._logged_rounds = finished
        for logger in trainer.loggers:
            logger.log_metrics(self.rounds.figures(), step=trainer.global_step)

    # -- consistency points ----------------------------------------------------------------

    def _sync_point(self) -> None:
        with self._collective("synchronising the workers"):
            self.rounds.run(self.rounds.sync)

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Runs on every rank inside dump_checkpoint, before the file is written: the right
        # moment to make the weights consistent (save_checkpoint would be too late).
        self._sync_point()
        return super().lightning_module_state_dict()

    def _park_and_average(self) -> None:
        if self._comm is None:
            return
        if not self.rounds.tensors:  # test/validate without fit: configure_ddp did not run
            self._attach()
        with self._collective("averaging for evaluation"):
            self.rounds.run(self.rounds.park_and_average)

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._park_and_average()

    @override
    def on_validation_end(self) -> None:
        super().on_validation_end()
        self.rounds.unpark()

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self._park_and_average()

    @override
    def on_test_end(self) -> None:
        super().on_test_end()
        self.rounds.unpark()

    def _close_rounds(self) -> None:
        self.rounds.close()
        for comm in (self._comm, self._codec_comm):
            if comm is not None:
                comm.destroy()
        self._comm = self._codec_comm = None
        self._restored = None  # a checkpoint loaded for test() must not reach a later fit()

    # -- each rank's state in a checkpoint ----------------------------------------------------

    def _add_rank_state(self, checkpoint: dict[str, Any]) -> None:
        # Called on every rank, after lightning_module_state_dict made the weights agree: the
        # weights are the run's, but each worker's optimizer state (momentum stays local) and
        # random state are its own, gathered on rank 0.
        local = {
            "optimizer_states": [self.optimizer_state(o) for o in self.optimizers],
            "rng": rng_state(),
            "weight": self.rounds.weight,  # a share of its own under proportional sampling
            "rounds": self.rounds.rank_state(),
        }
        if self.world_size > 1 and not dist.is_initialized():
            # The main process after a spawn/fork fit (trainer.save_checkpoint there): it holds
            # rank 0's weights but no worker's optimizer or random state, so it records none.
            ranks: list[Any] | None = []
        else:
            with self._lightning_collective("gathering every rank's optimizer state for a checkpoint"):
                ranks = gather_to_rank_zero(local, self.world_size)
        if self.global_rank == 0:
            checkpoint[STATE_KEY] = {
                "strategy": self.rounds.state(),
                "world_size": self.world_size,
                "ranks": ranks,
            }

    def _take_restored(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(STATE_KEY)
        if state is None:
            return  # a plain Lightning checkpoint: weights and rank 0's optimizer state
        self._restored = state
        mine = self._own_restored_state()
        if mine is not None:
            checkpoint["optimizer_states"] = mine["optimizer_states"]
        elif self.global_rank == 0 and not state["ranks"]:
            log.warning(
                "resuming a checkpoint written by the main process after a spawn/fork fit: it holds the weights "
                "but no worker's optimizer state, so every worker starts with fresh momentum"
            )
        elif self.global_rank == 0:
            log.warning(
                f"resuming a {state['world_size']}-worker checkpoint on {self.world_size} workers: every "
                "worker starts from rank 0's optimizer state (momentum), so the run will not be reproduced exactly"
            )

    def _own_restored_state(self) -> dict[str, Any] | None:
        """This rank's optimizer and random state from the checkpoint being resumed, when it holds
        one per worker of this run (same number of workers, written by the workers themselves)."""
        state = self._restored
        if state is None or state["world_size"] != self.world_size or len(state["ranks"]) != self.world_size:
            return None
        return state["ranks"][self.global_rank]

    def _resume_rank_state(self) -> None:
        mine = self._own_restored_state()
        if mine is not None:
            set_rng_state(mine["rng"])
        self._restored = None

    # -- spawn/fork launchers ----------------------------------------------------------------

    def _worker_results(self) -> dict[str, Any]:
        return self.rounds.results()

    def _take_worker_results(self, results: dict[str, Any]) -> None:
        for name, value in results.items():
            setattr(self.rounds, name, CommStats.from_json(value) if name == "comm_stats" else value)
