"""CoCoD-SGD's rounds: the snapshot's all-reduce launched at a round's start, merged ``tau`` steps
later by ``core.CoCoDRound`` (the rule, with what ``progress`` means). The options are
``CoCoDMethod``'s; the period of ``tau="auto"`` is ``auto.AutoPeriod``'s.

The generalized round is scheduled here too: with ``overlap`` d the snapshot is taken after step
kH - d rather than at the round's start, and with an ``outer_optimizer`` the merge is
``core.outer.OuterRound``'s (theta and its outer step). ``overlap=None`` and
``outer_optimizer=None`` leave the paper's round exactly as it was: the launch condition below is
then true at every step with no round pending, as it always was. ``overlap="auto"`` re-chooses d
every round with ``auto.AutoPeriod``'s rule, from the figures sent with the round's control
message as ``tau="auto"``'s are. ``DiLoCoRounds`` is the same round with DiLoCo's defaults."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import Tensor

from lightning_cocod._options import invalid, is_int
from lightning_cocod.core import CoCoDRound, FiniteCheck, FlatBuffer, Handle
from lightning_cocod.core.averaging import DEFAULT_PROGRESS, check_progress
from lightning_cocod.core.outer import (
    DILOCO_OUTER,
    OuterFactory,
    OuterRound,
    SchedulerFactory,
    check_outer,
    describe_outer,
)
from lightning_cocod.rounds.auto import FIGURES, AutoPeriod
from lightning_cocod.rounds.base import Rounds
from lightning_cocod.rounds.period import check_period

log = logging.getLogger(__name__)

# A tiny all-reduce goes with the model's in every round, on a CPU (gloo) group so that reading it
# never waits on a GPU: the sum over ranks of an earlier round's figures for tau="auto"
# (``auto.FIGURES`` of them and a count of the ranks that sent any), then one non-finite flag per
# rank. Every rank thus agrees on the figures and on who holds NaN/Inf.
_FLAGS = FIGURES + 1
TAU = 'a positive integer (optimizer steps per round) or "auto"'
PERIOD_ONLY = "a positive integer (optimizer steps per round)"
# The period tau="auto" runs the outer round at (an outer_optimizer given): the period the
# long-rounds study ran it at (docs/accuracy/long-rounds.md: on its GPT, 8 and 16 ended alike and
# 32 lost more). What a period costs is the task's, which a link's timing says nothing of; what
# the timing decides is the overlap that hides the round within it.
OUTER_TAU = 8
AUTO = "auto"


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


class CoCoDRounds(Rounds):
    """CoCoD-SGD's rounds (see ``CoCoDMethod``, whose arguments these are)."""

    def __init__(
        self,
        owner: str,
        tau: int | str = "auto",
        tau_min: int | None = None,
        tau_max: int | None = None,
        progress: float = DEFAULT_PROGRESS,
        overlap: int | str | None = None,
        outer_optimizer: OuterFactory | None = None,
        outer_scheduler: SchedulerFactory | None = None,
        **common: Any,
    ) -> None:
        self.progress = check_progress(owner, progress)
        self.auto: AutoPeriod | None = None  # tau="auto": the period's controller
        self.auto_overlap: AutoPeriod | None = None  # overlap="auto": the overlap's
        self._tau_auto = _is_auto(tau)
        if self._tau_auto:
            overlap = self._auto_period(owner, tau_min, tau_max, overlap, outer_optimizer)
        else:
            self.tau = check_period(owner, tau, TAU)
            if tau_min is not None or tau_max is not None:
                raise ValueError(
                    f"{owner}: tau_min/tau_max bound tau='auto' only; with tau={tau} leave them unset"
                )
        if _is_auto(overlap):
            # The fewest steps that hide the round is the period rule's answer within [1, tau]. By
            # hiding alone (overhead=None): the round costs the same whatever its overlap. From
            # the whole period: before anything is measured the round hides all it can.
            self.auto_overlap = AutoPeriod(owner, 1, self.tau, self.progress, initial=self.tau, overhead=None)
        elif overlap is not None and not (is_int(overlap) and 0 <= overlap <= self.tau):
            accepted = (
                "None (the whole period, the paper's round), 'auto' (the fewest steps that hide the round "
                f"as measured) or an integer from 0 to tau={self.tau}"
            )
            raise invalid(owner, "overlap", overlap, accepted)
        self.overlap = overlap
        self.outer_optimizer = check_outer(owner, outer_optimizer, outer_scheduler)
        self.outer_scheduler = outer_scheduler
        if outer_optimizer is not None and self.progress != DEFAULT_PROGRESS:
            raise invalid(
                owner,
                "progress",
                progress,
                "1 with an outer_optimizer (its learning rate is what progress would scale)",
            )
        super().__init__(owner, **common)
        self.round: CoCoDRound | OuterRound | None = None
        self._launch_step = 0
        self._round_start = 0  # the step the round in progress began at: the last merge
        self._round_started = 0.0
        self._round_cost = 0.0
        self._control: Tensor | None = None  # the round's control all-reduce (see _FLAGS)
        self._control_handle: Handle | None = None
        self._snapshot_check: FiniteCheck | None = None
        self.tau_history: list[tuple[int, int]] = []  # (step, tau) at the start and at every change

    def _auto_period(
        self, owner: str, tau_min: Any, tau_max: Any, overlap: Any, outer: OuterFactory | None
    ) -> Any:
        """tau="auto": the paper's round gets its period chosen; the outer round runs at
        ``OUTER_TAU`` with its overlap chosen instead. Returns the overlap option in force."""
        if outer is None:
            if overlap is not None:
                # AutoPeriod measures the paper's round, whose overlap is the whole period.
                accepted = (
                    "None with tau='auto' and no outer_optimizer (the paper's round, which overlaps "
                    "the whole period chosen); give tau a number to fix or choose the overlap"
                )
                raise invalid(owner, "overlap", overlap, accepted)
            self.auto = AutoPeriod(owner, tau_min, tau_max, self.progress)
            self.tau = self.auto.tau
            return None
        for name, bound in (("tau_min", tau_min), ("tau_max", tau_max)):
            if bound is not None:
                accepted = (
                    f"None with an outer_optimizer (tau='auto' then runs the outer round at "
                    f"tau={OUTER_TAU} and chooses its overlap)"
                )
                raise invalid(owner, name, bound, accepted)
        if overlap is not None and not _is_auto(overlap):
            accepted = (
                f"None or 'auto' with tau='auto' and an outer_optimizer (the period is then {OUTER_TAU} "
                "and the overlap chosen); give tau a number for a fixed overlap"
            )
            raise invalid(owner, "overlap", overlap, accepted)
        self.tau = OUTER_TAU
        return AUTO

    @property
    def overlap_in_force(self) -> int:
        """d: the steps a round's all-reduce runs alongside (None means the whole period)."""
        if self.auto_overlap is not None:
            return self.auto_overlap.tau
        return self.tau if self.overlap is None else min(self.overlap, self.tau)

    @property
    def _chooser(self) -> AutoPeriod | None:
        """What the round's figures are sent for and read back by (at most one is set)."""
        return self.auto if self.auto is not None else self.auto_overlap

    def results(self) -> dict[str, Any]:
        return {**super().results(), "tau": self.tau, "tau_history": self.tau_history}

    def options(self) -> dict[str, Any]:
        tau: Any = AUTO if self._tau_auto else self.tau
        options = {"tau": tau, "progress": self.progress}
        if self.overlap is not None:
            options["overlap"] = self.overlap
        if self.outer_optimizer is not None:
            options["outer_optimizer"] = describe_outer(self.outer_optimizer)
        if self.outer_scheduler is not None:
            options["outer_scheduler"] = describe_outer(self.outer_scheduler)
        return {**options, **super().options()}

    def agreed(self) -> dict[str, Any]:
        agreed = super().agreed()
        if self.auto is not None:  # each rank would bound the agreed period by its own limits
            agreed |= {"tau_min": self.auto.period.tau_min, "tau_max": self.auto.period.tau_max}
        if self.auto_overlap is not None:  # the period it is bounded by, and where it resumes
            agreed |= {"tau": self.tau, "overlap_in_force": self.overlap_in_force}
        return agreed

    def build(self) -> None:
        assert self.comm is not None
        assert self.round_comm is not None
        if self.outer_optimizer is None:
            self.round = CoCoDRound(self.tensors, self.round_comm, self.weight, self.progress)
        else:
            self.round = OuterRound(
                self.tensors,
                self.round_comm,
                self.outer_optimizer,
                self.weight,
                self.owner,
                self.outer_scheduler,
            )
        self._round_start = 0
        self._control = torch.zeros(_FLAGS + self.world_size, dtype=torch.float64)
        if self._chooser is not None:
            self._chooser.start()
        self.tau_history = [(0, self.tau)]

    def retarget(self) -> None:
        if self.round is not None:
            self.round.tensors = self.tensors

    def flat_buffers(self) -> list[FlatBuffer]:
        mine = [self.round.snapshot, self.round.average] if self.round is not None else []
        if isinstance(self.round, OuterRound):
            mine.append(self.round.theta)
        return mine + [b for b in super().flat_buffers() if all(b is not m for m in mine)]

    def scratch_buffer(self) -> FlatBuffer:
        # With no round in flight the round's all-reduce buffer is idle: the synchronisation
        # points (checkpoint, end of fit) average in it, so only evaluation in the middle of a
        # round needs a third copy of the model.
        if self.round is not None and not self.round.pending:
            return self.round.average
        return super().scratch_buffer()

    def request_lag(self) -> int:
        return self.tau  # no tighter than the round itself couples the workers

    def figures(self) -> dict[str, float]:
        # The overlap of the last round as it ran (a synchronisation point may end one early).
        last = self.comm_stats.rounds[-1]
        overlap = float(last.finish_step - last.launch_step)
        return {**super().figures(), "comm/tau": float(self.tau), "comm/overlap": overlap}

    # -- the step ------------------------------------------------------------------------------------

    def begin_step(self) -> None:
        assert self.round is not None and self.comm is not None
        # The snapshot is taken d steps before the round ends: at once after a merge for the
        # paper's round (d = tau); at the round's end itself for d = 0, which ``end_step`` runs.
        overlap = self.overlap_in_force
        if self.round.pending or overlap == 0 or self.steps - self._round_start < self.tau - overlap:
            return
        self._launch()

    def _launch(self) -> None:
        assert self.round is not None
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
        if self.steps - self._round_start < self.tau:
            return
        if self.round is not None and not self.round.pending and self.overlap_in_force == 0:
            self._launch()  # d = 0: snapshot, reduce and merge at once (DiLoCo, Local-SGD)
        self.flush()

    def _launch_control(self) -> None:
        """One step into the round: by now the snapshot's finite check and an earlier round's
        figures have reached the host, so nothing here waits on a GPU. A non-finite snapshot was
        sent already, but no rank merges a round whose flags are raised."""
        started = time.perf_counter()
        assert self._control is not None and self._snapshot_check is not None
        chooser = self._chooser
        figures = chooser.figures_to_send() if chooser is not None else (0.0,) * _FLAGS
        self._control[:_FLAGS] = torch.tensor(figures, dtype=torch.float64)
        self._control[_FLAGS:] = self.health_flags(self._snapshot_check.result(), device=self._control.device)
        assert self.control is not None
        self._control_handle = self.control.start_mean([self._control], 1.0)
        self._round_cost += time.perf_counter() - started

    def flush(self, averaging_next: bool = False) -> None:
        if self.round is None or not self.round.pending:
            return
        if self.steps == self._launch_step and self.overlap_in_force > 0:
            # Launched after the last step (a loop launches eagerly) and no step taken since: the
            # weights are the snapshot, so the round is not merged (the same round is launched
            # again from the same weights); it was sent all the same, and its bytes and time
            # count in the figures like any round's.
            self.record(self.round.abandon(), self._launch_step, self.round.nbytes)
            return
        self._round_start = self.steps
        if self._control_handle is None:  # fit or a checkpoint came inside the round's first step
            self._launch_control()
        steps = self.steps - self._launch_step
        compute = time.perf_counter() - self._round_started
        control, waited = self._wait_control()
        if self._dropped_for_nonfinite(control):
            return
        handle = self._merge(averaging_next)
        self.record(handle, self._launch_step, self.round.nbytes, also_waited=waited)
        if self._chooser is not None:
            self._consult_auto(control, handle, steps, compute)

    def _wait_control(self) -> tuple[list[float], float]:
        """The round's control message, summed over the ranks, and the seconds waited for it."""
        assert self._control_handle is not None and self._control is not None
        waiting = time.perf_counter()
        self._control_handle.wait()  # gloo may finish it before the model's (several threads)
        self._control_handle = None
        return self._control.tolist(), time.perf_counter() - waiting

    def _dropped_for_nonfinite(self, control: list[float]) -> bool:
        """Raise if a snapshot held NaN/Inf; with on_nonfinite="skip" drop the round everywhere.

        With the outer round no outer step is taken on any rank: theta and the outer optimizer's
        state stay as the last healthy round left them, alike everywhere (only the inner
        optimizers of the bad ranks restart), and the next round's Delta carries the healthy
        workers' progress of both rounds."""
        assert self.round is not None
        where = f"in the snapshot of the round launched at step {self._launch_step}"
        if not self.raise_if_nonfinite(torch.tensor(control[_FLAGS:]), where):
            return False
        self.round.abandon()
        if self.compressed is not None:  # its reference and residuals took the bad values in
            self.compressed.reset()
        return True

    def _merge(self, averaging_next: bool) -> Handle:
        assert self.round is not None
        merging = time.perf_counter()
        self.follow_model()  # the merge lands in the weights the model holds now
        # Before the synchronisation's exact average, the round's own is not merged: it would add
        # a compressed round's error to the end (and the average makes an exact one redundant).
        handle = self.round.settle() if averaging_next else self.round.finish()
        # The merge's own time: the host blocking in the wait for the model's all-reduce is
        # communication, not the round's work (on CUDA it is a stream dependency instead).
        self._round_cost += max(0.0, time.perf_counter() - merging - handle.blocked_seconds)
        return handle

    def _consult_auto(self, received: list[float], handle: Handle, steps: int, compute: float) -> None:
        """The period (or the overlap) of the next round, from the figures ``received`` with this
        one; rank 0 says once if ``tau_max`` keeps rounds exposed (every rank has the same figures)."""
        if self.auto_overlap is not None:
            old = self.overlap_in_force
            new = self.auto_overlap.after_round(received, handle, steps, compute, self._round_cost)
            if new != old and self.rank == 0:
                comm, step, _ = self.auto_overlap.last
                log.info(
                    f"overlap {old} -> {new} of tau={self.tau} at step {self.steps} "
                    f"(communication {comm:.3f} s per round, {step:.3f} s per step)"
                )
            return
        assert self.auto is not None
        self._set_tau(self.auto.after_round(received, handle, steps, compute, self._round_cost))
        if self.rank == 0:
            self.auto.warn_if_bound_binds(self.comm_stats, self.codec.name if self.codec else None)

    def _set_tau(self, new: int) -> None:
        old = self.tau
        if new == old:
            return
        self.tau = new
        self.tau_history.append((self.steps, new))
        if self.rank == 0 and self.auto is not None:
            comm, step, own = self.auto.last
            log.info(
                f"CoCoD tau {old} -> {new} at step {self.steps} "
                f"(communication {comm:.3f} s and own work {own:.3f} s per round, {step:.3f} s per step)"
            )

    def abandon(self) -> None:
        if self.round is not None:
            self.round.handle = None
        self._control_handle = None
        if self._chooser is not None:
            self._chooser.abandon()

    # -- what a checkpoint keeps ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        state = {
            **super().state(),
            "tau": self.tau,
            "tau_history": self.tau_history,
            "round_start": self._round_start,
        }
        if isinstance(self.round, OuterRound):  # theta and the outer optimizer's state
            state["outer"] = self.round.state_dict()
        if self.auto_overlap is not None:
            state |= {"overlap": self.overlap_in_force, "auto_overlap": self.auto_overlap.state()}
        return state | self.auto.state() if self.auto is not None else state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        tau = check_period(self.owner, state.get("tau"), option="the state's tau")
        history = state.get("tau_history")
        if not isinstance(history, list) or not all(
            isinstance(e, (list, tuple))
            and len(e) == 2
            and is_int(e[0])
            and e[0] >= 0
            and is_int(e[1])
            and e[1] >= 1
            for e in history
        ):
            raise invalid(
                self.owner, "the state's tau_history", history, "a list of (step >= 0, tau >= 1) pairs"
            )
        # Where the round in progress began (a state saved before rounds could start late has
        # none: its rounds began at the saved step).
        start = state.get("round_start", self.steps)
        if not (is_int(start) and 0 <= start <= self.steps):
            raise invalid(self.owner, "the state's round_start", start, f"an integer from 0 to {self.steps}")
        self._round_start = start
        if isinstance(self.round, OuterRound) and "outer" in state:
            self.round.load_state_dict(state["outer"], self.owner)
        if self.auto_overlap is not None and "auto_overlap" in state:
            self._load_auto_overlap(state)
        if self.auto is None or "adaptive" not in state:  # a fixed tau is the caller's choice
            return
        self.tau = self.auto.load_state(state, tau)
        self.tau_history = [tuple(e) for e in history]
        if self.tau != tau:  # the saved period lies outside this fit's bounds
            self.tau_history.append((self.steps, self.tau))

    def _load_auto_overlap(self, state: dict[str, Any]) -> None:
        """The overlap in force and what it was chosen from; a saved overlap longer than this fit's
        period is cut to it."""
        assert self.auto_overlap is not None
        overlap, saved = state.get("overlap"), state["auto_overlap"]
        if not (is_int(overlap) and overlap >= 1):
            raise invalid(self.owner, "the state's overlap", overlap, "a positive integer (steps)")
        if not (isinstance(saved, dict) and "adaptive" in saved):
            raise invalid(
                self.owner,
                "the state's auto_overlap",
                type(saved).__name__,
                "the dict of figures state() saved",
            )
        self.auto_overlap.load_state(saved, overlap)


class DiLoCoRounds(CoCoDRounds):
    """DiLoCo's rounds (Douillard et al. 2023): the outer round with no overlap and Nesterov SGD
    as the outer optimizer (see ``DiLoCoMethod``)."""

    def __init__(
        self,
        owner: str,
        tau: int = 8,
        overlap: int | str | None = 0,
        outer_optimizer: OuterFactory | None = DILOCO_OUTER,
        **common: Any,
    ) -> None:
        if tau == "auto":
            raise invalid(owner, "tau", tau, PERIOD_ONLY)
        super().__init__(owner, tau=tau, overlap=overlap, outer_optimizer=outer_optimizer, **common)

    def options(self) -> dict[str, Any]:
        options = super().options()
        del options["progress"]  # not DiLoCo's option: its outer optimizer's lr is
        return options
