"""``overlap="auto"`` on the fake communicator: the overlap each round runs at is the fewest steps
that hide the round on a link whose all-reduce takes a known number of step times, from the
figures the ranks exchange, and it travels with a checkpoint.

Time is faked: a rank's clock reads its own step count times ``STEP`` (so a step takes exactly
``STEP`` seconds and a round's own work none), and the model's all-reduce reports ``COMM[rank]``
seconds. The ranks are given different links so that only the figures they exchange, not their
own, can give the overlap each chooses."""

import math
import threading
import types

import pytest

from lightning_cocod.rounds import CoCoDRounds, DiLoCoRounds
from lightning_cocod.rounds import cocod as cocod_rounds
from lightning_cocod.rounds.cocod import OUTER_TAU
from tests.helpers.fake_comm import BlockingHandle
from tests.rounds.test_outer_round import NESTEROV, train

STEP = 0.1
MARGIN = 1.2  # the rule's margin (core.adapt.AdaptivePeriod): tau * t_step >= 1.2 t_comm
# Each rank's rounds are the current thread's: the clock a rank reads is its own.
_mine = threading.local()


@pytest.fixture
def link(monkeypatch):
    """Set the model all-reduce's seconds on each rank: ``link([comm0, comm1])``."""
    monkeypatch.setattr(
        cocod_rounds, "time", types.SimpleNamespace(perf_counter=lambda: _mine.rounds.steps * STEP)
    )

    def set_link(seconds):
        # Every collective reports it, the control message's too: only the model's is read.
        monkeypatch.setattr(BlockingHandle, "comm_seconds", property(lambda h: seconds[h.comm.rank]))

    return set_link


def made(factory, built):
    def make():
        _mine.rounds = factory()
        built.append(_mine.rounds)
        return _mine.rounds

    return make


def expected_overlap(comm, tau):
    """The fewest steps that hide the mean round, with the rule's margin, within [1, tau]."""
    mean = sum(comm) / len(comm)
    return min(max(math.ceil(MARGIN * mean / STEP - 1e-9), 1), tau)


def rounds_of(rounds):
    return [(r.launch_step, r.finish_step) for r in rounds.comm_stats.rounds]


@pytest.mark.parametrize(
    ("name", "factory", "tau"),
    [
        ("diloco", lambda: DiLoCoRounds("test", tau=8, overlap="auto"), 8),
        ("outer, tau=auto", lambda: CoCoDRounds("test", tau="auto", outer_optimizer=NESTEROV), OUTER_TAU),
        ("paper's merge", lambda: CoCoDRounds("test", tau=6, overlap="auto"), 6),
    ],
)
@pytest.mark.parametrize("comm", [[0.2, 0.5], [0.01, 0.04], [1.0, 2.0]], ids=["hides", "fast", "slow"])
def test_the_overlap_is_the_fewest_steps_that_hide_the_round_and_ranks_agree(link, name, factory, tau, comm):
    link(comm)
    built = []
    _, final, _ = train(made(factory, built), steps=8 * tau)
    want = expected_overlap(comm, tau)
    # Alone, rank 0 would hide its link in fewer steps than rank 1: they agree on the mean's.
    assert want in (1, tau) or expected_overlap(comm[:1], tau) < want < expected_overlap(comm[1:], tau)
    assert [r.overlap_in_force for r in built] == [want, want]
    assert rounds_of(built[0]) == rounds_of(built[1])
    assert final[0] == final[1]
    # Every round hides all it can until the figures of a timed round arrive; the last rounds
    # run at the overlap chosen, which is what the metrics say.
    rounds = rounds_of(built[0])
    assert rounds[0] == (0, tau)
    assert rounds[-2:] == [(k * tau - want, k * tau) for k in (7, 8)]
    assert built[0].figures()["comm/overlap"] == float(want)
    assert built[0].options()["overlap"] == "auto" and built[0].agreed()["overlap_in_force"] == want


@pytest.mark.parametrize("at", [20, 36])
def test_resuming_keeps_the_overlap_chosen_and_what_it_was_chosen_from(link, at):
    # At 20 the overlap is about to shorten (one round has asked for less: the rule waits for a
    # second); at 36 it has, and its round is in flight, which the synchronisation point merges.
    link([0.2, 0.5])
    want = expected_overlap([0.2, 0.5], 8)
    whole_built, resumed_built = [], []
    make = made(lambda: DiLoCoRounds("test", tau=8, overlap="auto"), whole_built)
    whole, whole_final, saved = train(make, steps=56, checkpoint_at=at)
    assert saved[0]["rounds"]["overlap"] == saved[1]["rounds"]["overlap"] == (8 if at == 20 else want)
    resumed, resumed_final, _ = train(
        made(lambda: DiLoCoRounds("test", tau=8, overlap="auto"), resumed_built), steps=56, resume=saved
    )
    assert resumed == whole[at:] and resumed_final == whole_final  # bit for bit
    after = [r for r in rounds_of(whole_built[0]) if r[0] >= at]
    # The synchronisation point began a round at ``at``: rounds end at at + 8k, and the fit's end
    # cuts the last one short.
    assert rounds_of(resumed_built[0]) == after and (52 - want, 52) in after
    # Without it the overlap starts again from the whole period, and the run is another one.
    for state in saved:
        del state["rounds"]["auto_overlap"]
    lost, _, _ = train(made(lambda: DiLoCoRounds("test", tau=8, overlap="auto"), []), steps=56, resume=saved)
    assert lost != whole[at:]


def test_a_bad_saved_overlap_is_refused_in_one_line(link):
    link([0.2, 0.5])
    _, _, saved = train(
        made(lambda: DiLoCoRounds("test", tau=8, overlap="auto"), []), steps=16, checkpoint_at=12
    )
    state = {**saved[0]["rounds"], "overlap": 0}
    rounds = DiLoCoRounds("test", tau=8, overlap="auto")
    with pytest.raises(
        ValueError, match=r"^test: the state's overlap=0 is invalid; accepted: a positive integer \(steps\)$"
    ):
        rounds.load_state(state)


@pytest.mark.parametrize("overlap", ["sometimes", -1, 2.5, 5], ids=repr)
def test_a_bad_overlap_is_refused_in_one_line(overlap):
    # Every front-end says the same: tests/strategies/test_outer_options.py.
    with pytest.raises(ValueError) as refused:
        DiLoCoRounds("test", tau=4, overlap=overlap)
    assert str(refused.value) == (
        f"test: overlap={overlap!r} is invalid; accepted: None (the whole period, the paper's round), "
        "'auto' (the fewest steps that hide the round as measured) or an integer from 0 to tau=4"
    )
