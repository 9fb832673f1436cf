"""``on_nonfinite`` with the outer round (Nesterov outer SGD; overlap 0, 1 and the whole period)
on the fake communicator's threads, against the rule in plain tensors (``reference_outer``).

A round whose snapshot holds NaN on some rank takes no outer step on any rank: the mean Delta it
carried is dropped, so theta and the outer momentum stay as the last healthy round left them,
identical everywhere, and the next round's Delta carries the healthy workers' progress of both.
The bad ranks restart from the lowest healthy rank's model with a fresh inner optimizer; the
outer optimizer is never restarted (every rank must keep stepping the same theta alike)."""

import math

import pytest
import torch

from lightning_cocod.rounds import CoCoDRounds
from lightning_cocod.rounds.health import NonFiniteError
from tests.rounds.test_outer_round import NESTEROV, assert_close, reference_outer, train

STEPS, TAU, POISON_AFTER = 10, 3, 4  # rounds end at 3, 6, 9; the fit ends inside the fourth
# (overlap, the round end that sees the NaN): at overlap 0 and 1 the snapshot of the round ending
# at 6 holds it; at overlap 3 that round's snapshot (step 3) predates it, so its merge passes the
# NaN on to the bad rank's own model only, and the round ending at 9 sees it.
CASES = [(0, 6), (1, 6), (3, 9)]


def _outer_state(rounds):
    outer = rounds.round
    theta = torch.cat(list(outer.theta.buckets))
    momentum = torch.cat([outer.optimizer.state[b]["momentum_buffer"] for b in outer.theta.buckets])
    return theta, momentum


def _built(overlap, on_nonfinite):
    built = []

    def make():
        built.append(
            CoCoDRounds("test", tau=TAU, overlap=overlap, outer_optimizer=NESTEROV, on_nonfinite=on_nonfinite)
        )
        return built[-1]

    return built, make


@pytest.mark.parametrize(("world", "bad"), [(2, 1), (3, 0)], ids=["2-ranks-rank1-bad", "3-ranks-rank0-bad"])
@pytest.mark.parametrize(("overlap", "seen_at"), CASES, ids=[f"overlap{d}" for d, _ in CASES])
def test_skip_keeps_theta_and_momentum_healthy_and_alike_on_every_rank(world, bad, overlap, seen_at):
    built, make = _built(overlap, "skip")
    trajectory, final, _ = train(make, world, STEPS, poison=(bad, POISON_AFTER))
    outer = {}
    expected, expected_final = reference_outer(
        world, STEPS, TAU, overlap, poison=(bad, POISON_AFTER), outer=outer
    )
    assert outer["skipped"] == [(seen_at, [bad])]  # the case is the one meant
    assert math.isnan(trajectory[POISON_AFTER - 1][bad][0])  # it really went bad
    torch.testing.assert_close(
        torch.tensor(trajectory), torch.tensor(expected), rtol=0, atol=1e-9, equal_nan=True
    )
    assert_close(final, expected_final)
    assert torch.isfinite(torch.tensor(final)).all() and all(rank == final[0] for rank in final)
    ranks = sorted(built, key=lambda r: r.rank)
    assert [r.skipped for r in ranks] == [[(seen_at, [bad])]] * world
    theta, momentum = _outer_state(ranks[0])
    for other in ranks[1:]:  # bit for bit: every rank stepped the same theta with the same Delta
        assert all(torch.equal(a, b) for a, b in zip(_outer_state(other), (theta, momentum)))
    assert torch.isfinite(theta).all() and torch.isfinite(momentum).all()
    torch.testing.assert_close(theta, torch.cat([t.reshape(-1) for t in outer["theta"]]), rtol=0, atol=1e-9)
    torch.testing.assert_close(
        momentum, torch.cat([b.reshape(-1) for b in outer["buffer"]]), rtol=0, atol=1e-9
    )


@pytest.mark.parametrize(("overlap", "seen_at"), CASES, ids=[f"overlap{d}" for d, _ in CASES])
def test_raise_stops_every_rank_before_the_outer_step_takes_the_nan(overlap, seen_at):
    built, make = _built(overlap, "raise")
    launched = seen_at - overlap
    with pytest.raises(
        NonFiniteError,
        match=rf"^test: non-finite values \(NaN/Inf\) on rank 1 at optimizer step {seen_at} "
        rf"\(in the snapshot of the round launched at step {launched}\)",
    ):
        train(make, 2, STEPS, poison=(1, POISON_AFTER))
    outer = {}
    reference_outer(2, STEPS, TAU, overlap, poison=(1, POISON_AFTER), outer=outer)
    # theta as the last round before the NaN left it, on both ranks alike.
    last_healthy = [theta for step, theta in outer["history"] if step < seen_at][-1]
    ranks = sorted(built, key=lambda r: r.rank)
    assert all(r.steps == seen_at for r in ranks)
    for r in ranks:
        theta, momentum = _outer_state(r)
        assert torch.equal(theta, _outer_state(ranks[0])[0]) and torch.isfinite(momentum).all()
        torch.testing.assert_close(theta, last_healthy, rtol=0, atol=1e-9)
