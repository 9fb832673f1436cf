"""CoCoD-SGD: its rounds (``CoCoDRounds``, no Lightning) and its Lightning strategy."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lightning_cocod.core import CoCoDRound, FiniteCheck, FlatBuffer, Handle
from lightning_cocod.core.adapt import AdaptivePeriod, safe_tau_max
from lightning_cocod.core.averaging import DEFAULT_PROGRESS, check_progress
from lightning_cocod.strategies.base import SyncStrategyBase, of_rounds
from lightning_cocod.strategies.rounds import Rounds

log = logging.getLogger(__name__)

# A tiny all-reduce goes with the model's in every round, on a CPU (gloo) group so that reading it
# never waits on a GPU: the sum over ranks of an earlier round's figures (communication seconds,
# seconds per step, seconds of the round's own work), how many ranks sent figures, then one
# non-finite flag per rank. Every rank thus agrees on the figures tau="auto" uses and on who holds NaN/Inf.
_FIGURES = 3
_COUNT, _FLAGS = _FIGURES, _FIGURES + 1


def check_period(owner: str, tau: Any) -> int:
    # bool is an int subclass: tau=True would silently mean 1.
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
        raise ValueError(f"{owner}: tau must be a positive integer (optimizer steps per round), got {tau!r}")
    return tau


class CoCoDRounds(Rounds):
    """CoCoD-SGD's rounds: the snapshot launched at a round's start, merged ``tau`` steps later
    (see ``CoCoDMethod``, whose arguments these are)."""

    def __init__(
        self,
        owner: str,
        tau: int | str = "auto",
        tau_min: int | None = None,
        tau_max: int | None = None,
        progress: float = DEFAULT_PROGRESS,
        **common: Any,
    ) -> None:
        self.progress = check_progress(owner, progress)
        self.adaptive: AdaptivePeriod | None = None
        if tau == "auto":
            if tau_max is None:  # the safe bound, or the shortest period asked for if that is longer
                shortest = tau_min if isinstance(tau_min, int) and not isinstance(tau_min, bool) else 1
                tau_max = max(safe_tau_max(self.progress), shortest)
            try:
                self.adaptive = AdaptivePeriod(1 if tau_min is None else tau_min, tau_max)
            except ValueError as err:
                raise ValueError(f"{owner}: {err}") from None
            self.tau = self.adaptive.tau
        else:
            if isinstance(tau, str):
                raise ValueError(f"{owner}: tau must be a positive integer or 'auto', got {tau!r}")
            self.tau = check_period(owner, tau)
            if tau_min is not None or tau_max is not None:
                raise ValueError(
                    f"{owner}: tau_min/tau_max bound tau='auto' only; with tau={tau} leave them unset"
                )
        super().__init__(owner, **common)
        self.round: CoCoDRound | None = None
        self._launch_step = 0
        self._round_started = 0.0
        self._round_cost = 0.0
        self._rounds_finished = 0
        self._control: Tensor | None = None  # the round's control all-reduce (see _FIGURES)
        self._control_handle: Handle | None = None
        self._snapshot_check: FiniteCheck | None = None
        # The last timed round: its handle (communication time, once readable), seconds per
        # step, seconds of own work. Figures carried over from a checkpoint until then.
        self._timing: tuple[Handle, float, float] | None = None
        self._measured: tuple[float, ...] | None = None
        self.tau_history: list[tuple[int, int]] = []
        self._bound_told = False  # the hiding period above tau_max is said once a fit

    def results(self) -> dict[str, Any]:
        return {**super().results(), "tau": self.tau, "tau_history": self.tau_history}

    def options(self) -> dict[str, Any]:
        tau: Any = "auto" if self.adaptive else self.tau
        return {"tau": tau, "progress": self.progress, **super().options()}

    def build(self) -> None:
        assert self.comm is not None
        assert self.round_comm is not None
        self.round = CoCoDRound(self.tensors, self.round_comm, self.weight, self.progress)
        self._rounds_finished = 0
        self._control = torch.zeros(_FLAGS + self.world_size, dtype=torch.float64)
        self._timing, self._measured = None, None
        self.tau_history = [(0, self.tau)]
        self._bound_told = False

    def retarget(self) -> None:
        if self.round is not None:
            self.round.tensors = self.tensors

    def flat_buffers(self) -> list[FlatBuffer]:
        mine = [self.round.snapshot, self.round.average] if self.round is not None else []
        return mine + [b for b in super().flat_buffers() if all(b is not m for m in mine)]

    def scratch_buffer(self) -> FlatBuffer:
        # With no round in flight the round's all-reduce buffer is idle: the synchronisation
        # points (checkpoint, end of fit) average in it, so only evaluation in the middle of a
        # round needs a third copy of the model.
        if self.round is not None and not self.round.pending:
            return self.round.average
        return super().scratch_buffer()

    def begin_step(self) -> None:
        assert self.round is not None and self.comm is not None
        if self.round.pending:
            return
        beginning = time.perf_counter()
        self.follow_model()
        self.round.weight = self.weight
        self.round.begin()
        self._launch_step = self.steps
        self._snapshot_check = FiniteCheck(self.round.snapshot.buckets)
        self._round_started = time.perf_counter()
        self._round_cost = self._round_started - beginning

    def end_step(self) -> None:
        if self.round is not None and self.round.pending and self._control_handle is None:
            self._launch_control()
        if self.steps - self._launch_step >= self.tau:
            self.flush()

    def request_lag(self) -> int:
        return self.tau  # no tighter than the round itself couples the workers

    def figures(self) -> dict[str, float]:
        return {**super().figures(), "comm/tau": float(self.tau)}

    def _launch_control(self) -> None:
        """One step into the round: by now the snapshot's finite check and an earlier round's
        figures have reached the host, so nothing here waits on a GPU. A non-finite snapshot was
        sent already, but no rank merges a round whose flags are raised."""
        started = time.perf_counter()
        assert self._control is not None and self._snapshot_check is not None
        self._control[:_FLAGS] = torch.tensor(self._figures_to_send(), dtype=torch.float64)
        self._control[_FLAGS:] = self.health_flags(self._snapshot_check.result(), device=self._control.device)
        assert self.control is not None
        self._control_handle = self.control.start_mean([self._control], 1.0)
        self._round_cost += time.perf_counter() - started

    def _figures_to_send(self) -> tuple[float, ...]:
        if self._timing is not None and self._timing[0].figures_ready():
            handle, step_seconds, round_seconds = self._timing
            self._measured = (handle.comm_seconds, step_seconds, round_seconds)
        return (*self._measured, 1.0) if self._measured is not None else (0.0,) * (_FIGURES + 1)

    def flush(self, averaging_next: bool = False) -> None:
        if self.round is None or not self.round.pending:
            return
        if self.steps == self._launch_step:
            # Launched after the last step (a loop launches eagerly) and no step taken since: the
            # weights are the snapshot, so the round is not merged; it was sent all the same, and
            # its bytes and time count in the figures like any round's.
            self.record(self.round.abandon(), self._launch_step, self.round.nbytes)
            return
        if self._control_handle is None:  # fit or a checkpoint came inside the round's first step
            self._launch_control()
        steps = self.steps - self._launch_step
        compute = time.perf_counter() - self._round_started
        assert self._control_handle is not None and self._control is not None
        waiting = time.perf_counter()
        self._control_handle.wait()  # gloo may finish it before the model's (several threads)
        self._control_handle = None
        control = self._control.tolist()
        waited = time.perf_counter() - waiting
        where = f"in the snapshot of the round launched at step {self._launch_step}"
        if self.raise_if_nonfinite(torch.tensor(control[_FLAGS:]), where):
            self.round.abandon()  # on_nonfinite="skip": this round is not merged anywhere
            if self.compressed is not None:  # its reference and residuals took the bad values in
                self.compressed.reset()
            return
        merging = time.perf_counter()
        self.follow_model()  # the merge lands in the weights the model holds now
        # Before the synchronisation's exact average, the round's own is not merged: it would add
        # a compressed round's error to the end (and the average makes an exact one redundant).
        handle = self.round.settle() if averaging_next else self.round.finish()
        # The merge's own time: the host blocking in the wait for the model's all-reduce is
        # communication, not the round's work (on CUDA it is a stream dependency instead).
        self._round_cost += max(0.0, time.perf_counter() - merging - handle.blocked_seconds)
        self.record(handle, self._launch_step, self.round.nbytes, also_waited=waited)
        if self.adaptive is not None:
            if control[_COUNT] > 0:  # the mean over the ranks that had figures to send
                self._adapt_period(*(figure / control[_COUNT] for figure in control[:_FIGURES]))
            # A fit's first round pays one-time costs (allocations, the group's first collective):
            # it is not timed.
            if self._rounds_finished > 0 and steps > 0:
                self._timing = (handle, compute / steps, self._round_cost)
        self._rounds_finished += 1

    def _adapt_period(self, comm_seconds: float, step_seconds: float, round_seconds: float) -> None:
        assert self.adaptive is not None
        old, new = self.tau, self.adaptive.update(comm_seconds, step_seconds, round_seconds)
        self._tell_if_bound_binds()
        if new != old:
            self.tau = new
            self.tau_history.append((self.steps, new))
            if self.rank == 0:
                log.info(
                    f"CoCoD tau {old} -> {new} at step {self.steps} "
                    f"(communication {comm_seconds:.3f} s and own work {round_seconds:.3f} s per round, "
                    f"{step_seconds:.3f} s per step)"
                )

    def _tell_if_bound_binds(self) -> None:
        """Once a fit, on rank 0: the link needs a longer period to hide a round than ``tau_max``
        allows, what that costs and what to do. Every rank has the same figures, so the bound
        binds on all of them at the same round; only the saying is rank 0's."""
        adaptive = self.adaptive
        assert adaptive is not None
        hiding = adaptive.hiding_period()
        if self._bound_told or hiding is None or hiding <= adaptive.tau_max:
            return
        self._bound_told = True
        if self.rank != 0:
            return
        comm, step, bound = adaptive.comm_seconds or 0.0, adaptive.step_seconds or 0.0, adaptive.tau_max
        exposed = max(0.0, comm - bound * step)
        codec = f"compression={self.codec.name!r} rounds" if self.codec is not None else "fp32 rounds"
        log.warning(
            f"CoCoD-SGD tau='auto': hiding a round of this link ({comm:.3f} s of communication with "
            f"{codec}, {step:.3f} s per step) takes tau={hiding}, above tau_max={bound}: about {exposed:.3f} s "
            f"of every round stays exposed ({exposed / (exposed + bound * step):.0%} of its time); "
            f"send fewer bytes (compression='int8'), allow tau_max={hiding} at the accuracy a longer "
            f"period costs, or use Local-SGD, which loses less accuracy at long periods"
        )

    def state(self) -> dict[str, Any]:
        state = {**super().state(), "tau": self.tau, "tau_history": self.tau_history}
        if self.adaptive is not None:
            state["adaptive"] = {
                k: list(v) if isinstance(v, list) else v for k, v in vars(self.adaptive).items()
            }
            self._figures_to_send()  # the newest readable figures
            state["measured"] = self._measured
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        if self.adaptive is not None and "adaptive" in state:  # a fixed tau is the caller's choice
            # What was measured carries over; the bounds and rules are the caller's of this fit.
            adaptive = self.adaptive
            for key in ("comm_seconds", "step_seconds", "round_seconds", "round_samples", "shorter_asks"):
                if key in state["adaptive"]:
                    setattr(adaptive, key, state["adaptive"][key])
            adaptive.tau = min(max(state["tau"], adaptive.tau_min), adaptive.tau_max)
            self.tau_history = [tuple(e) for e in state["tau_history"]]
            if adaptive.tau != state["tau"]:  # the saved period lies outside this fit's bounds
                self.tau_history.append((self.steps, adaptive.tau))
            self.tau = adaptive.tau
            measured = state.get("measured")
            # Older checkpoints sent zeros for "nothing measured", and had no round cost.
            if measured is not None and any(measured):
                self._measured = (*measured, 0.0)[:_FIGURES]

    def abandon(self) -> None:
        if self.round is not None:
            self.round.handle = None
        self._control_handle = None
        self._timing = None


