"""What CoCoD-SGD, Local-SGD and Pipe-SGD share: a DDPStrategy without the DDP wrapper.

Each worker keeps its own model; a subclass decides what to communicate around each optimizer
step (``_before_step`` / ``_after_step`` / ``_exchange``) and what is in flight (``_flush``).
The base does the rest once: the initial broadcast, the dedicated process groups, the
consistency points (evaluation on the averaged model, a sync before a checkpoint, identical
weights when fit ends), instrumentation, argument checks and registration.

The classes here are mixins over no Lightning class: ``lightning_cocod.strategies.namespaces``
puts them on top of the DDPStrategy of ``pytorch_lightning`` and, when installed, of
``lightning.pytorch`` (two separate class hierarchies), so the logic exists once.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import multiprocessing
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim import Optimizer

from lightning_cocod.core import (
    CommStats,
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
    gather_to_rank_zero,
    remove_digest,
    rng_state,
    set_rng_state,
)
from lightning_cocod.strategies.health import NonFinitePolicy
from lightning_cocod.strategies.reliability import (
    ReliableStrategy,
    RendezvousError,
    first_line,
    parse_timeout,
)
from lightning_cocod.strategies.rendezvous import RUN_ENVIRONMENT, init_default_group

log = logging.getLogger(__name__)

# DDPStrategy options that configure the DDP wrapper or its comm hooks, which we never build;
# DDPStrategy passes any other keyword on to DistributedDataParallel, whose own are read from it.
_DDP_ONLY_OPTIONS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")
_START_METHODS = ("popen", "spawn", "fork", "forkserver")


def _ddp_options() -> set[str]:
    wrapper = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return {*_DDP_ONLY_OPTIONS, *(name for name in wrapper if name not in ("self", "module"))}


def _no_per_step_sigterm_broadcast() -> None:
    """Stands in for Lightning's per-step SIGTERM broadcast (see ``setup``)."""


def _interactive() -> bool:
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def registered_names(base_name: str) -> list[tuple[str, str]]:
    """(name, start_method) of every variant a strategy is registered under."""
    return [(base_name + suffix, method) for suffix, method in (("", "popen"), ("_spawn", "spawn"), ("_fork", "fork"), ("_notebook", "fork"))]


