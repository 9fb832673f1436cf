"""What only Lightning adds to the rounds (``lightning_cocod.rounds``) under the Trainer: the
dedicated process groups, evaluation on the averaged model, each rank's optimizer and random
state in a checkpoint, and the figures sent to the loggers (the step itself is run straight from
``StrategyCommon.optimizer_step``).

``StrategyCommon``'s hooks call a ``TrainerRounds`` where the strategy has one (``driver``;
``SyncStrategyBase`` builds it, S-SGD has none), so no hook carries a stub for S-SGD to skip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from lightning_cocod.core import CommStats
from lightning_cocod.core.comm import TorchDistCommunicator
from lightning_cocod.rounds.base import Rounds
from lightning_cocod.rounds.checkpoint import STATE_KEY, gather_to_rank_zero, rng_state, set_rng_state
from lightning_cocod.rounds.options import check_weight

log = logging.getLogger(__name__)


class TrainerRounds:
    """A Trainer strategy's rounds, run from its hooks (``StrategyCommon`` calls each method below
    from the hook its docstring names)."""

    def __init__(self, strategy: Any, rounds: Rounds) -> None:
        self.strategy, self.rounds = strategy, rounds
        self.comm: TorchDistCommunicator | None = None  # the rounds' own process group
        self.codec_comm: TorchDistCommunicator | None = None  # compressed rounds' exchange
        self.restored: dict[str, Any] | None = None  # from a checkpoint, applied at set-up
        self.logged = 0  # rounds whose figures went to the loggers

    # -- set-up ------------------------------------------------------------------------------

    def open_groups(self) -> None:
        """``setup_distributed``: once the default group exists, on every rank."""
        s = self.strategy
        new_group = lambda: TorchDistCommunicator.on_new_group(
            s.root_device, backend=s._process_group_backend, timeout=s._timeout
        )
        if s.world_size > 1:
            self.comm = new_group()
            if self.rounds.codec is not None:  # compressed rounds talk on a group of their own
                self.codec_comm = new_group()

    def attach(self) -> None:
        s = self.strategy
        requests = s._requests.comm if s._requests is not None else None
        self.rounds.attach(
            s.lightning_module,
            self.comm,
            rank=s.global_rank,
            world_size=s.world_size,
            device=s.root_device,
            control=requests,
            codec_comm=self.codec_comm,
        )

    def start(self) -> None:
        """``configure_ddp``: the rounds start, from a checkpoint's state if one is being resumed."""
        self.attach()
        self.rounds.start()
        self.logged = 0
        if self.restored is not None:
            self.rounds.load_state(self.restored["strategy"])
            mine = self.own_restored_state()
            if mine is not None:
                # This rank's own share (rank 0's is in the strategy state of older checkpoints).
                self.rounds.weight = check_weight(
                    self.rounds.owner, mine.get("weight", self.rounds.weight), "the checkpoint's weight"
                )
                self.rounds.load_rank_state(mine.get("rounds", {}))

    def check_fit(self) -> None:
        """``setup`` of a fit: once the optimizers exist."""
        optimizers = self.strategy.optimizers
        if len(optimizers) != 1:
            raise ValueError(
                f"{self.rounds.owner} supports exactly one optimizer, configure_optimizers returned "
                f"{len(optimizers)}: a round counts the steps of one optimizer"
            )
        self.rounds.optimizers = optimizers

    # -- figures, consistency points and evaluation ------------------------------------------------

    def run(self, step: Callable[[], None], what: str) -> None:
        with self.strategy._collective(what):
            self.rounds.run(step)

    def log(self) -> None:
        """``on_train_batch_start``: the last finished round's figures, straight to the loggers at
        their cadence (floats: a ``LightningModule.log`` of a float would make a device tensor, a
        host sync on a GPU)."""
        s = self.strategy
        trainer = s.lightning_module.trainer
        finished = len(self.rounds.comm_stats.rounds)
        if s.global_rank != 0 or not trainer.loggers or finished == self.logged:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
            return
        self.logged = finished
        for logger in trainer.loggers:
            logger.log_metrics(self.rounds.figures(), step=trainer.global_step)

    def sync(self) -> None:
        """``on_train_end`` and a checkpoint: every rank's weights become the run's."""
        self.run(self.rounds.sync, "synchronising the workers")

    def park_and_average(self) -> None:
        if self.comm is None:
            return
        if not self.rounds.tensors:  # test/validate without fit: configure_ddp did not run
            self.attach()
        self.run(self.rounds.park_and_average, "averaging for evaluation")

    def close(self) -> None:
        """``teardown``, before the groups go."""
        self.rounds.close()
        for comm in (self.comm, self.codec_comm):
            if comm is not None:
                comm.destroy()
        self.comm = self.codec_comm = None
        self.restored = None  # a checkpoint loaded for test() must not reach a later fit()

    # -- each rank's state in a checkpoint ----------------------------------------------------

    def add_rank_state(self, checkpoint: dict[str, Any]) -> None:
        """``save_checkpoint``, on every rank, after ``lightning_module_state_dict`` made the weights
        agree: the weights are the run's, but each worker's optimizer state (momentum stays local)
        and random state are its own, gathered on rank 0."""
        s = self.strategy
        local = {
            "optimizer_states": [s.optimizer_state(o) for o in s.optimizers],
            "rng": rng_state(),
            "weight": self.rounds.weight,  # a share of its own under proportional sampling
            "rounds": self.rounds.rank_state(),
        }
        if s.world_size > 1 and not dist.is_initialized():
            # The main process after a spawn/fork fit (trainer.save_checkpoint there): it holds
            # rank 0's weights but no worker's optimizer or random state, so it records none.
            ranks: list[Any] | None = []
        else:
            with s._lightning_collective("gathering every rank's optimizer state for a checkpoint"):
                ranks = gather_to_rank_zero(local, s.world_size)
        if s.global_rank == 0:
            checkpoint[STATE_KEY] = {
                "strategy": self.rounds.state(),
                "world_size": s.world_size,
                "ranks": ranks,
            }

    def take_restored(self, checkpoint: dict[str, Any]) -> None:
        """``load_checkpoint``: what ``add_rank_state`` added, from a checkpoint just read."""
        s = self.strategy
        state = checkpoint.get(STATE_KEY)
        if state is None:
            return  # a plain Lightning checkpoint: weights and rank 0's optimizer state
        self.restored = state
        mine = self.own_restored_state()
        if mine is not None:
            checkpoint["optimizer_states"] = mine["optimizer_states"]
        elif s.global_rank == 0 and not state["ranks"]:
            log.warning(
                "resuming a checkpoint written by the main process after a spawn/fork fit: it holds the weights "
                "but no worker's optimizer state, so every worker starts with fresh momentum"
            )
        elif s.global_rank == 0:
            log.warning(
                f"resuming a {state['world_size']}-worker checkpoint on {s.world_size} workers: every "
                "worker starts from rank 0's optimizer state (momentum), so the run will not be reproduced exactly"
            )

    def own_restored_state(self) -> dict[str, Any] | None:
        """This rank's optimizer and random state from the checkpoint being resumed, when it holds
        one per worker of this run (same number of workers, written by the workers themselves)."""
        state, s = self.restored, self.strategy
        if state is None or state["world_size"] != s.world_size or len(state["ranks"]) != s.world_size:
            return None
        return state["ranks"][s.global_rank]

    def resume_rank_state(self) -> None:
        """``on_train_start``: this rank's random state, once Lightning has restored the rest."""
        mine = self.own_restored_state()
        if mine is not None:
            set_rng_state(mine["rng"])
        self.restored = None

    # -- spawn/fork launchers ----------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        """What a spawn/fork parent learns from rank 0 when fit ends."""
        return self.rounds.results()

    def take_results(self, results: dict[str, Any]) -> None:
        for name, value in results.items():
            setattr(self.rounds, name, CommStats.from_json(value) if name == "comm_stats" else value)