class CoCoDMethod(SyncStrategyBase):
    """Computation and communication decoupled SGD (Shen et al., IJCAI 2019, arXiv:1906.12043).

    Every ``tau`` optimizer steps a round ends and the next begins. At the start of a round each
    worker snapshots its model and launches a non-blocking all-reduce of the snapshot on a
    process group of its own; it then takes ``tau`` local steps with no communication, and only
    then waits and merges: ``x_i <- sum_j p_j snap_j + (x_i - snap_i)`` (``p_j = 1/N`` unless
    proportional sampling sets ``weight``). A partial last round is merged when fit ends,
    followed by a plain average so every rank ends with the same weights.

    The merge happens in ``optimizer_step`` rather than in a callback: it has to happen exactly
    once per optimizer step (not per batch: gradient accumulation, manual optimization), before
    any checkpoint callback dumps the weights, and under the same object that owns the
    in-flight handle and the process group. Communication figures go to the Trainer's loggers.

    Args:
        tau: ``"auto"`` (the default): the shortest period that hides the round's communication as
            this strategy measures it, with the codec in use (compressed rounds are shorter, so
            they hide at shorter periods), and keeps the round's own cost (snapshot, checks,
            merge) under 1% of its steps, re-chosen every round from figures all ranks agree on
            (they travel with the next round's all-reduce; a fit's first round, which pays
            one-time costs, is not counted; the first rounds use 4, or ``tau_max`` when that is
            smaller); or a fixed number of optimizer steps per round (the paper's k).
        tau_min: the shortest period ``tau="auto"`` may choose (default 1).
        tau_max: the longest period ``tau="auto"`` may choose (default ``SAFE_TAU_MAX``, 2: the
            longest period at which CoCoD-SGD kept S-SGD's accuracy in the package's accuracy
            studies, on MNIST-1D with momentum SGD and on a GPT with AdamW; 1 with ``progress``
            above 1, the only period that kept it with an outer step; never below ``tau_min``). When a link needs a longer period to hide a round, the strategy says so
            once, in one line, with what the exposed communication costs; raise ``tau_max`` to
            hide it at the accuracy a longer period costs, or send fewer bytes (``compression``).
        progress: the share of its own progress since the round began that a worker keeps at the
            merge, ``x_i <- avg + progress * (x_i - snap_i)``; 1 (the default) is the paper's
            rule. It is an outer learning rate. Less damps what separates the workers but also
            slows the mean: on the MNIST-1D study (docs/accuracy/mnist1d-study.md) 0.5 closed
            most of the gap to S-SGD at 4 workers and the largest learning rate, and lost
            accuracy at a smaller one and at 8 workers. More moves the mean further than the
            workers went: with AdamW, whose moments stay on each worker, the mean of N workers'
            steps is about 1/sqrt(N) of S-SGD's, and sqrt(N) restores it
            (docs/accuracy/language-model.md). One worker has no rounds, so it trains as plain
            SGD whatever this is.
        compression: None (fp32, the default), "bf16" or "int8" (one int8 per element and an
            fp32 scale per 2,048): a round sends the worker's progress since the last average
            ``A``, encoded, instead of its weights, and the sum is reduced in fp32 so that every
            rank gets the same new ``A`` (``core.compress``): about 2x and 4x fewer bytes. The
            first round of a fit is exact. ``error_feedback`` (default True) adds what encoding
            dropped to the next round, so nothing is lost, only delayed.
        average_buffers: round BatchNorm running statistics (floating-point buffers) with the
            parameters; integer buffers always stay local.
    """

    tau = of_rounds("tau")
    tau_history = of_rounds("tau_history")  # (step, tau) at the start and at every change
    progress = of_rounds("progress")
    rounds_class: type[CoCoDRounds] = CoCoDRounds  # a variant of the rounds (a study's control) sets its own

    def __init__(
        self,
        tau: int | str = "auto",
        tau_min: int | None = None,
        tau_max: int | None = None,
        progress: float = DEFAULT_PROGRESS,
        compression: str | None = None,
        error_feedback: bool = True,
        **kwargs: Any,
    ) -> None:
        rounds = partial(
            self.rounds_class,
            tau=tau,
            tau_min=tau_min,
            tau_max=tau_max,
            progress=progress,
            compression=compression,
            error_feedback=error_feedback,
        )
        super().__init__(rounds, **kwargs)
