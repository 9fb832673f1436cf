"""The outer round: an outer model theta and an outer optimizer over it (no Lightning here).

One round on worker i, with period H and overlap d (0 <= d <= H, counted in optimizer steps):

    after step kH - d:  s_i <- x_i;  start the all-reduce of Delta_i = theta - s_i
    ... d local steps while it is in flight ...
    after step kH:      wait for Delta = sum_j p_j Delta_j;  theta' <- outer step on theta with
                        grad = Delta;  x_i <- theta' + (x_i - s_i);  theta <- theta'

theta starts as the common initial model; the inner optimizer's state stays local. d = 0 with
Nesterov SGD (lr 0.7, momentum 0.9) is DiLoCo (Douillard et al. 2023); a small d keeps the
local steps taken while the reduction was in flight (Streaming DiLoCo's overlap, Douillard et al.
2025, with this correction in place of its blend); a heavy-ball outer SGD is SlowMo's outer step
(Wang et al. 2020). Outer SGD with lr 1 and no momentum gives theta' = mean_j s_j: Local-SGD at
d = 0, CoCoD-SGD's merge at d = H, up to rounding (theta - (theta - mean s) is not always mean s
in floating point). An ``outer_scheduler`` (a factory optimizer -> LRScheduler) steps once after
every outer step, e.g. a linear warm-up of the outer learning rate: the first rounds' pseudo-
gradients are the largest and most alike across workers, and outer momentum at full rate on them
overshoots (docs/accuracy/long-rounds.md). The rounds that schedule it are
``rounds.cocod.CoCoDRounds``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_cocod._options import invalid
from lightning_cocod.core.averaging import SnapshotRound
from lightning_cocod.core.comm import Communicator, Handle
from lightning_cocod.core.flat import FlatBuffer

OuterFactory = Callable[[list[Tensor]], Optimizer]
SchedulerFactory = Callable[[Optimizer], LRScheduler]
# DiLoCo's outer optimizer (Douillard et al. 2023, for AdamW workers; torchft's DiLoCo defaults to it too).
DILOCO_OUTER: OuterFactory = functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)
ACCEPTED = (
    "None (the paper's merge: theta' = mean of the snapshots) or a callable params -> "
    "torch.optim.Optimizer, e.g. functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)"
)

SCHEDULER_ACCEPTED = (
    "None (the outer learning rate as given) or a callable optimizer -> "
    "torch.optim.lr_scheduler.LRScheduler, stepped after every outer step, e.g. "
    "functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.25, total_iters=3)"
)


def describe_outer(factory: OuterFactory | None) -> str | None:
    """A factory in words that compare equal on every rank (a partial has no equality of its own):
    what the options print and what the ranks agree on."""
    if factory is None:
        return None
    if isinstance(factory, functools.partial):
        args = [repr(a) for a in factory.args] + [f"{k}={v!r}" for k, v in factory.keywords.items()]
        return f"{describe_outer(factory.func)}({', '.join(args)})"
    module = getattr(factory, "__module__", None) or type(factory).__module__
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{module}.{name}"


def _built(owner: str, option: str, factory: Any, argument: Any, kind: type, accepted: str) -> Any:
    """``factory(argument)``, or a one-line ValueError naming ``owner`` and ``option`` when it
    builds no ``kind`` (not callable, raising, or returning something else)."""
    if not callable(factory):
        raise invalid(owner, option, factory, accepted)
    try:
        built = factory(argument)
    except Exception as err:  # noqa: BLE001 - any failure of the user's factory is the option's
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise invalid(owner, option, factory, f"{accepted} (it raised: {first})") from None
    if not isinstance(built, kind):
        raise invalid(owner, option, factory, f"{accepted} (it returned a {type(built).__name__})")
    return built


def build_outer(owner: str, factory: Any, params: list[Tensor]) -> Optimizer:
    return _built(owner, "outer_optimizer", factory, params, Optimizer, ACCEPTED)


def build_scheduler(owner: str, factory: Any, optimizer: Optimizer) -> LRScheduler:
    return _built(owner, "outer_scheduler", factory, optimizer, LRScheduler, SCHEDULER_ACCEPTED)


def check_outer(owner: str, factory: Any, scheduler: Any = None) -> OuterFactory | None:
    """Refuse a bad factory (and scheduler factory) now, before any worker starts, by building
    them once over a throwaway tensor (the real ones are built over theta when training starts)."""
    if scheduler is not None and factory is None:
        accepted = "None without an outer_optimizer (it schedules the outer optimizer's learning rate)"
        raise invalid(owner, "outer_scheduler", scheduler, accepted)
    if factory is not None:
        optimizer = build_outer(owner, factory, [torch.zeros(1)])
        if scheduler is not None:
            build_scheduler(owner, scheduler, optimizer)
    return factory


class OuterRound(SnapshotRound):
    """The outer round in the verbs of ``CoCoDRound``: ``begin`` (snapshot, launch Delta_i) and
    ``finish`` (wait, outer step, merge), over persistent flat buffers.

    Memory: three flat copies of the model (the snapshot, theta, and the buffer the all-reduce
    works in, which holds Delta), plus the outer optimizer's state (one more for momentum). The
    outer optimizer steps theta's flat buckets, whose ``.grad`` is the mean Delta during the step;
    the scheduler, when there is one, steps after it.
    """

    def __init__(
        self,
        tensors: Sequence[Tensor],
        comm: Communicator,
        factory: OuterFactory,
        weight: float | None = None,
        owner: str = "OuterRound",
        scheduler: SchedulerFactory | None = None,
    ) -> None:
        super().__init__(tensors, comm, weight)  # average: Delta_i, then the mean Delta
        self.theta = FlatBuffer(self.tensors)
        self.theta.pack(self.tensors)  # the common initial model
        self.optimizer = build_outer(owner, factory, self.theta.buckets)
        self.scheduler = None if scheduler is None else build_scheduler(owner, scheduler, self.optimizer)

    def _to_reduce(self) -> None:
        for delta, theta, snapshot in zip(self.average.buckets, self.theta.buckets, self.snapshot.buckets):
            torch.sub(theta, snapshot, out=delta)

    def finish(self) -> Handle:
        handle = self._landed("finish")
        # On a GPU the outer step and the merge are queued on the compute stream, which the wait
        # ordered after the landing (an event with NCCL), as CoCoD's merge is: the host goes on.
        for theta, delta in zip(self.theta.buckets, self.average.buckets):
            theta.grad = delta
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        for theta in self.theta.buckets:
            theta.grad = None
        # x <- theta' + (x - s): the local steps taken since the snapshot are kept (zero at d = 0).
        torch._foreach_sub_(self.tensors, self.snapshot.views)
        torch._foreach_add_(self.tensors, self.theta.views)
        return handle

    # Before a synchronisation point the outer step is taken all the same: the exact average
    # that follows averages the workers, not the outer update, which no average stands in for.
    settle = finish

    def state_dict(self) -> dict[str, Any]:
        """theta and the outer optimizer's (and scheduler's) state, the same on every rank (every
        rank steps the same theta with the same mean Delta)."""
        state = {
            "theta": [b.detach().cpu().clone() for b in self.theta.buckets],
            # A copy: the optimizer's own dict holds its live buffers, which the next step changes.
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }
        if self.scheduler is not None:
            state["scheduler"] = copy.deepcopy(self.scheduler.state_dict())
        return state

    def load_state_dict(self, state: Any, owner: str) -> None:
        theta = state.get("theta") if isinstance(state, dict) else None
        buckets = self.theta.buckets
        if not (
            isinstance(theta, list)
            and len(theta) == len(buckets)
            and all(
                isinstance(t, Tensor) and t.shape == b.shape and t.dtype == b.dtype
                for t, b in zip(theta, buckets)
            )
        ):
            shapes = ", ".join(f"{b.numel()} {b.dtype}" for b in buckets)
            raise invalid(
                owner, "the state's outer theta", type(theta).__name__, f"a list of tensors of {shapes}"
            )
        for bucket, saved in zip(buckets, theta):
            bucket.copy_(saved)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(
                f"{owner}: the state's outer optimizer does not fit this run's ({err}); accepted: the "
                "state of the same outer_optimizer over the same model"
            ) from None
        self._load_scheduler(state, owner)

    def _load_scheduler(self, state: dict[str, Any], owner: str) -> None:
        """The schedule resumes where it was; a state from a run without one (or with one where this
        run has none) is refused: the outer learning rate would silently restart or stay scheduled."""
        saved = state.get("scheduler")
        if self.scheduler is None and saved is None:
            return
        if self.scheduler is None or not isinstance(saved, dict):
            found = "none" if saved is None else type(saved).__name__
            wanted = (
                "the state of this run's outer_scheduler"
                if self.scheduler
                else "none (this run has no outer_scheduler)"
            )
            raise invalid(owner, "the state's outer scheduler", found, wanted)
        try:
            self.scheduler.load_state_dict(saved)
        except (KeyError, ValueError, TypeError) as err:
            raise ValueError(
                f"{owner}: the state's outer scheduler does not fit this run's ({err}); accepted: the "
                "state of the same outer_scheduler"
            ) from None
