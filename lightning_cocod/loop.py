"""CoCoD-SGD, Local-SGD and Pipe-SGD in a training loop of your own (plain PyTorch under torchrun,
or Lightning Fabric through ``lightning_cocod.fabric``)::

    with CoCoD(model, optimizer, tau=4) as cocod:   # hooks optimizer.step: nothing to call per step
        for x, y in loader:
            loss_fn(model(x), y).backward(); optimizer.step(); optimizer.zero_grad()
        with cocod.averaged():                       # evaluation sees the average of the workers
            evaluate(model)

The rounds are the strategies' own (``lightning_cocod.rounds``): this class only calls them from
torch's optimizer step hooks. A round is launched right after an optimizer step (and on entering),
so that its all-reduce overlaps the next step's forward and backward too, as the strategies'
launch before forward does; the same weights are snapshot either way. On exit the pending round
is merged and every rank takes the average, so every rank leaves with the same weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any, ClassVar, Self

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from lightning_cocod.core import CommStats, FlatBuffer, TorchDistCommunicator
from lightning_cocod.rounds import CoCoDRounds, DiLoCoRounds, LocalSGDRounds, PipeSGDRounds, Rounds
from lightning_cocod.rounds.options import check_weight, disagreement, parse_timeout

_OWNER = "_lightning_cocod_loop"  # set on an optimizer while a loop object hooks it


class _RoundsLoop:
    """What the three loop classes share; ``rounds_class`` is the algorithm."""

    rounds_class: ClassVar[type[Rounds]]

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Optimizer,
        *,
        group: dist.ProcessGroup | None = None,
        weight: float | None = None,
        timeout: Any = None,
        **options: Any,
    ) -> None:
        self._check(model, optimizer, weight)
        self._take(
            self.rounds_class(type(self).__name__, **options), model, optimizer, group, weight, timeout
        )

    @classmethod
    def around(
        cls,
        rounds: Rounds,
        model: torch.nn.Module,
        optimizer: Optimizer,
        *,
        weight: Any = None,
        timeout: Any = None,
    ) -> Self:
        """A loop object over ``rounds`` built already, with this class's options (the Fabric
        strategies build theirs when they are constructed, so that a bad option is refused then)."""
        loop = cls.__new__(cls)
        loop._check(model, optimizer, weight)
        # From now on the rounds are this loop's: its name in their messages and in their state
        # (so a state saved under Fabric resumes in a plain loop, and back).
        rounds.owner = cls.__name__
        loop._take(rounds, model, optimizer, None, weight, timeout)
        return loop

    def _check(self, model: Any, optimizer: Any, weight: Any) -> None:
        name = type(self).__name__
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{name}: model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{name}: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        check_weight(name, weight)

    def _take(
        self,
        rounds: Rounds,
        model: torch.nn.Module,
        optimizer: Optimizer,
        group: Any,
        weight: Any,
        timeout: Any,
    ) -> None:
        name = type(self).__name__
        self.rounds = rounds
        self.rounds.weight = weight
        self.model, self.optimizer, self.group = model, optimizer, group
        self.timeout = parse_timeout(name, timeout)
        self._hooks: list[Any] = []
        self._loaded: dict[str, Any] | None = None  # a state given before entering, applied on entering

    def __repr__(self) -> str:
        options = {**self.rounds.options(), "weight": self.weight}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in options.items())})"

    @property
    def entered(self) -> bool:
        """Inside the ``with`` block (or between ``start()`` and ``close()``): its hooks run every step."""
        return bool(self._hooks)

    @property
    def stats(self) -> CommStats:
        """Every finished round's figures: seconds, exposed seconds, bytes."""
        return self.rounds.comm_stats

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored by ``load_state_dict``)."""
        return self.rounds.steps

    @property
    def weight(self) -> float | None:
        """This rank's share of every average (None: the plain mean)."""
        return self.rounds.weight

    # -- entering and leaving ---------------------------------------------------------------------

    def __enter__(self) -> Self:
        name = type(self).__name__
        if self._hooks:
            raise RuntimeError(f"{name} is entered already: enter it once, around the whole training loop")
        if getattr(self.optimizer, _OWNER, None) is not None:
            raise RuntimeError(
                f"{name}: this optimizer is hooked by another {getattr(self.optimizer, _OWNER)} already"
            )
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"{name}: no process group is initialised; call torch.distributed.init_process_group() first "
                "(torchrun sets its environment), or run under Fabric(strategy='cocod')"
            )
        device = next(self.model.parameters()).device
        ranks = None if self.group is None else dist.get_process_group_ranks(self.group)
        world_size = dist.get_world_size(self.group)
        comm = control = codec_comm = None
        if world_size > 1:
            # Groups of their own (collective calls: every rank of the default group makes them):
            # the user's collectives never queue behind a model-sized all-reduce in flight.
            backend = dist.get_backend(self.group)
            comm = TorchDistCommunicator(dist.new_group(ranks, timeout=self.timeout, backend=backend), device)
            gloo = dist.new_group(
                ranks, timeout=self.timeout, backend="gloo"
            )  # figures and flags, on the host
            control = TorchDistCommunicator(gloo, torch.device("cpu"))
            try:
                self._check_same_options(gloo)
            except BaseException:
                comm.destroy()
                control.destroy()
                raise
            if self.rounds.codec is not None:  # compressed rounds' exchange, on a thread of its own
                codec_comm = TorchDistCommunicator(
                    dist.new_group(ranks, timeout=self.timeout, backend=backend), device
                )
        self.rounds.attach(
            self.model,
            comm,
            rank=dist.get_rank(self.group),
            world_size=world_size,
            device=device,
            control=control,
            codec_comm=codec_comm,
        )
        self.rounds.optimizers = [self.optimizer]
        self.rounds.start()
        try:
            self.rounds.refuse_untracked_optimizer_tensors(self.rounds.live_tensors(), unused_too=True)
            if comm is not None:
                self._check_same_start()
            if self._loaded is not None:
                self.rounds.load_state(self._loaded)
                self.rounds.load_rank_state(self._loaded.get("rank", {}))
        except Exception:
            self._release()
            raise
        self._hooks = [
            self.optimizer.register_step_pre_hook(lambda *_: self.rounds.run(self.rounds.exchange)),
            self.optimizer.register_step_post_hook(lambda *_: self._after_step()),
        ]
        setattr(self.optimizer, _OWNER, name)
        self.rounds.run(self.rounds.begin_step)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:  # as close() after a failure
            self.rounds.abandon()
            self._release()

    def start(self) -> Self:
        """What entering the ``with`` block does, for a loop that would rather not indent:
        ``cocod = CoCoD(model, optimizer, tau=4).start()`` ... ``cocod.close()``."""
        return self.__enter__()

    def close(self) -> None:
        """Merge the pending round and make every rank's weights the average (what leaving the
        ``with`` block does); every rank calls it."""
        try:
            if self._hooks:
                self.rounds.run(self.rounds.sync)
        except BaseException:
            self.rounds.abandon()  # a peer may be gone: waiting on what is in flight could hang until the timeout
            raise
        finally:
            self._release()

    def _release(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        with contextlib.suppress(AttributeError):
            delattr(self.optimizer, _OWNER)
        comm, control, codec = self.rounds.comm, self.rounds.control, self.rounds.codec_comm
        self.rounds.close()
        for communicator in {id(c): c for c in (comm, control, codec) if c is not None}.values():
            communicator.destroy()

    def _after_step(self) -> None:
        self.rounds.steps += 1
        self.rounds.run(self.rounds.end_step)
        self.rounds.run(self.rounds.begin_step)

    def _check_same_options(self, group: dist.ProcessGroup) -> None:
        """Ranks given different options would make different collectives: gloo aborts a rank
        (SIGABRT) on mismatched compressed payloads, and other mismatches end in the timeout,
        blaming a dead or stalled peer. Compared before any collective that depends on them, as
        the app compares its ranks' configs (``app.agreement``); a rank's own weight may differ."""
        mine = self.rounds.agreed()
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
        if problem := disagreement(gathered, "every rank must be given the same options"):
            raise ValueError(f"{type(self).__name__}: {problem}")

    def _check_same_start(self) -> None:
        """Workers that start apart would average unrelated models: refused on every rank alike.
        The ranks' element-wise maximum and minimum agree only where every rank holds the same."""
        extremes = []
        for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            buffer = FlatBuffer(self.rounds.tensors)
            buffer.pack(self.rounds.tensors)
            for bucket in buffer.buckets:
                dist.all_reduce(bucket, op=op, group=self.rounds.comm.group)
            extremes.append(buffer)
        shares = torch.tensor(
            [1.0 / self.rounds.world_size if self.weight is None else self.weight], dtype=torch.float64
        )
        dist.all_reduce(shares, group=self.rounds.control.group)
        for name, high, low in zip(self.rounds.names, *(e.views for e in extremes)):
            if not torch.allclose(high, low, rtol=0, atol=0, equal_nan=True):
                raise ValueError(
                    f"{type(self).__name__}: the model's tensor '{name}' differs between ranks at the start; every rank "
                    "must start from the same weights (seed every rank alike before building the model, or load "
                    "the same checkpoint on every rank)"
                )
        if abs(float(shares) - 1.0) > 1e-6:
            raise ValueError(
                f"{type(self).__name__}: the ranks' weights sum to {float(shares):.6g}; accepted: shares that sum "
                "to 1 over the ranks (b_i / B for batches b_i of a global batch B), or None on every rank"
            )

    # -- evaluation and checkpoints ------------------------------------------------------------------

    @contextlib.contextmanager
    def averaged(self) -> Iterator[None]:
        """The model holds the workers' average inside the block; the live weights return after
        it, so evaluating never changes the training trajectory. Every rank enters it."""
        self.rounds.run(self.rounds.park_and_average)
        try:
            yield
        finally:
            self.rounds.unpark()

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs besides the model's and the optimizer's state. Inside the ``with``
        block it is a synchronisation point, as the strategies' checkpoints are: every rank calls
        it, the pending round is merged and every rank takes the average, so the model's state
        is the run's (save each rank's optimizer state too: momentum stays local)."""
        # This rank's own part (compressed rounds' reference and residuals): each rank saves its
        # own, taken before the next round is launched and starts changing it.
        if not self._hooks:
            return {**self.rounds.state(), "rank": self.rounds.rank_state()}
        self.rounds.run(self.rounds.sync)
        state = {**self.rounds.state(), "rank": self.rounds.rank_state()}
        self.rounds.run(self.rounds.begin_step)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``, before entering (the model's and the optimizer's state
        loaded too, on every rank): entering launches a round from the weights the model holds."""
        if self._hooks:
            raise RuntimeError(
                f"{type(self).__name__}: load_state_dict inside the with block; call it before entering"
            )
        self.rounds.load_state(state)  # refused now if it is another method's; applied on entering
        self._loaded = state