class StrategyCommon(ReliableStrategy):
    """What all four of ours share, S-SGD included: options, signals, requests, checkpoint files,
    registration. Mixed in before a DDPStrategy class."""

    strategy_name: ClassVar[str] = ""
    strategy_description: ClassVar[str] = ""

    def _common_init(self, timeout: Any, start_method: str) -> dict[str, Any]:
        name = type(self).__name__
        if start_method not in _START_METHODS:
            raise ValueError(f"{name}: start_method={start_method!r} is not one of {', '.join(map(repr, _START_METHODS))}")
        self._init_reliability()
        self._environment_before: dict[str, str | None] = {}
        return {"timeout": parse_timeout(name, timeout), "start_method": start_method}

    def setup_distributed(self) -> None:
        self._steps = 0  # a fit's own count; a checkpoint's is restored later, in configure_ddp
        self._requested_path = None
        try:
            self.set_world_ranks()
            if self.world_size > 1 and self.cluster_environment is not None:
                if not self._environment_before:  # a stage's set-up, restored at its teardown
                    self._environment_before = {name: os.environ.get(name) for name in RUN_ENVIRONMENT}
                # Before Lightning's own set-up, which then finds the group initialised.
                init_default_group(
                    self.cluster_environment.main_address,
                    self.cluster_environment.main_port,
                    self.global_rank,
                    self.world_size,
                    self._get_process_group_backend(),
                    self._timeout,
                    self.root_device,
                )
            super().setup_distributed()  # type: ignore[misc]
            self._create_groups()
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

    def _create_groups(self) -> None:
        """Our own process groups, once the default one exists (collective: same order on every rank)."""
        self._setup_requests()

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)  # type: ignore[misc]
        if trainer.state.fn == "fit":
            self._patch_loops(trainer)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        launcher = self._launcher  # type: ignore[attr-defined]
        if launcher is None:  # torchrun, SLURM: the processes exist already
            return
        variants = f"strategy='{self.strategy_name}'" + ("" if self._start_method == "popen" else " (start_method 'popen')")
        if self._start_method == "spawn" and getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError(
                f"{type(self).__name__}: start_method 'spawn' re-runs your script in every worker, and this script "
                "builds the Trainer outside an `if __name__ == \"__main__\":` block; put it inside one, or use "
                f"{variants}"
            )
        if _interactive() and not launcher.is_interactive_compatible:
            raise RuntimeError(
                f"{type(self).__name__} with start_method {self._start_method!r} cannot start workers from an "
                f"interactive session (Jupyter, python -i): use strategy='{self.strategy_name}_notebook' (fork), or "
                "run your code as a script"
            )
        if hasattr(launcher, "update_main_process_results"):
            # spawn/fork: fit runs in child processes; rank 0's figures come back to this object.
            launcher.get_extra_results = self._results_for_main_process
            launcher.update_main_process_results = self._update_from_worker

    def _results_for_main_process(self, trainer: Any) -> dict[str, Any]:
        extra = type(self._launcher).get_extra_results(self._launcher, trainer)  # type: ignore[attr-defined]
        # Through a file, as Lightning sends the weights: Lightning joins the workers before it
        # reads its queue, so a message larger than a pipe holds (the per-round figures of a long
        # fit) blocked rank 0 in put() and the parent in join() for ever. The queue carries the path.
        fd, path = tempfile.mkstemp(prefix="cocod-worker-results-", suffix=".pkl")
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(self._worker_results(), fh)
        extra[STATE_KEY] = path
        return extra

    def _update_from_worker(self, trainer: Any, extra: dict[str, Any]) -> None:
        type(self._launcher).update_main_process_results(self._launcher, trainer, extra)  # type: ignore[attr-defined]
        path = extra.get(STATE_KEY)
        if path is None:
            return
        try:
            with open(path, "rb") as fh:
                results = pickle.load(fh)  # written by our own rank 0 just now, in a file of our own
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._take_worker_results(results)

    def _take_worker_results(self, results: dict[str, Any]) -> None:
        for name, value in results.items():
            setattr(self, name, value)

    def _worker_results(self) -> dict[str, Any]:
        """What a spawn/fork parent learns from rank 0 when fit ends (subclasses add theirs)."""
        return {}

    def _patch_loops(self, trainer: Any) -> None:
        # Lightning 2.6 broadcasts a SIGTERM flag from rank 0 before *every* training step. That is
        # a per-step rendezvous of all workers, which re-couples what a round decouples and, on a
        # slow link, queues behind a model all-reduce in flight; and it only hears rank 0's signal.
        # Signals travel with the request flags instead (``ReliableStrategy``).
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = _no_per_step_sigterm_broadcast
        # Lightning's own handlers (installed after this, before training: its SIGTERM one runs a
        # broadcast no peer joins; its SLURM one saves a checkpoint from inside the handler) only
        # raise our stop request from the start, sanity check included.
        connector = trainer._signal_connector
        connector._sigterm_notifier_fn = connector._slurm_sigusr_handler_fn = self._on_signal

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        self._check_same_start(self.lightning_module.trainer.global_step)  # a checkpoint is restored by now
        self._install_signal_handlers()  # after Lightning registered its own (they would replace ours)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        self._act_on_requests(self.lightning_module.trainer)

    def on_exception(self, exception: BaseException) -> None:
        # A peer may be gone: waiting on in-flight work could hang until the group timeout.
        if self._requests is not None:
            self._requests.abandon()
        self._abandon_in_flight()
        super().on_exception(exception)  # type: ignore[misc]

    def _abandon_in_flight(self) -> None:
        """Forget pending handles without waiting (subclasses holding handles override)."""

    def on_train_end(self) -> None:
        super().on_train_end()  # type: ignore[misc]
        self._drain_requests()
        # A checkpoint asked for in the last steps is still written; a stop is moot, fit is over.
        self._act_on_requests(self.lightning_module.trainer, stopping_allowed=False)

    def teardown(self) -> None:
        self._restore_signal_handlers()
        if self._requests is not None:
            with contextlib.suppress(Exception):
                self._drain_requests()
            self._requests.comm.destroy()
            self._requests = self._control_group = None
        super().teardown()  # type: ignore[misc]
        for name, value in self._environment_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._environment_before = {}

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        self._verify_before_load(checkpoint_path)
        return super().load_checkpoint(checkpoint_path, weights_only)  # type: ignore[misc]

    def remove_checkpoint(self, filepath: Any) -> None:
        super().remove_checkpoint(filepath)  # type: ignore[misc]
        if self.global_rank == 0:
            remove_digest(filepath)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        # Overridden so DDPStrategy's own names ("ddp", ...) are not registered again.
        if not cls.strategy_name:
            return
        for name, start_method in registered_names(cls.strategy_name):
            if name not in strategy_registry:
                strategy_registry.register(
                    name, cls, description=f"{cls.strategy_description} (start_method '{start_method}')",
                    start_method=start_method,
                )


