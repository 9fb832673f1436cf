"""What lets a long run survive a real cluster, shared by every strategy of this package (S-SGD
included): one validated timeout, a dead peer named in every collective, a coordinated stop when
any one worker is preempted, and checkpoints that are whole or absent (``rounds.checkpoint``, written
and read by ``common``).

Preemption. A spot node gets SIGTERM alone, a SLURM job SIGUSR1 before its deadline. Lightning's
own handler broadcasts from rank 0 inside the signal handler, which the other ranks never join
once the per-step broadcast is gone, so every rank would stall until the collective timeout.
Here a signal only raises a request flag; the flags travel in a tiny all-reduce every step
(``RequestFlags``) and every rank learns of the request at the same step, within one round.
All ranks then write the checkpoint together and leave ``fit`` with ``Preempted`` (exit code 75,
``EX_TEMPFAIL``: a code schedulers can requeue on). The same path serves ``request_checkpoint()``
(a checkpoint every N minutes, decided by one rank's clock) and ``request_stop()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from typing_extensions import override

from lightning_cocod._errors import first_line
from lightning_cocod.core.comm import CommunicationError, TorchDistCommunicator
from lightning_cocod.core.control import RequestFlags
from lightning_cocod.exit_codes import PREEMPTED_EXIT_CODE
from lightning_cocod.rounds.checkpoint import CheckpointError

if TYPE_CHECKING:  # what the mixin is mixed into (see ``namespaces``), so its super() calls are checked
    from pytorch_lightning.strategies import DDPStrategy as _MixedInto
else:
    _MixedInto = object

log = logging.getLogger(__name__)

_STOP, _CHECKPOINT = 0, 1  # slots of the request flags
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class WorkerLostError(RuntimeError):
    """A collective failed: another worker died or stalled, or the network broke."""


class RendezvousError(RuntimeError):
    """The workers could not meet: the store was unreachable or the others never came."""


class Preempted(SystemExit):
    """Every rank stopped at the same step on a stop request (a signal); the checkpoint, if any, is whole."""

    def __init__(self, reason: str, step: int, checkpoint: str | None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.reason, self.step, self.checkpoint = reason, step, checkpoint

    def __str__(self) -> str:
        saved = (
            f"checkpoint {self.checkpoint}"
            if self.checkpoint
            else "no checkpoint (the Trainer has no checkpoint callback)"
        )
        return f"stopped at optimizer step {self.step} on {self.reason}; {saved}"


class ReliableStrategy(_MixedInto):
    """Mixin of our strategies over Lightning's DDPStrategy (it relies on ``self._timeout``,
    ``global_rank``, ``world_size``, ``launcher`` and ``lightning_module``)."""

    _timeout: timedelta

    def _init_reliability(self) -> None:
        self._steps = 0  # optimizer steps taken in this fit (a lost peer before set-up names step 0)
        self._requested_path: str | None = None
        self._requests: RequestFlags | None = None
        self._control_group: Any = None
        self._local_requests = [0.0, 0.0]
        self._stop_reason: str | None = None
        self._agreed: set[str] = set()
        self._saved_handlers: dict[int, Any] = {}

    # -- requests ------------------------------------------------------------------------

    def request_stop(self, reason: str = "a stop request") -> None:
        """Stop every rank at the same step (within one round), after a checkpoint when the
        Trainer has a checkpoint callback; ``fit`` then raises ``Preempted``. Safe in a signal handler."""
        self._local_requests[_STOP] = 1.0
        if self._stop_reason is None:
            self._stop_reason = reason

    def request_checkpoint(self) -> None:
        """Every rank writes the checkpoint callback's file at the same step (within one round)."""
        self._local_requests[_CHECKPOINT] = 1.0

    @property
    def stop_requested(self) -> bool:
        """``request_stop`` was called here, or a signal asked for it."""
        return self._stop_reason is not None

    def _setup_requests(self) -> None:
        """A collective: every rank must call it, after the default group exists."""
        if self.world_size > 1:
            # gloo on CPU tensors whatever the model's backend: reading the flags never waits for a GPU.
            group = dist.new_group(backend="gloo", timeout=self._timeout)
            self._control_group = group
            self._requests = RequestFlags(TorchDistCommunicator(group, torch.device("cpu")), width=2)

    def _check_same_start(self, step: int) -> None:
        """Ranks that resumed from different checkpoints (or some from none: a run folder that not
        every node sees) would run different numbers of steps and meet in mismatched collectives,
        to hang or average unrelated models: refuse at once, on every rank alike."""
        if self._control_group is None:
            return
        bounds = torch.tensor([step, -step], dtype=torch.int64)
        with self._collective("comparing the step every rank starts from"):
            dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=self._control_group)
        latest, earliest = int(bounds[0]), -int(bounds[1])
        if latest != earliest:
            raise CheckpointError(
                f"the workers start fit at different steps ({earliest} to {latest}; rank {self.global_rank} at "
                f"{step}): they resumed from different checkpoints, or some from none; resume every rank from "
                "the same file, in a folder every node sees"
            )

    def _request_lag(self) -> int:
        """Steps between raising a flag and acting on it: how far ahead of a peer a worker may run."""
        return 1

    def _exchange_requests(self) -> None:
        """After every optimizer step, on every rank."""
        flags, self._local_requests = self._local_requests, [0.0, 0.0]
        if self._requests is None:
            agreed: Any = flags
        else:
            with self._collective("agreeing on stop and checkpoint requests"):
                self._requests.push(self._steps, flags)
                agreed = self._requests.due(self._steps, self._request_lag())
        self._note_agreed(agreed)

    def _note_agreed(self, sums: Any) -> None:
        if sums is not None:
            slots = (("stop", _STOP), ("checkpoint", _CHECKPOINT))
            self._agreed |= {name for name, slot in slots if sums[slot] > 0}

    def _drain_requests(self) -> None:
        if self._requests is not None:
            with self._collective("agreeing on stop and checkpoint requests"):
                self._note_agreed(self._requests.drain())

    def _act_on_requests(self, trainer: Any, stopping_allowed: bool = True) -> None:
        """Run where every rank is at the same step and the loops' state is whole (a batch start)."""
        if not self._agreed:
            return
        self._drain_requests()  # what is still in flight is part of this decision
        agreed, self._agreed = self._agreed, set()
        # One file per fit: a later request rewrites it rather than make a new version each time.
        self._requested_path = path = self._requested_path or checkpoint_path(trainer)
        if path is not None:
            trainer.save_checkpoint(
                path, weights_only=False
            )  # all a resume needs; said, so Lightning does not log it
        elif "checkpoint" in agreed and self.global_rank == 0:
            log.warning(
                "a checkpoint was requested, but the Trainer has no checkpoint callback to say where: none written"
            )
        if "stop" in agreed and stopping_allowed:
            reason = self._stop_reason or "a stop requested on another rank"
            if self.global_rank == 0:
                log.warning(f"all ranks stop at optimizer step {self._steps} ({reason}); checkpoint: {path}")
            raise Preempted(reason, self._steps, path)

    # -- signals -------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in _SIGNALS:
            self._saved_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        first = not self.stop_requested
        self.request_stop(f"{signal.Signals(signum).name} on rank {self.global_rank}")
        launcher = getattr(self, "launcher", None)
        if first and launcher is not None:
            # As Lightning's handler does: processes this one started (popen launcher) hear it too.
            launcher.kill(signum)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._saved_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
        self._saved_handlers = {}

    # -- collectives ---------------------------------------------------------------------

    def _lost(self, what: str, err: BaseException) -> WorkerLostError:
        return WorkerLostError(
            f"{type(self).__name__}, rank {self.global_rank}, optimizer step {self._steps}, {what}: "
            f"{first_line(err)}. A worker died or stalled (collectives time out after {self._timeout}, the "
            "strategy's `timeout`); resume from the last checkpoint with trainer.fit(..., ckpt_path=...)"
        )

    @contextlib.contextmanager
    def _collective(
        self, what: str, failures: tuple[type[BaseException], ...] = (CommunicationError,)
    ) -> Any:
        try:
            yield
        except WorkerLostError:
            raise
        except failures as err:
            raise self._lost(what, err) from err

    def _lightning_collective(self, what: str) -> Any:
        # gloo reports a dead peer as a plain RuntimeError ("Connection closed by peer").
        return self._collective(what, failures=(RuntimeError,))

    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        with self._lightning_collective("reducing a logged value (sync_dist)"):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    @override
    def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        with self._lightning_collective(f"at barrier {name!r}"):
            super().barrier(name, *args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with self._lightning_collective("broadcasting from rank 0"):
            return super().broadcast(obj, src)

    @override
    def all_gather(self, tensor: Any, group: Any = None, sync_grads: bool = False) -> Any:
        with self._lightning_collective("gathering a tensor from every rank"):
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)


def checkpoint_path(trainer: Any) -> str | None:
    """Where a requested checkpoint goes: the file the Trainer's checkpoint callback keeps up to
    date (``last_path`` of ours; ``last.ckpt`` in a ModelCheckpoint's folder, versioned rather
    than replacing a file of another run), or None without a checkpoint callback."""
    callback = getattr(trainer, "checkpoint_callback", None)
    if callback is None:
        return None
    path = getattr(callback, "last_path", None) or getattr(callback, "last_model_path", "")
    if path:
        return str(path)
    folder = getattr(callback, "dirpath", None)
    if folder is None:
        return None
    name, ext = (
        getattr(callback, "CHECKPOINT_NAME_LAST", "last"),
        getattr(callback, "FILE_EXTENSION", ".ckpt"),
    )
    candidate, version = os.path.join(folder, f"{name}{ext}"), 0
    resumed_from = str(getattr(trainer, "ckpt_path", None) or "")
    while os.path.exists(candidate) and os.path.abspath(candidate) != os.path.abspath(resumed_from):
        version += 1
        candidate = os.path.join(folder, f"{name}-v{version}{ext}")
    return candidate
