"""What every strategy of ours shares: a DDPStrategy without the DDP wrapper.

Each worker keeps its own model; a subclass decides what to communicate around each optimizer
step (``_before_step`` / ``_after_step`` / ``_exchange``) and what is in flight (``_flush``).
The base does the rest once: the initial broadcast, the dedicated process group, the
consistency points (evaluation on the averaged model, a sync before a checkpoint, identical
weights when fit ends), instrumentation, argument checks and registration.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.overrides.distributed import _sync_module_states
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_cocod.core import (
    CommStats,
    CommunicationError,
    Communicator,
    FlatBuffer,
    Handle,
    RoundRecord,
    average_blocking,
    has_nonfinite,
)
from lightning_cocod.core.comm import TorchDistCommunicator
from lightning_cocod.strategies.checkpointing import (
    STATE_KEY,
    atomic_save,
    gather_to_rank_zero,
    rng_state,
    set_rng_state,
)
from lightning_cocod.strategies.health import NonFinitePolicy
from lightning_cocod.strategies.logging import CommStatsLogger
from lightning_cocod.strategies.rendezvous import init_loopback_group

log = logging.getLogger(__name__)

# torch's default for gloo/nccl process groups; Lightning's DDPStrategy uses the same.
_DEFAULT_TIMEOUT = timedelta(seconds=1800)

# DDPStrategy options that configure the DDP wrapper or its comm hooks, which we never build.
_DDP_ONLY_OPTIONS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


class WorkerLostError(RuntimeError):
    """Our collective failed: another worker died or stalled, or the network broke."""


class RendezvousError(RuntimeError):
    """The workers could not meet: the store was unreachable or the others never came."""


def _local_sigterm_check(trainer: pl.Trainer) -> Callable[[], None]:
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    def check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    return check


class SyncStrategyBase(NonFinitePolicy, DDPStrategy):
    """Base of CoCoD-SGD, Local-SGD and Pipe-SGD. Not registered itself.

    Decisions (see the reference notes):
    - momentum and all other optimizer state stay local to each worker;
    - floating-point buffers (BatchNorm running stats) go through the same averaging as the
      parameters when ``average_buffers`` (integer buffers such as num_batches_tracked stay local);
    - validation and test see the average of the workers' models, then the live weights return,
      so evaluating never changes the training trajectory;
    - a checkpoint and the end of fit are synchronisation points: pending communication is
      finished and merged, then every rank takes the average, so any rank's state is the run's;
    - NaN/Inf on any worker is caught before it reaches another worker's average: every rank
      raises ``NonFiniteError`` (``on_nonfinite="raise"``), or with ``"skip"`` the update is
      dropped and the bad workers restart from a healthy worker's model.
    """

    strategy_name: ClassVar[str] = ""
    strategy_description: ClassVar[str] = ""

    def __init__(
        self,
        *,
        average_buffers: bool = True,
        on_nonfinite: str = "raise",
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = _DEFAULT_TIMEOUT,
        start_method: str = "popen",
        **unsupported: Any,
    ) -> None:
        name = type(self).__name__
        if unsupported:
            bad = ", ".join(f"{k}={v!r}" for k, v in unsupported.items())
            why = (
                "they configure DDP's wrapper or comm hooks, which this strategy does not use"
                if set(unsupported) & set(_DDP_ONLY_OPTIONS)
                else "it accepts the algorithm's own options plus process_group_backend, timeout, start_method"
            )
            raise TypeError(f"{name} got unsupported option(s) {bad}: {why}")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"{name}: on_nonfinite={on_nonfinite!r} is not one of 'raise', 'skip'")
        if not isinstance(average_buffers, bool):
            raise TypeError(f"{name}: average_buffers must be True or False, got {average_buffers!r}")
        if start_method not in ("popen", "spawn", "fork", "forkserver"):
            raise ValueError(
                f"{name}: start_method={start_method!r} is not one of 'popen', 'spawn', 'fork', 'forkserver'"
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
        )
        self.average_buffers = average_buffers
        self.on_nonfinite = on_nonfinite
        self.skipped: list[tuple[int, list[int]]] = []  # (step, bad ranks) recovered by on_nonfinite="skip"
        self.comm_stats = CommStats()
        self.peak_buffer_bytes = 0
        # This rank's share in every average (sum over ranks = 1); None is the plain mean.
        self.weight: float | None = None
        self._comm: Communicator | None = None
        self._tensors: list[Tensor] = []
        self._scratch: FlatBuffer | None = None
        self._steps = 0
        self._parked_in: FlatBuffer | None = None  # holds the live weights while evaluation sees the average
        self._restored: dict[str, Any] | None = None  # from a checkpoint, applied at set-up

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"average_buffers": self.average_buffers}
        if self.on_nonfinite != "raise":
            options["on_nonfinite"] = self.on_nonfinite
        return options

    def __repr__(self) -> str:
        options = {**self._options(), "start_method": self._start_method}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())})"

    # -- set-up -------------------------------------------------------------------------

    @override
    def setup_distributed(self) -> None:
        try:
            self._init_groups()
        except RendezvousError:
            raise
        except (RuntimeError, TimeoutError) as err:  # DistStoreError, DistNetworkError, ...
            env = self.cluster_environment
            where = f"{env.main_address}:{env.main_port}" if env is not None else "MASTER_ADDR:MASTER_PORT"
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RendezvousError(
                f"rank {self.global_rank} could not reach the workers' rendezvous at {where} within "
                f"{self._timeout} ({first}); check that rank 0 runs and that the address is reachable "
                "from this node"
            ) from None

    def _init_groups(self) -> None:
        if self.num_nodes == 1 and self.world_size > 1 and self.cluster_environment is not None:
            # Done before Lightning's own set-up, which then finds the group initialised.
            self.set_world_ranks()
            init_loopback_group(
                self.cluster_environment.main_address,
                self.cluster_environment.main_port,
                self.global_rank,
                self.world_size,
                self._get_process_group_backend(),
                self._timeout or _DEFAULT_TIMEOUT,
                self.root_device,
            )
        super().setup_distributed()
        if self.world_size > 1:
            self._comm = TorchDistCommunicator.on_new_group(
                self.root_device, backend=self._process_group_backend, timeout=self._timeout
            )

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            if len(self.optimizers) != 1:
                raise ValueError(
                    f"{type(self).__name__} supports exactly one optimizer, configure_optimizers returned "
                    f"{len(self.optimizers)}: a round counts the steps of one optimizer"
                )
            if not any(isinstance(cb, CommStatsLogger) for cb in trainer.callbacks):
                trainer.callbacks.insert(0, CommStatsLogger())
            # Lightning 2.6 broadcasts a SIGTERM flag from rank 0 before *every* training step
            # (_TrainingEpochLoop._broadcast_sigterm_tensor). That is a per-step rendezvous of
            # all workers, which re-couples what the round decouples (each step waits for the
            # slowest worker) and, on a slow link, queues behind the model all-reduce in flight.
            # Check the signal locally instead: a worker that got SIGTERM stops as Lightning
            # would, and the others stop at their next collective (schedulers signal every task).
            trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = _local_sigterm_check(trainer)

    @override
    def configure_ddp(self) -> None:
        # No DistributedDataParallel: no per-step gradient all-reduce. DDP's constructor is what
        # normally broadcasts rank 0's weights, so do that here.
        assert isinstance(self.model, pl.LightningModule)
        _sync_module_states(self.model)
        self._tensors = self._model_tensors()
        self._steps = 0
        self.comm_stats = CommStats()
        if self._comm is not None:
            self._build(self._tensors)
        if self._restored is not None:
            self._load_strategy_state(self._restored["strategy"])

    def _model_tensors(self) -> list[Tensor]:
        module = self.lightning_module
        tensors = [p.detach() for p in module.parameters() if p.requires_grad]
        if self.average_buffers:
            tensors += [b.detach() for b in module.buffers() if b.is_floating_point()]
        return tensors

    def _build(self, tensors: list[Tensor]) -> None:
        """Allocate what the algorithm needs (flat buffers); called once the model is placed."""

    # -- the step -----------------------------------------------------------------------

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        if self._comm is None:  # one worker: plain local SGD, nothing to talk to
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        with torch.no_grad(), self._collective("launching a round"):
            self._before_step()

        def closure_then_exchange() -> Any:
            result = closure()
            with torch.no_grad(), self._collective("exchanging gradients"):
                self._exchange()
            return result

        output = super().optimizer_step(optimizer, closure_then_exchange, model, **kwargs)
        self._steps += 1
        with torch.no_grad(), self._collective("finishing a round"):
            self._after_step()
        return output

    @contextlib.contextmanager
    def _collective(self, what: str) -> Any:
        try:
            yield
        except CommunicationError as err:
            raise WorkerLostError(
                f"{type(self).__name__}, rank {self.global_rank}, optimizer step {self._steps}, {what}: {err}. "
                f"Collectives time out after {self._timeout} (the strategy's `timeout`); resume from the "
                "last checkpoint with trainer.fit(..., ckpt_path=...)"
            ) from err

    def _before_step(self) -> None:
        """Before forward/backward of an optimizer step."""

    def _exchange(self) -> None:
        """After backward, before the optimizer applies the gradients."""

    def _after_step(self) -> None:
        """After the optimizer step; ``self._steps`` already counts it."""

    def _flush(self) -> None:
        """Finish whatever is in flight so the weights are this algorithm's current state."""

    # -- helpers for subclasses ----------------------------------------------------------

    def _scratch_buffer(self) -> FlatBuffer:
        if self._scratch is None:
            self._scratch = FlatBuffer(self._tensors)
        return self._scratch

    def _average_now(self, what: str = "average", swap: bool = False) -> Handle:
        """Blocking weighted average of the model tensors on every rank (see average_blocking);
        a worker with non-finite values stops everyone before anything is sent."""
        assert self._comm is not None
        check = lambda buckets: self._agree_finite(has_nonfinite(buckets), what)  # noqa: E731
        return average_blocking(self._tensors, self._scratch_buffer(), self._comm, self.weight, check, swap)

    def _flat_buffers(self) -> list[FlatBuffer]:
        """Every flat buffer this strategy holds (its memory overhead, in model copies)."""
        return [self._scratch] if self._scratch is not None else []

    @property
    def buffer_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._flat_buffers())

    def _record(self, handle: Handle, launch_step: int, nbytes: int, also_waited: float = 0.0) -> None:
        """``also_waited``: time blocked on other collectives of the round before this handle's
        wait (it is exposed communication just the same)."""
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)
        exposed = handle.exposed_seconds + also_waited
        self.comm_stats.add(
            RoundRecord(launch_step, self._steps, handle.comm_seconds, exposed, nbytes, handle.launched_at)
        )

    # -- consistency points ----------------------------------------------------------------

    def _sync_point(self) -> None:
        if self._comm is None or not self._tensors:
            return
        self._unpark()
        with torch.no_grad(), self._collective("synchronising the workers"):
            self._flush()
            self._average_now("synchronisation point")
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self._sync_point()

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Runs on every rank inside dump_checkpoint, before the file is written: the right
        # moment to make the weights consistent (save_checkpoint would be too late).
        self._sync_point()
        return super().lightning_module_state_dict()

    def _park_and_average(self) -> None:
        if self._comm is None:
            return
        if not self._tensors:  # test/validate without fit: configure_ddp did not run
            self._tensors = self._model_tensors()
        buffer = self._scratch_buffer()
        with torch.no_grad(), self._collective("averaging for evaluation"):
            self._average_now("evaluation", swap=True)  # model <- average, buffer <- live weights
        self._parked_in = buffer

    def _unpark(self) -> None:
        if self._parked_in is not None:
            with torch.no_grad():
                self._parked_in.swap(self._tensors)
            self._parked_in = None

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._park_and_average()

    @override
    def on_validation_end(self) -> None:
        super().on_validation_end()
        self._unpark()

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self._park_and_average()

    @override
    def on_test_end(self) -> None:
        super().on_test_end()
        self._unpark()

    # -- checkpoints -----------------------------------------------------------------------

    def _strategy_state(self) -> dict[str, Any]:
        """What resuming needs of the strategy itself (subclasses add theirs)."""
        return {"class": type(self).__name__, "steps": self._steps, "weight": self.weight}

    def _load_strategy_state(self, state: dict[str, Any]) -> None:
        if state.get("class") != type(self).__name__:
            raise ValueError(
                f"the checkpoint was written by {state.get('class')}, not {type(self).__name__}: "
                "resume with the same strategy"
            )
        self._steps = state["steps"]
        self.weight = state["weight"]

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        # Called on every rank (after lightning_module_state_dict made the weights agree).
        local = {"optimizer_states": [self.optimizer_state(o) for o in self.optimizers], "rng": rng_state()}
        ranks = gather_to_rank_zero(local, self.world_size)
        if self.is_global_zero:
            checkpoint[STATE_KEY] = {
                "strategy": self._strategy_state(),
                "world_size": self.world_size,
                "ranks": ranks,
            }
            atomic_save(self.checkpoint_io, checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        state = checkpoint.get(STATE_KEY)
        if state is None:
            return checkpoint  # a plain Lightning checkpoint: weights and rank 0's optimizer state
        self._restored = state
        if state["world_size"] == self.world_size:
            mine = state["ranks"][self.global_rank]
            checkpoint["optimizer_states"] = mine["optimizer_states"]
        elif self.is_global_zero:
            log.warning(
                f"resuming a {state['world_size']}-worker checkpoint on {self.world_size} workers: every "
                "worker starts from rank 0's optimizer state (momentum), so the run will not be reproduced exactly"
            )
        return checkpoint

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        if self._restored is not None and self._restored["world_size"] == self.world_size:
            set_rng_state(self._restored["ranks"][self.global_rank]["rng"])
        self._restored = None

    # -- teardown ------------------------------------------------------------------------

    @override
    def on_exception(self, exception: BaseException) -> None:
        # A peer may be gone: waiting on in-flight work could hang until the group timeout.
        self._abandon_in_flight()
        super().on_exception(exception)

    def _abandon_in_flight(self) -> None:
        """Forget pending handles without waiting (subclasses holding handles override)."""

    @override
    def teardown(self) -> None:
        self._unpark()
        if self._comm is not None:
            with contextlib.suppress(Exception):
                self._flush()
            self._comm.destroy()
            self._comm = None
        # Teardown moves the model to the CPU, which rebinds every parameter's storage: the
        # tensors captured here would go stale, so the next stage captures them afresh.
        self._scratch = None
        self._tensors = []
        super().teardown()

    # -- registration ----------------------------------------------------------------------

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        # Overridden so DDPStrategy's own names ("ddp", ...) are not registered again.
        if not cls.strategy_name:
            return
        for suffix, start_method in (("", "popen"), ("_spawn", "spawn"), ("_fork", "fork"), ("_notebook", "fork")):
            name = cls.strategy_name + suffix
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"{cls.strategy_description} (start_method '{start_method}')",
                    start_method=start_method,
                )

