"""What a round does, with no Lightning: the model's tensors, the step template, the consistency
points, the state a checkpoint keeps and the figures of every round.

``Rounds`` takes a module, its optimizers, a communicator (a process group of its own) and the
count of optimizer steps, which its caller advances (``steps``). Around every optimizer step the
caller runs, each under ``torch.no_grad()`` (``run``): ``begin_step`` before forward and backward,
``exchange`` after backward, ``end_step`` after the optimizer step. An algorithm
(``CoCoDRounds``, ``LocalSGDRounds``, ``PipeSGDRounds``) decides what is communicated at each
of them and what is in flight (``flush``); this class does the rest once. The Lightning
strategies (``strategies.base``), the loop API (``loop``) and the Fabric strategies are thin
layers that call it from their hooks; nothing here knows Lightning.

Decisions:
- momentum and all other optimizer state stay local to each worker;
- every floating-point parameter is averaged, trainable or frozen, so a layer unfrozen or
  added to the optimizer mid-fit is averaged like the rest (frozen ones cost bandwidth, and
  identical copies average to themselves up to rounding);
- floating-point buffers (BatchNorm running stats) go through the same averaging as the
  parameters when ``average_buffers`` (integer buffers such as num_batches_tracked stay local);
- evaluation sees the average of the workers' models (``park_and_average``), then the live
  weights return (``unpark``), so evaluating never changes the training trajectory;
- a checkpoint and the end of training are synchronisation points (``sync``): pending
  communication is finished and merged, then every rank takes the average, so any rank's state
  is the run's;
- NaN/Inf on any worker is caught before it reaches another worker's average (``health``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim import Optimizer

from lightning_cocod._options import boolean, count, one_of
from lightning_cocod.core import (
    CommStats,
    Communicator,
    FlatBuffer,
    Handle,
    RoundRecord,
    average_blocking,
    has_nonfinite,
)
from lightning_cocod.core.compress import CompressedMean, make_codec
from lightning_cocod.rounds.health import (
    ON_NONFINITE,
    bad_ranks,
    health_flags,
    nonfinite_error,
    restart_from_healthy,
)
from lightning_cocod.rounds.options import check_weight

log = logging.getLogger(__name__)


def broadcast_from_rank_zero(module: torch.nn.Module) -> None:
    """What the DistributedDataParallel constructor does, which no strategy of ours builds."""
    if dist.is_available() and dist.is_initialized():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.detach(), src=0)


class Rounds:
    """The algorithm-independent part of a round; ``owner`` names the strategy in messages."""

    def __init__(
        self,
        owner: str,
        *,
        average_buffers: bool = True,
        on_nonfinite: str = "raise",
        compression: str | None = None,
        error_feedback: bool = True,
    ) -> None:
        try:
            self.codec = make_codec(compression)
        except ValueError as err:
            raise ValueError(f"{owner}: {err}") from None
        self.error_feedback = boolean(owner, "error_feedback", error_feedback)
        # The periodic average in encoded deltas (core.compress): the algorithms that average the
        # model every round send it through ``round_comm``; consistency points stay exact.
        self.compressed: CompressedMean | None = None
        self.codec_comm: Any = None
        one_of(owner, "on_nonfinite", on_nonfinite, ON_NONFINITE)
        boolean(owner, "average_buffers", average_buffers)
        self.owner = owner
        self.average_buffers = average_buffers
        self.on_nonfinite = on_nonfinite
        self.steps = 0  # optimizer steps taken, counted by the caller
        # This rank's share in every average (sum over ranks = 1); None is the plain mean.
        self.weight: float | None = None
        self.skipped: list[tuple[int, list[int]]] = []  # (step, bad ranks) recovered by on_nonfinite="skip"
        self.comm_stats = CommStats()
        self.peak_buffer_bytes = 0
        self.module: torch.nn.Module | None = None
        self.optimizers: list[Optimizer] = []
        self.comm: Communicator | None = None
        self.control: Communicator | None = None  # small messages (flags, figures): a CPU group if given
        self.rank, self.world_size, self.device = 0, 1, torch.device("cpu")
        self.tensors: list[Tensor] = []
        self.names: list[str] = []  # what each of ``tensors`` is in the module, for following it
        self._scratch: FlatBuffer | None = None
        self._parked_in: FlatBuffer | None = None  # holds the live weights while evaluation sees the average
        self._unrecorded: list[
            tuple[Handle, int, int, int, float]
        ] = []  # rounds whose figures are not read yet

    def options(self) -> dict[str, Any]:
        """The options a user chose, as the constructor takes them (how the strategy prints)."""
        options: dict[str, Any] = {"average_buffers": self.average_buffers}
        if self.on_nonfinite != "raise":
            options["on_nonfinite"] = self.on_nonfinite
        if self.codec is not None:
            options["compression"] = self.codec.name
            if not self.error_feedback:
                options["error_feedback"] = False
        return options

    def attach(
        self,
        module: torch.nn.Module,
        comm: Communicator | None,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        control: Communicator | None = None,
        codec_comm: Any = None,
    ) -> None:
        """Take the module's tensors (identical on every rank by now) and the group to average on.
        ``codec_comm``: a group of its own for compressed rounds (a TorchDistCommunicator), needed
        with ``compression``: their exchange runs on a thread, and collectives that two threads
        issue on one group may pair up in a different order on each rank."""
        if comm is not None and self.codec is not None and codec_comm is None:
            raise ValueError(
                f"{self.owner}: compressed rounds need a process group of their own (codec_comm)"
            )
        self.codec_comm = codec_comm
        self.module, self.comm, self.control = module, comm, control if control is not None else comm
        self.rank, self.world_size, self.device = rank, world_size, device
        live = self.live_tensors()
        self.names = [name for name, _ in live]
        self.tensors = [t.detach() for _, t in live]

    def start(self) -> None:
        """Training begins: the step count and the figures restart, the buffers are allocated."""
        self.steps = 0
        self.comm_stats = CommStats()
        self._unrecorded = []
        if self.comm is not None and self.codec is not None:
            self.compressed = CompressedMean(self.codec_comm, self.codec, self.error_feedback)
        if self.comm is not None:
            self.build()

    @property
    def round_comm(self) -> Communicator | None:
        """What a round's average goes through: the compressed mean when ``compression`` is set."""
        return self.compressed if self.compressed is not None else self.comm

    def build(self) -> None:
        """Allocate what the algorithm needs (flat buffers) over ``tensors``."""

    # -- the step (overridden by each algorithm) --------------------------------------------

    def run(self, step: Callable[[], None]) -> None:
        """``step`` (one of the methods below, or ``sync``) under ``torch.no_grad()``, where there
        are peers: one worker trains as plain local SGD, with nothing to talk to."""
        if self.comm is not None:
            with torch.no_grad():
                step()

    def begin_step(self) -> None:
        """Before forward/backward of an optimizer step."""

    def exchange(self) -> None:
        """After backward, before the optimizer applies the gradients."""

    def end_step(self) -> None:
        """After the optimizer step; ``steps`` already counts it."""

    def flush(self, averaging_next: bool = False) -> None:
        """Finish whatever is in flight so the weights are this algorithm's current state.
        ``averaging_next``: every rank takes the exact average next (``sync``), which may stand
        in for the average of what was in flight."""

    def abandon(self) -> None:
        """Forget what is in flight without waiting: a peer may be gone."""

    def agreed(self) -> dict[str, Any]:
        """What every rank must be given alike (a rank's own weight may differ)."""
        return {"class": self.owner, **self.options()}

    def request_lag(self) -> int:
        """Steps a worker may run ahead of a peer anyway: stop and checkpoint requests need be no tighter."""
        return 1

    # -- following the model -----------------------------------------------------------------

    def live_tensors(self) -> list[tuple[str, Tensor]]:
        """(name, tensor) of what the rounds average, as the module holds them now."""
        assert self.module is not None
        named = [(n, p) for n, p in self.module.named_parameters() if p.is_floating_point()]
        if self.average_buffers:
            named += [(n, b) for n, b in self.module.named_buffers() if b.is_floating_point()]
        return named

    def follow_model(self) -> None:
        """Make the averaged tensors the module's current ones, before a round touches them.

        ``param.data = ...``, a module replaced by one of the same shapes, or a buffer reset by
        assignment (SWA's BatchNorm reset) rebinds storage that the captured tensors no longer
        alias: averaging those would leave the model's real weights to each worker alone,
        silently. Same names, shapes and dtypes are followed (the flat buffers hold copies, so
        they stay valid); anything else would change the collective's layout under a round in
        flight, and is refused.
        """
        live = self.live_tensors()
        self.refuse_untracked_optimizer_tensors(live)
        if len(live) == len(self.tensors) and all(
            name == known
            and t.data_ptr() == k.data_ptr()
            and t.shape == k.shape
            and t.stride() == k.stride()
            and t.dtype == k.dtype
            for (name, t), known, k in zip(live, self.names, self.tensors)
        ):
            return
        now = dict(live)
        when = f"at optimizer step {self.steps}"
        fixed = (
            "the averaged tensors and their shapes are fixed once the strategy has set up: change the model "
            "before fit (in configure_model or setup); rebinding a tensor of the same shape and dtype is followed"
        )
        for name, old in zip(self.names, self.tensors):
            new = now.get(name)
            if new is None:
                raise ValueError(f"{self.owner}: the model's tensor '{name}' was removed {when}; {fixed}")
            if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
                raise ValueError(
                    f"{self.owner}: the model's tensor '{name}' changed from {tuple(old.shape)} {old.dtype} on "
                    f"{old.device} to {tuple(new.shape)} {new.dtype} on {new.device} {when}; {fixed}"
                )
        if len(now) != len(self.names):
            added = next(name for name in now if name not in self.names)
            raise ValueError(f"{self.owner}: the model's tensor '{added}' was added {when}; {fixed}")
        self.tensors = [now[name].detach() for name in self.names]  # the flat buffers' order
        self.retarget()

    def refuse_untracked_optimizer_tensors(
        self, live: list[tuple[str, Tensor]], unused_too: bool = False
    ) -> None:
        # A tensor the optimizer trains outside the module (a plain tensor attribute, another
        # module's parameter) would be trained by each worker alone. One with a gradient is in
        # use; a stale one (the old copy of a replaced layer) gets none and does no harm, unless
        # ``unused_too`` (a loop's optimizer, checked before it ever steps).
        owned = {id(t) for _, t in live}
        for optimizer in self.optimizers:
            for g, group in enumerate(optimizer.param_groups):
                for i, p in enumerate(group["params"]):
                    if (unused_too or p.grad is not None) and id(p) not in owned and p.is_floating_point():
                        raise ValueError(
                            f"{self.owner}: the optimizer trains a tensor of shape {tuple(p.shape)} (param "
                            f"group {g}, index {i}) that is not a parameter of the model, so no worker's copy would "
                            "be averaged with the others; register it on the model (an nn.Parameter attribute or a "
                            "submodule's) before training"
                        )

    def retarget(self) -> None:
        """Point whatever holds the model's tensors at ``tensors`` (algorithms holding some override)."""

    # -- averaging and figures -----------------------------------------------------------------

    def scratch_buffer(self) -> FlatBuffer:
        if self._scratch is None:
            self._scratch = FlatBuffer(self.tensors)
        return self._scratch

    def average_now(
        self, what: str = "average", swap: bool = False, comm: Communicator | None = None
    ) -> Handle:
        """Blocking weighted average of the model tensors on every rank (see average_blocking),
        on ``comm`` (default: the exact one); a worker with non-finite values stops everyone
        before anything is sent."""
        assert self.comm is not None
        self.follow_model()

        def check(buckets: list[Tensor]) -> None:
            flags = self.health_flags(has_nonfinite(buckets))
            self.comm.start_mean([flags], 1.0).wait()  # weight 1: the sum of everyone's flags
            if self.raise_if_nonfinite(flags, what):
                # Recovered (on_nonfinite="skip"): what was packed for the average is stale.
                self.scratch_buffer().pack(self.tensors)

        checked = check if self.on_nonfinite != "allow" else None  # saves a blocking collective
        return average_blocking(
            self.tensors, self.scratch_buffer(), comm or self.comm, self.weight, checked, swap
        )

    def flat_buffers(self) -> list[FlatBuffer]:
        """Every flat buffer held (the memory overhead, in model copies)."""
        return [self._scratch] if self._scratch is not None else []

    @property
    def buffer_bytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.flat_buffers())

    def record(self, handle: Handle, launch_step: int, nbytes: int, also_waited: float = 0.0) -> None:
        """``also_waited``: time blocked on other collectives of the round before this handle's
        wait (it is exposed communication just the same). On a GPU a round's figures come from
        events the device may not have reached yet: they are read once ready (a round later, or
        at the next synchronisation point), never by making the host wait."""
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)
        self._unrecorded.append((handle, launch_step, self.steps, nbytes, also_waited))
        self.record_ready()

    def record_ready(self, force: bool = False) -> None:
        while self._unrecorded and (force or self._unrecorded[0][0].figures_ready()):
            handle, launch_step, finish_step, nbytes, also_waited = self._unrecorded.pop(0)
            exposed = handle.exposed_seconds + also_waited
            self.comm_stats.add(
                RoundRecord(
                    launch_step,
                    finish_step,
                    handle.comm_seconds,
                    exposed,
                    nbytes,
                    handle.launched_at,
                    bytes_sent=handle.bytes_sent,
                    bytes_received=handle.bytes_received,
                    codec_seconds=handle.codec_seconds,
                )
            )

    def figures(self) -> dict[str, float]:
        """The last finished round's figures, for a logger (floats, read on the host)."""
        last = self.comm_stats.rounds[-1]
        return {
            "comm/round_seconds": last.comm_seconds,
            "comm/exposed_seconds": last.exposed_seconds,
            "comm/payload_bytes": float(last.nbytes),
            "comm/bytes_sent": float(last.bytes_sent),
            "comm/codec_seconds": last.codec_seconds,
            "comm/hidden_fraction": last.hidden_fraction,
            "comm/hidden_fraction_total": self.comm_stats.hidden_fraction,
        }

    # -- non-finite values (see ``health``) ---------------------------------------------------

    def health_flags(self, bad: bool, device: torch.device | None = None) -> Tensor:
        return health_flags(self.rank, self.world_size, bad, device or self.device)

    def raise_if_nonfinite(self, flags: Tensor, what: str) -> bool:
        """Raise naming the bad ranks; with ``on_nonfinite="skip"`` recover instead and return True
        (the caller then drops the pending update: see ``health``). With ``"allow"`` nothing
        happens: the update goes on, as under DDP. (The flags of ``"allow"`` still travel where they
        share a message with the round's figures or queue behind its tensors: every option keeps
        the same collectives on every rank.)"""
        bad = bad_ranks(flags)
        if not bad or self.on_nonfinite == "allow":
            return False
        if self.on_nonfinite != "skip" or len(bad) == self.world_size:
            raise nonfinite_error(self.owner, bad, self.steps, what)
        assert self.comm is not None
        buffer = self.scratch_buffer()
        source = restart_from_healthy(self.comm, buffer, self.tensors, self.optimizers, self.rank, bad)
        self.skipped.append((self.steps, bad))
        if self.rank == 0:
            log.warning(
                f"non-finite values on rank {bad} at optimizer step {self.steps} ({what}): update skipped, "
                f"rank(s) {bad} restarted from rank {source}'s model (on_nonfinite='skip')"
            )
        return True

    # -- consistency points ----------------------------------------------------------------

    def sync(self) -> None:
        """Finish and merge what is in flight, then every rank takes the average."""
        if self.comm is None or not self.tensors:
            return
        self.unpark()
        self.flush(averaging_next=True)
        self.average_now("synchronisation point")
        self.record_ready(force=True)
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.buffer_bytes)

    def park_and_average(self) -> None:
        """The model becomes the workers' average; the live weights wait in a buffer (``unpark``)."""
        buffer = self.scratch_buffer()
        self.average_now("evaluation", swap=True)  # model <- average, buffer <- live weights
        self._parked_in = buffer

    def unpark(self) -> None:
        if self._parked_in is not None:
            with torch.no_grad():
                self._parked_in.swap(self.tensors)
            self._parked_in = None

    def close(self) -> None:
        """Training or evaluation is over: finish what is in flight, let go of the tensors.

        The module may move next (Lightning's teardown moves it to the CPU, which rebinds every
        parameter's storage), so the next stage captures the tensors afresh."""
        self.unpark()
        if self.comm is not None:
            with contextlib.suppress(Exception):  # a peer may be gone: what is in flight is lost with it
                self.flush()
                self.record_ready(force=True)
        if self.compressed is not None:
            self.compressed.close()
            self.compressed = None
        self.comm = self.control = self.codec_comm = None
        self._scratch = None
        self.tensors = []

    # -- what a checkpoint and a spawn parent keep -----------------------------------------------

    def state(self) -> dict[str, Any]:
        """What resuming needs (algorithms add theirs)."""
        return {"class": self.owner, "steps": self.steps, "weight": self.weight}

    def load_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise ValueError(  # noqa: TRY004 (callers and tests expect ValueError for a bad state)
                f"{self.owner}: a state is the dict state_dict() returned, not {type(state).__name__}"
            )
        if state.get("class") != self.owner:
            raise ValueError(
                f"the checkpoint was written by {state.get('class')}, not {self.owner}: resume with the same strategy"
            )
        self.steps = count(self.owner, "the state's steps", state.get("steps"))
        check_weight(self.owner, state.get("weight"), "the state's weight")

    def rank_state(self) -> dict[str, Any]:
        """What resuming needs of this rank's own (the compressed rounds' reference and residuals)."""
        return {"compression": self.compressed.state_dict()} if self.compressed is not None else {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        saved = state.get("compression")
        if self.compressed is not None and saved is not None:
            try:
                self.compressed.load_state_dict(
                    saved, self.scratch_buffer().buckets
                )  # the rounds' bucket sizes
            except ValueError as err:
                raise ValueError(f"{self.owner}: {err}") from None

    def results(self) -> dict[str, Any]:
        """What a spawn/fork parent learns from rank 0 when fit ends. Plain data: Lightning's
        launcher walks (and would try to move) whatever it sends back."""
        return {
            "comm_stats": self.comm_stats.to_json(),
            "peak_buffer_bytes": self.peak_buffer_bytes,
            "skipped": self.skipped,
            "weight": self.weight,
        }