class CoCoD(_RoundsLoop):
    """CoCoD-SGD: the round's all-reduce of the model overlaps ``tau`` local steps (see
    ``CoCoDStrategy``, whose options these are: ``tau`` (an integer or ``"auto"``), ``tau_min``,
    ``tau_max``, ``progress``, ``overlap``, ``outer_optimizer``, ``outer_scheduler``, ``average_buffers``,
    ``on_nonfinite``, ``compression``, ``error_feedback``), on the default process group
    or ``group``; ``weight``: this rank's share of every average (None: the plain mean);
    ``timeout``: seconds (or a timedelta) before a collective gives up on a peer."""

    rounds_class = CoCoDRounds

    @property
    def tau(self) -> int:
        """The period of the round in flight (``tau="auto"`` re-chooses it every round)."""
        return self.rounds.tau

    @property
    def tau_history(self) -> list[tuple[int, int]]:
        """(step, tau) at the start and at every change."""
        return self.rounds.tau_history


class LocalSGD(_RoundsLoop):
    """Local-SGD: a blocking average of the models every ``tau`` optimizer steps (options as ``CoCoD``)."""

    rounds_class = LocalSGDRounds

    @property
    def tau(self) -> int:
        return self.rounds.tau


class PipeSGD(_RoundsLoop):
    """Pipe-SGD: each step applies the mean gradient of the step before (options as ``CoCoD``, no ``tau``)."""

    rounds_class = PipeSGDRounds


class DiLoCo(_RoundsLoop):
    """DiLoCo: every ``tau`` steps an outer step on the mean pseudo-gradient (see ``DiLoCoStrategy``,
    whose options these are: ``tau``, ``overlap``, ``outer_optimizer``, ``outer_scheduler``, ``average_buffers``,
    ``on_nonfinite``, ``compression``, ``error_feedback``; ``group``, ``weight`` and ``timeout``
    as ``CoCoD``'s)."""

    rounds_class = DiLoCoRounds

    @property
    def tau(self) -> int:
        return self.rounds.tau


LOOPS = {"cocod": CoCoD, "diloco": DiLoCo, "local_sgd": LocalSGD, "pipe_sgd": PipeSGD}