class SyncStrategyBase(StrategyCommon, NonFinitePolicy):
    """Base of CoCoD-SGD, Local-SGD and Pipe-SGD. Not registered itself.

    Decisions:
    - momentum and all other optimizer state stay local to each worker;
    - every floating-point parameter is averaged, trainable or frozen, so a layer unfrozen or
      added to the optimizer mid-fit is averaged like the rest (frozen ones cost bandwidth, and
      identical copies average to themselves up to rounding);
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

    def __init__(
        self,
        *,
        average_buffers: bool = True,
        on_nonfinite: str = "raise",
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: Any = None,
        start_method: str = "popen",
        **unsupported: Any,
    ) -> None:
        name = type(self).__name__
        if unsupported:
            bad = ", ".join(f"{k}={v!r}" for k, v in unsupported.items())
            why = (
                "they configure DDP's wrapper or comm hooks, which this strategy does not use"
                if set(unsupported) & _ddp_options()
                else "it accepts the algorithm's own options plus process_group_backend, timeout, start_method"
            )
            raise TypeError(f"{name} got unsupported option(s) {bad}: {why}")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"{name}: on_nonfinite={on_nonfinite!r} is not one of 'raise', 'skip'")
        if not isinstance(average_buffers, bool):
            raise TypeError(f"{name}: average_buffers must be True or False, got {average_buffers!r}")
        super().__init__(  # type: ignore[call-arg]
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            **self._common_init(timeout, start_method),
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
        self._names: list[str] = []  # what each of ``_tensors`` is in the module, for following it
        self._scratch: FlatBuffer | None = None
        self._parked_in: FlatBuffer | None = None  # holds the live weights while evaluation sees the average
        self._restored: dict[str, Any] | None = None  # from a checkpoint, applied at set-up
        self._logged_rounds = 0
        self._unrecorded: list[tuple[Handle, int, int, int, float]] = []  # rounds whose figures are not read yet

    def _worker_results(self) -> dict[str, Any]:
        # Plain data: Lightning's launcher walks (and would try to move) whatever it sends back.
        return {
            "comm_stats": self.comm_stats.to_json(), "peak_buffer_bytes": self.peak_buffer_bytes,
            "skipped": self.skipped, "weight": self.weight,
        }

    def _take_worker_results(self, results: dict[str, Any]) -> None:
        super()._take_worker_results(results)
        if "comm_stats" in results:
            self.comm_stats = CommStats.from_json(results["comm_stats"])

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"average_buffers": self.average_buffers}
        if self.on_nonfinite != "raise":
            options["on_nonfinite"] = self.on_nonfinite
        return options

    def __repr__(self) -> str:
        options = {**self._options(), "start_method": self._start_method}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())})"

    # -- set-up -------------------------------------------------------------------------

    def _create_groups(self) -> None:
        if self.world_size > 1:
            self._comm = TorchDistCommunicator.on_new_group(
                self.root_device, backend=self._process_group_backend, timeout=self._timeout
            )
        super()._create_groups()

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if trainer.state.fn == "fit" and len(self.optimizers) != 1:
            raise ValueError(
                f"{type(self).__name__} supports exactly one optimizer, configure_optimizers returned "
                f"{len(self.optimizers)}: a round counts the steps of one optimizer"
            )

    def configure_ddp(self) -> None:
        # No DistributedDataParallel: no per-step gradient all-reduce. DDP's constructor is what
        # normally broadcasts rank 0's weights, so do that here.
        if dist.is_available() and dist.is_initialized():
            module = self.lightning_module
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.detach(), src=0)
        self._capture()
        self._steps = 0
        self.comm_stats = CommStats()
        self._logged_rounds = 0
        self._unrecorded = []
        if self._comm is not None:
            self._build(self._tensors)
        if self._restored is not None:
            self._load_strategy_state(self._restored["strategy"])
            mine = self._own_restored_state()
            if mine is not None:
                # This rank's own share (rank 0's is in the strategy state of older checkpoints).
                self.weight = mine.get("weight", self.weight)

    def _live_tensors(self) -> list[tuple[str, Tensor]]:
        """(name, tensor) of what the rounds average, as the module holds them now."""
        module = self.lightning_module
        named = [(n, p) for n, p in module.named_parameters() if p.is_floating_point()]
        if self.average_buffers:
            named += [(n, b) for n, b in module.named_buffers() if b.is_floating_point()]
        return named

    def _capture(self) -> None:
        live = self._live_tensors()
        self._names = [name for name, _ in live]
        self._tensors = [t.detach() for _, t in live]

    def _follow_model(self) -> None:
        """Make the averaged tensors the module's current ones, before a round touches them.

        ``param.data = ...``, a module replaced by one of the same shapes, or a buffer reset by
        assignment (SWA's BatchNorm reset) rebinds storage that the captured tensors no longer
        alias: averaging those would leave the model's real weights to each worker alone,
        silently. Same names, shapes and dtypes are followed (the flat buffers hold copies, so
        they stay valid); anything else would change the collective's layout under a round in
        flight, and is refused.
        """
        live = self._live_tensors()
        self._refuse_untracked_optimizer_tensors(live)
        if len(live) == len(self._tensors) and all(
            name == known and t.data_ptr() == k.data_ptr() and t.shape == k.shape and t.stride() == k.stride()
            and t.dtype == k.dtype
            for (name, t), known, k in zip(live, self._names, self._tensors)
        ):
            return
        now = dict(live)
        owner, when = type(self).__name__, f"at optimizer step {self._steps}"
        fixed = (
            "the averaged tensors and their shapes are fixed once the strategy has set up: change the model "
            "before fit (in configure_model or setup); rebinding a tensor of the same shape and dtype is followed"
        )
        for name, old in zip(self._names, self._tensors):
            new = now.get(name)
            if new is None:
                raise ValueError(f"{owner}: the model's tensor '{name}' was removed {when}; {fixed}")
            if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
                raise ValueError(
                    f"{owner}: the model's tensor '{name}' changed from {tuple(old.shape)} {old.dtype} on {old.device} to "
                    f"{tuple(new.shape)} {new.dtype} on {new.device} {when}; {fixed}"
                )
        if len(now) != len(self._names):
            added = next(name for name in now if name not in self._names)
            raise ValueError(f"{owner}: the model's tensor '{added}' was added {when}; {fixed}")
        self._tensors = [now[name].detach() for name in self._names]  # the flat buffers' order
        self._retarget()

    def _refuse_untracked_optimizer_tensors(self, live: list[tuple[str, Tensor]]) -> None:
        # A tensor the optimizer trains outside the module (a plain tensor attribute, another
        # module's parameter) would be trained by each worker alone. One with a gradient is in
        # use; a stale one (the old copy of a replaced layer) gets none and does no harm.
        owned = {id(t) for _, t in live}
        for optimizer in self.optimizers:
            for g, group in enumerate(optimizer.param_groups):
                for i, p in enumerate(group["params"]):
                    if p.grad is not None and id(p) not in owned and p.is_floating_point():
                        raise ValueError(
                            f"{type(self).__name__}: the optimizer trains a tensor of shape {tuple(p.shape)} (param "
                            f"group {g}, index {i}) that is not a parameter of the LightningModule, so no worker's "
                            "copy would be averaged with the others; register it on the module (an nn.Parameter "
                            "attribute or a submodule's) before fit"
                        )

    def _retarget(self) -> None:
        """Point whatever holds the model's tensors at ``self._tensors`` (subclasses holding some override)."""

    def _build(self, tensors: list[Tensor]) -> None:
        """Allocate what the algorithm needs (flat buffers); called once the model is placed."""

    # -- the step -----------------------------------------------------------------------

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        if self._comm is None:  # one worker: plain local SGD, nothing to talk to
            output = super().optimizer_step(optimizer, closure, model, **kwargs)  # type: ignore[misc]
            self._steps += 1
            self._exchange_requests()
            return output
        with torch.no_grad(), self._collective("launching a round"):
            self._before_step()

        def closure_then_exchange() -> Any:
            result = closure()
            with torch.no_grad(), self._collective("exchanging gradients"):
                self._exchange()
            return result

        output = super().optimizer_step(optimizer, closure_then_exchange, model, **kwargs)  # type: ignore[misc]
        self._steps += 1
        with torch.no_grad(), self._collective("finishing a round"):
            self._after_step()
        self._exchange_requests()
        return output

    def _before_step(self) -> None:
        """Before forward/backward of an optimizer step."""

    def _exchange(self) -> None:
        """After backward, before the optimizer applies the gradients."""

    def _after_step(self) -> None:
        """After the optimizer step; ``self._steps`` already counts it."""

    def _flush(self) -> None:
        """Finish whatever is in flight so the weights are this algorithm's current state."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._log_rounds()
        super().on_train_batch_start(batch, batch_idx)

    def _log_rounds(self) -> None:
        """The last finished round's figures, straight to the loggers at their cadence (floats: a
        ``LightningModule.log`` of a float would make a device tensor, a host sync on a GPU)."""
        trainer = self.lightning_module.trainer
        rounds = self.comm_stats.rounds
        if self.global_rank != 0 or not trainer.loggers or len(rounds) == self._logged_rounds:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) != 0:
            return
        self._logged_rounds = len(rounds)
        last = rounds[-1]
        figures = {
            "comm/round_seconds": last.comm_seconds,
            "comm/exposed_seconds": last.exposed_seconds,
            "comm/bytes": float(last.nbytes),
            "comm/hidden_fraction": last.hidden_fraction,
            "comm/hidden_fraction_total": self.comm_stats.hidden_fraction,
        }
        if hasattr(self, "tau"):
            figures["comm/tau"] = float(self.tau)
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=trainer.global_step)

    # -- helpers for subclasses ----------------------------------------------------------

    def _scratch_buffer(self) -> FlatBuffer:
        if self._scratch is None:
            self._scratch = FlatBuffer(self._tensors)
        return self._scratch

    def _average_now(self, what: str = "average", swap: bool = False) -> Handle:
        """Blocking weighted average of the model tensors on every rank (see average_blocking);
        a worker with non-finite values stops everyone before anything is sent."""
        assert self._comm is not None
        self._follow_model()
        check = lambda buckets: self._agree_finite(has_nonfinite(buckets), what)
        return average_blocking(self._tensors, self._scratch_buffer(), self._comm, self.weight, check, swap)

    def _flat_buffers(self) -> list[FlatBuffer]:
        """Every flat buffer this strategy holds (its memory overhead, in model copies)."""
        return [self._scratch] if self._scratch is not None else []

    @property
    def buffer_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._flat_buffers())

    def _record(self, handle: Handle, launch_step: int, nbytes: int, also_waited: float = 0.0) -> None:
        """``also_waited``: time blocked on other collectives of the round before this handle's
        wait (it is exposed communication just the same). On a GPU a round's figures come from
        events the device may not have reached yet: they are read once ready (a round later, or
        at the next synchronisation point), never by making the host wait."""
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)
        self._unrecorded.append((handle, launch_step, self._steps, nbytes, also_waited))
        self._record_ready()

    def _record_ready(self, force: bool = False) -> None:
        while self._unrecorded and (force or self._unrecorded[0][0].figures_ready()):
            handle, launch_step, finish_step, nbytes, also_waited = self._unrecorded.pop(0)
            exposed = handle.exposed_seconds + also_waited
            self.comm_stats.add(
                RoundRecord(launch_step, finish_step, handle.comm_seconds, exposed, nbytes, handle.launched_at)
            )

    # -- consistency points ----------------------------------------------------------------

    def _sync_point(self) -> None:
        if self._comm is None or not self._tensors:
            return
        self._unpark()
        with torch.no_grad(), self._collective("synchronising the workers"):
            self._flush()
            self._average_now("synchronisation point")
        self._record_ready(force=True)
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)

    def on_train_end(self) -> None:
        self._sync_point()
        super().on_train_end()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Runs on every rank inside dump_checkpoint, before the file is written: the right
        # moment to make the weights consistent (save_checkpoint would be too late).
        self._sync_point()
        return super().lightning_module_state_dict()  # type: ignore[misc]

    def _park_and_average(self) -> None:
        if self._comm is None:
            return
        if not self._tensors:  # test/validate without fit: configure_ddp did not run
            self._capture()
        buffer = self._scratch_buffer()
        with torch.no_grad(), self._collective("averaging for evaluation"):
            self._average_now("evaluation", swap=True)  # model <- average, buffer <- live weights
        self._parked_in = buffer

    def _unpark(self) -> None:
        if self._parked_in is not None:
            with torch.no_grad():
                self._parked_in.swap(self._tensors)
            self._parked_in = None

    def on_validation_start(self) -> None:
        super().on_validation_start()  # type: ignore[misc]
        self._park_and_average()

    def on_validation_end(self) -> None:
        super().on_validation_end()  # type: ignore[misc]
        self._unpark()

    def on_test_start(self) -> None:
        super().on_test_start()  # type: ignore[misc]
        self._park_and_average()

    def on_test_end(self) -> None:
        super().on_test_end()  # type: ignore[misc]
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

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        # Called on every rank (after lightning_module_state_dict made the weights agree).
        local = {
            "optimizer_states": [self.optimizer_state(o) for o in self.optimizers],
            "rng": rng_state(),
            "weight": self.weight,  # a share of its own under proportional sampling
        }
        if self.world_size > 1 and not dist.is_initialized():
            # The main process after a spawn/fork fit (trainer.save_checkpoint there): it holds
            # rank 0's weights but no worker's optimizer or random state, so it records none.
            ranks: list[Any] | None = []
        else:
            with self._collective("gathering every rank's optimizer state for a checkpoint", failures=(RuntimeError,)):
                ranks = gather_to_rank_zero(local, self.world_size)
        if self.global_rank == 0:
            checkpoint[STATE_KEY] = {
                "strategy": self._strategy_state(),
                "world_size": self.world_size,
                "ranks": ranks,
            }
        self._write_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        state = checkpoint.get(STATE_KEY)
        if state is None:
            return checkpoint  # a plain Lightning checkpoint: weights and rank 0's optimizer state
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
        return checkpoint

    def _own_restored_state(self) -> dict[str, Any] | None:
        """This rank's optimizer and random state from the checkpoint being resumed, when it holds
        one per worker of this run (same number of workers, written by the workers themselves)."""
        state = self._restored
        if state is None or state["world_size"] != self.world_size or len(state["ranks"]) != self.world_size:
            return None
        return state["ranks"][self.global_rank]

    def on_train_start(self) -> None:
        super().on_train_start()
        mine = self._own_restored_state()
        if mine is not None:
            set_rng_state(mine["rng"])
        self._restored = None

    # -- teardown ------------------------------------------------------------------------

    def teardown(self) -> None:
        self._unpark()
        if self._comm is not None:
            with contextlib.suppress(Exception):
                self._flush()
                self._record_ready(force=True)
            self._comm.destroy()
            self._comm = None
        # Teardown moves the model to the CPU, which rebinds every parameter's storage: the
        # tensors captured here would go stale, so the next stage captures them afresh.
        self._scratch = None
        self._tensors = []
        self._restored = None  # a checkpoint loaded for test() must not reach a later fit()
        super().teardown()
