"""The rounds layer on the fake communicator (no processes, no Lightning): every ``*Rounds`` class
against the update rule computed in plain tensors (``tests.helpers.toy``), and ``CoCoDRound.settle``.

Each simulated worker runs its own loop in a thread, so that a blocking average (Local-SGD's round,
every synchronisation point) waits for the others as it would on a real group."""

import pytest
import torch

from lightning_cocod.core import CoCoDRound
from lightning_cocod.rounds import CoCoDRounds, LocalSGDRounds, PipeSGDRounds
from tests.helpers import toy
from tests.helpers.fake_comm import BlockingCluster, FakeCluster, run_ranks_in_threads

WORLD, STEPS = 2, 8


def train(make_rounds, steps=STEPS, built=None):
    """Every worker's weights after each step, and after the final synchronisation point
    (``built``: a list that receives each rank's rounds object)."""
    workers = toy._Workers(WORLD, steps)
    model_group, control_group = BlockingCluster(WORLD), BlockingCluster(WORLD)
    trajectories: list[list[list[float]]] = [[] for _ in range(WORLD)]

    def worker(rank: int) -> None:
        model, optimizer = workers.models[rank], workers.opts[rank]
        x, y = workers.data[rank]
        rounds = make_rounds()
        if built is not None:
            built.append(rounds)
        rounds.attach(
            model,
            model_group.comms[rank],
            rank=rank,
            world_size=WORLD,
            device=torch.device("cpu"),
            control=control_group.comms[rank],
        )
        rounds.optimizers = [optimizer]
        rounds.start()
        for step in range(steps):
            rounds.run(rounds.begin_step)
            optimizer.zero_grad()
            batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            rounds.run(rounds.exchange)
            optimizer.step()
            rounds.steps += 1
            rounds.run(rounds.end_step)
            trajectories[rank].append(toy.flat(model))
        rounds.run(rounds.sync)
        trajectories[rank].append(toy.flat(model))

    run_ranks_in_threads(worker, WORLD)
    per_step = [list(ranks) for ranks in zip(*trajectories)]
    return per_step[:-1], per_step[-1]


def assert_same(actual, expected):
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("tau", "progress"), [(4, 1.0), (3, 0.5), (3, 2.0)])
def test_cocod_rounds_follow_the_rule(tau, progress):
    # tau=3 over 8 steps ends inside a round: the end merges it, then every worker takes the mean.
    trajectory, final = train(lambda: CoCoDRounds("test", tau=tau, progress=progress))
    expected, expected_final = toy.reference_cocod(WORLD, STEPS, tau, progress=progress)
    assert_same(trajectory, expected)
    assert_same(final, expected_final)
    assert final[0] == final[1]


def test_auto_rounds_agree_on_every_period_from_the_figures_they_exchange():
    built = []
    _, final = train(lambda: CoCoDRounds("test", tau="auto", tau_max=8), steps=24, built=built)
    # Each rank timed its own rounds; the periods come from the figures summed over the ranks, so
    # every rank chose the same ones at the same steps and ends with the same weights.
    assert len(built) == WORLD and built[0].tau_history == built[1].tau_history
    assert built[0].tau_history[0] == (0, 4) and all(1 <= tau <= 8 for _, tau in built[0].tau_history)
    assert final[0] == final[1]


@pytest.mark.parametrize("tau", [1, 3])
def test_local_sgd_rounds_average_every_tau_steps(tau):
    trajectory, final = train(lambda: LocalSGDRounds("test", tau=tau))
    expected, expected_final = toy.reference_local_sgd(WORLD, STEPS, tau)
    assert_same(trajectory, expected)
    assert_same(final, expected_final)


def test_pipe_sgd_rounds_apply_the_mean_gradient_of_the_step_before():
    trajectory, final = train(lambda: PipeSGDRounds("test"))
    expected, expected_final = toy.reference_pipe_sgd(WORLD, STEPS)
    assert_same(trajectory, expected)
    assert_same(final, expected_final)


# -- CoCoDRound.settle (core) ------------------------------------------------------------------------


def _round_on_every_rank(progress):
    cluster = FakeCluster(WORLD)
    tensors = [[torch.tensor([1.0, 2.0]) * (rank + 1), torch.tensor([[3.0]]) - rank] for rank in range(WORLD)]
    rounds = [CoCoDRound(tensors[rank], cluster.comms[rank], progress=progress) for rank in range(WORLD)]
    snapshots = [[t.clone() for t in ts] for ts in tensors]
    for r in rounds:
        r.begin()
    for rank, ts in enumerate(tensors):  # the round's local steps
        for t in ts:
            t.add_(0.25 * (rank + 1))
    return rounds, tensors, snapshots


@pytest.mark.parametrize("progress", [1.0, 0.5, 2.0])
def test_settle_leaves_what_the_exact_average_turns_into_the_rule(progress):
    rounds, tensors, snapshots = _round_on_every_rank(progress)
    trained = [[t.clone() for t in ts] for ts in tensors]
    for r in rounds:
        r.settle()
        assert not r.pending
    for rank in range(WORLD):
        for now, snap, x in zip(tensors[rank], snapshots[rank], trained[rank]):
            # x <- (1 - progress) snap + progress x: with progress 1 the weights stay as trained.
            torch.testing.assert_close(now, (1 - progress) * snap + progress * x, rtol=0, atol=1e-6)
    # The exact mean that follows a settle is the rule's avg(snap) + progress mean(x - snap).
    for k in range(len(tensors[0])):
        mean_now = sum(tensors[r][k] for r in range(WORLD)) / WORLD
        avg_snap = sum(snapshots[r][k] for r in range(WORLD)) / WORLD
        progress_made = sum(trained[r][k] - snapshots[r][k] for r in range(WORLD)) / WORLD
        torch.testing.assert_close(mean_now, avg_snap + progress * progress_made, rtol=0, atol=1e-6)


def test_settle_waits_for_the_round_and_refuses_when_none_is_pending():
    rounds, _, _ = _round_on_every_rank(1.0)
    rounds[0].settle()
    assert rounds[0].comm.cluster.log[-1] == ("wait", 0, 0)  # it waited on the round's all-reduce
    with pytest.raises(RuntimeError, match=r"CoCoDRound.settle\(\) called with no round pending"):
        rounds[0].settle()
