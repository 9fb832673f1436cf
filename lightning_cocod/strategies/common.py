"""The Lightning glue all four strategies of this package share, S-SGD included: options, the
rendezvous, launchers, Lightning's private attributes we patch, signals and requests, checkpoint
files.

Every Lightning hook is defined here once, in the order it runs. Where a strategy averages models
(``SyncStrategyBase``), the hook also calls its ``TrainerRounds`` (``driver``); S-SGD has none.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import override

from lightning_cocod._namespaces import HOMES
from lightning_cocod.rounds.checkpoint import (
    STATE_KEY,
    CheckpointError,
    atomic_save,
    read_checkpoint,
    remove_digest,
    remove_stale_temporaries,
)
from lightning_cocod.rounds.options import parse_timeout, start_method
from lightning_cocod.strategies.reliability import ReliableStrategy, RendezvousError, first_line
from lightning_cocod.strategies.rendezvous import RUN_ENVIRONMENT, init_default_group

if TYPE_CHECKING:
    from lightning_cocod.rounds.base import Rounds
    from lightning_cocod.strategies.driver import TrainerRounds


class StrategyCommon(ReliableStrategy):
    """Mixed in before a DDPStrategy class (see ``namespaces``)."""

    strategy_name: ClassVar[str] = ""  # its name in the registry (see ``namespaces``)
    driver: TrainerRounds | None = None  # the rounds run from the hooks below; S-SGD has none
    namespace: ClassVar[str] = ""  # the Lightning package of the DDPStrategy below this class

    def _common_init(self, timeout: Any, method: str) -> dict[str, Any]:
        """The DDPStrategy options every strategy of ours checks the same way."""
        name = type(self).__name__
        start_method(name, method)
        self._init_reliability()
        self._environment_before: dict[str, str | None] = {}
        return {"timeout": parse_timeout(name, timeout), "start_method": method}

    def _options(self) -> dict[str, Any]:
        """The algorithm's options, as the constructor takes them."""
        return {}

    def __str__(self) -> str:
        options = {**self._options(), "start_method": self._start_method}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())})"

    def __repr__(self) -> str:
        # What a Trainer of the other namespace shows when it refuses the object: where its class is.
        other, home = next((package, home) for package, home in HOMES.items() if package != self.namespace)
        return f"{self}, a {self.namespace} strategy: a {other} Trainer takes {home}.{type(self).__name__}"

    # -- set-up, in the order Lightning runs it --------------------------------------------

    @override
    def setup_distributed(self) -> None:
        self._steps = 0  # a fit's own count; a checkpoint's is restored later, in configure_ddp
        self._requested_path: str | None = None
        try:
            self.set_world_ranks()
            if self.world_size > 1 and self.cluster_environment is not None:
                if not self._environment_before:  # a stage's set-up, restored at its teardown
                    self._environment_before = {name: os.environ.get(name) for name in RUN_ENVIRONMENT}
                # Before Lightning's own set-up, which then finds the group initialised.
                env = self.cluster_environment
                init_default_group(
                    env.main_address,
                    env.main_port,
                    self.global_rank,
                    self.world_size,
                    self._get_process_group_backend(),
                    self._timeout,
                    self.root_device,
                )
            super().setup_distributed()
            # Our own process groups (collectives: the same order on every rank).
            if self.driver is not None:
                self.driver.open_groups()
            self._setup_requests()
        except RendezvousError:
            raise
        except (RuntimeError, TimeoutError) as err:  # DistStoreError, DistNetworkError, ...
            env = self.cluster_environment
            where = f"{env.main_address}:{env.main_port}" if env is not None else "MASTER_ADDR:MASTER_PORT"
            raise RendezvousError(
                f"rank {self.global_rank} could not reach the workers' rendezvous at {where} within "
                f"{self._timeout} ({first_line(err)}); check that rank 0 runs and that the address is reachable "
                "from this node"
            ) from None

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        launcher = self._launcher
        if launcher is None:  # torchrun, SLURM: the processes exist already
            return
        variants = f"strategy='{self.strategy_name}'" + (
            "" if self._start_method == "popen" else " (start_method 'popen')"
        )
        if self._start_method == "spawn" and getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError(
                f"{type(self).__name__}: start_method 'spawn' re-runs your script in every worker, and this script "
                'builds the Trainer outside an `if __name__ == "__main__":` block; put it inside one, or use '
                f"{variants}"
            )
        if (hasattr(sys, "ps1") or sys.flags.interactive) and not launcher.is_interactive_compatible:
            raise RuntimeError(
                f"{type(self).__name__} with start_method {self._start_method!r} cannot start workers from an "
                f"interactive session (Jupyter, python -i): use strategy='{self.strategy_name}_notebook' (fork), or "
                "run your code as a script"
            )
        if hasattr(launcher, "update_main_process_results"):
            # spawn/fork: fit runs in child processes; rank 0's figures come back to this object.
            launcher.get_extra_results = self._results_for_main_process
            launcher.update_main_process_results = self._update_from_worker

    @override
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if trainer.state.fn == "fit":
            self._patch_loops(trainer)
            if self.driver is not None:
                self.driver.check_fit()

    def _patch_loops(self, trainer: Any) -> None:
        # Lightning 2.6 broadcasts a SIGTERM flag from rank 0 before *every* training step. That is
        # a per-step rendezvous of all workers, which re-couples what a round decouples and, on a
        # slow link, queues behind a model all-reduce in flight; and it only hears rank 0's signal.
        # Signals travel with the request flags instead (``ReliableStrategy``).
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
        # Lightning's own handlers (installed after this, before training: its SIGTERM one runs a
        # broadcast no peer joins; its SLURM one saves a checkpoint from inside the handler) only
        # raise our stop request from the start, sanity check included.
        connector = trainer._signal_connector
        connector._sigterm_notifier_fn = connector._slurm_sigusr_handler_fn = self._on_signal

    # -- training --------------------------------------------------------------------------

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._check_same_start(self.lightning_module.trainer.global_step)  # a checkpoint is restored by now
        if self.driver is not None:
            self.driver.resume_rank_state()
        self._install_signal_handlers()  # after Lightning registered its own (they would replace ours)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.driver is not None:
            self.driver.log()
        super().on_train_batch_start(batch, batch_idx)
        self._act_on_requests(self.lightning_module.trainer)

    @override
    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        rounds = self.driver.rounds if self.driver is not None else None  # S-SGD: none
        if rounds is not None:
            with self._collective("launching a round"):
                rounds.run(rounds.begin_step)
            closure = self._exchanging_after(closure, rounds)
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._steps += 1
        if rounds is not None:
            with self._collective("finishing a round"):
                rounds.run(rounds.end_step)
        self._exchange_requests()
        return output

    def _exchanging_after(self, closure: Callable[[], Any], rounds: Rounds) -> Callable[[], Any]:
        """``closure`` (forward and backward), then the rounds' exchange before the optimizer's update."""

        def closure_then_exchange() -> Any:
            result = closure()
            with self._collective("exchanging gradients"):
                rounds.run(rounds.exchange)
            return result

        return closure_then_exchange

    @override
    def on_exception(self, exception: BaseException) -> None:
        # A peer may be gone: waiting on in-flight work could hang until the group timeout.
        if self._requests is not None:
            self._requests.abandon()
        if self.driver is not None:
            self.driver.rounds.abandon()
        super().on_exception(exception)

    @override
    def on_train_end(self) -> None:
        if self.driver is not None:
            self.driver.sync()
        super().on_train_end()
        self._drain_requests()
        # A checkpoint asked for in the last steps is still written; a stop is moot, fit is over.
        self._act_on_requests(self.lightning_module.trainer, stopping_allowed=False)

    @override
    def teardown(self) -> None:
        if self.driver is not None:
            self.driver.close()
        self._restore_signal_handlers()
        if self._requests is not None:
            with contextlib.suppress(Exception):
                self._drain_requests()
            self._requests.comm.destroy()
            self._requests = self._control_group = None
        super().teardown()
        for name, value in self._environment_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._environment_before = {}

    # -- checkpoint files --------------------------------------------------------------------

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        if self.driver is not None:
            self.driver.add_rank_state(checkpoint)  # on every rank: it gathers
        if self.global_rank == 0:
            atomic_save(self.checkpoint_io, checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Every rank reads the file as data (``weights_only=False``, said by hand, is the caller
        trusting it) and checks it against the integrity record it carries."""
        if "://" not in str(checkpoint_path) and self.global_rank == 0:
            # The folder is rid of what a writer killed mid-write left, while no rank writes to it.
            remove_stale_temporaries(checkpoint_path)
        load = lambda as_data: super(StrategyCommon, self).load_checkpoint(
            checkpoint_path, weights_only=as_data
        )
        try:
            checkpoint = read_checkpoint(
                checkpoint_path, load, trust=weights_only is False, warn_unverified=self.global_rank == 0
            )
        except CheckpointError as err:
            raise CheckpointError(f"rank {self.global_rank}: {err}") from None
        if self.driver is not None:
            self.driver.take_restored(checkpoint)
        return checkpoint

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        super().remove_checkpoint(filepath)
        if self.global_rank == 0:
            remove_digest(filepath)

    # -- spawn/fork launchers ----------------------------------------------------------------

    def _results_for_main_process(self, trainer: Any) -> dict[str, Any]:
        extra = type(self._launcher).get_extra_results(self._launcher, trainer)
        # Through a file, as Lightning sends the weights: Lightning joins the workers before it
        # reads its queue, so a message larger than a pipe holds (the per-round figures of a long
        # fit) blocked rank 0 in put() and the parent in join() for ever. The queue carries the path.
        fd, path = tempfile.mkstemp(prefix="cocod-worker-results-", suffix=".pkl")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(self.driver.results() if self.driver is not None else {}, fh)
        extra[STATE_KEY] = path
        return extra

    def _update_from_worker(self, trainer: Any, extra: dict[str, Any]) -> None:
        type(self._launcher).update_main_process_results(self._launcher, trainer, extra)
        path = extra[STATE_KEY]  # rank 0's _results_for_main_process always sends it
        try:
            with open(path, "rb") as fh:
                results = pickle.load(fh)  # written by our own rank 0 just now, in a file of our own
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if self.driver is not None:
            self.driver.take_results(results)
