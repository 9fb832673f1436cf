"""The generalized round (``overlap``, ``outer_optimizer``) and DiLoCo on the fake communicator,
against the rule written here in plain tensors: a hand-written Nesterov outer step, a snapshot
after step kH - d, ``x_i <- theta' + (x_i - s_i)``. Each simulated worker runs on a thread, so
that blocking averages wait for the others as on a real group."""

import copy
import functools

import pytest
import torch

from lightning_cocod.core import CoCoDRound
from lightning_cocod.rounds import CoCoDRounds, DiLoCoRounds, LocalSGDRounds
from tests.helpers import toy
from tests.helpers.fake_comm import BlockingCluster, FakeCluster, run_ranks_in_threads

STEPS, LR, MOMENTUM = 8, 0.7, 0.9
NESTEROV = functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM, nesterov=True)
PLAIN_SGD = functools.partial(torch.optim.SGD, lr=1.0)
WARMUP = functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.25, total_iters=3)


def warmed_lr(k):
    """The outer lr of the k-th outer step (from 0) under WARMUP: a quarter, then up by a quarter
    per round to LR."""
    return LR * min(1.0, 0.25 + 0.75 * k / 3)


def _drive(rounds, workers, rank, first, last, poison=None):
    """``poison``: (rank, step): NaN in that rank's ``weight[0, 0]`` once that step's round work is done."""
    model, optimizer = workers.models[rank], workers.opts[rank]
    x, y = workers.data[rank]
    trajectory = []
    for step in range(first, last):
        rounds.run(rounds.begin_step)
        optimizer.zero_grad()
        batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        optimizer.step()
        rounds.steps += 1
        rounds.run(rounds.end_step)
        if poison == (rank, rounds.steps):
            with torch.no_grad():
                model.weight[0, 0] = float("nan")
        trajectory.append(toy.flat(model))
    return trajectory


def train(make_rounds, world=2, steps=STEPS, checkpoint_at=None, resume=None, weights=None, poison=None):
    """Every worker's weights after each step and after the final synchronisation point.
    ``checkpoint_at``: a synchronisation point there, whose states (rounds, model, optimizer per
    rank) are returned too; ``resume``: such states, the run starting from them at their step;
    ``weights``: each rank's share of every average; ``poison``: see ``_drive``."""
    workers = toy._Workers(world, steps)
    model_group, control_group = BlockingCluster(world), BlockingCluster(world)
    trajectories = [[] for _ in range(world)]
    saved = [None] * world

    def worker(rank):
        model, optimizer = workers.models[rank], workers.opts[rank]
        rounds = make_rounds()
        first = 0
        if resume is not None:
            model.load_state_dict(resume[rank]["model"])
            optimizer.load_state_dict(resume[rank]["optimizer"])
        rounds.attach(
            model, model_group.comms[rank], rank=rank, world_size=world, device=torch.device("cpu"),
            control=control_group.comms[rank],
        )  # fmt: skip
        rounds.optimizers = [optimizer]
        rounds.weight = None if weights is None else weights[rank]
        rounds.start()
        if resume is not None:
            rounds.load_state(resume[rank]["rounds"])
            first = rounds.steps
        if checkpoint_at is not None:
            trajectories[rank] += _drive(rounds, workers, rank, first, checkpoint_at, poison)
            rounds.run(rounds.sync)
            saved[rank] = {
                "rounds": rounds.state(),
                "model": {k: v.clone() for k, v in model.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),  # its own dict holds live buffers
            }
            first = checkpoint_at
        trajectories[rank] += _drive(rounds, workers, rank, first, steps, poison)
        rounds.run(rounds.sync)
        trajectories[rank].append(toy.flat(model))

    run_ranks_in_threads(worker, world)
    per_step = [list(ranks) for ranks in zip(*trajectories)]
    return per_step[:-1], per_step[-1], saved


def reference_outer(
    world, steps, tau, overlap, lr=LR, momentum=MOMENTUM, weights=None, poison=None, outer=None, lr_at=None
):
    """The rule with a Nesterov outer step written out (torch's SGD convention: the first buffer
    is the gradient itself); a fit ending inside a round merges it, then every rank averages.
    ``weights``: each rank's share of the mean Delta and of the final average. ``poison``: as
    ``train``'s, with on_nonfinite="skip": a round whose snapshots hold NaN takes no outer step
    (theta and the momentum stay), and its bad ranks restart from the lowest healthy rank's model
    with a fresh optimizer. ``outer``: a dict that receives the final theta and momentum buffer,
    the (step, bad ranks) skipped, and (step, flat theta) after every outer step. ``lr_at``: the
    lr of the k-th outer step taken (from 0), for a schedule; default ``lr`` throughout."""
    w = toy._Workers(world, steps)
    share = weights or [1 / world] * world
    theta = [p.detach().clone() for p in w.params(0)]
    buffer, snaps, start, trajectory, skipped, history = None, None, 0, [], [], []

    @torch.no_grad()
    def merge(step):
        nonlocal buffer
        bad = [r for r in range(world) if not all(torch.isfinite(t).all() for t in snaps[r])]
        if bad:
            healthy = min(set(range(world)) - set(bad))
            for r in bad:
                for p, good in zip(w.params(r), w.params(healthy)):
                    p.copy_(good)
                w.opts[r].state.clear()
            skipped.append((step, bad))
            return
        delta = [sum(share[r] * (theta[k] - snaps[r][k]) for r in range(world)) for k in range(len(theta))]
        buffer = delta if buffer is None else [momentum * b + g for b, g in zip(buffer, delta)]
        rate = lr if lr_at is None else lr_at(len(history))
        for k in range(len(theta)):
            theta[k] = theta[k] - rate * (delta[k] + momentum * buffer[k])
            for r in range(world):
                p = w.params(r)[k]
                p.copy_(theta[k] + (p - snaps[r][k]))
        history.append((step, torch.cat([t.reshape(-1) for t in theta])))

    for step in range(steps):
        if overlap > 0 and snaps is None and step - start == tau - overlap:
            snaps = w.snapshot()
        w.grads(step)
        for o in w.opts:
            o.step()
        if step + 1 - start == tau:
            if overlap == 0:
                snaps = w.snapshot()
            merge(step + 1)
            snaps, start = None, step + 1
        if poison is not None and poison[1] == step + 1:
            with torch.no_grad():
                w.models[poison[0]].weight[0, 0] = float("nan")
        trajectory.append(w.state())
    if snaps is not None:
        merge(steps)
    with torch.no_grad():
        for k in range(len(theta)):
            mean = sum(share[r] * w.params(r)[k] for r in range(world))
            for r in range(world):
                w.params(r)[k].copy_(mean)
    if outer is not None:
        outer.update(theta=theta, buffer=buffer, skipped=skipped, history=history)
    return trajectory, w.state()


def assert_close(actual, expected):
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=0, atol=1e-9)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(("tau", "overlap"), [(3, 0), (3, 1), (3, 3), (4, 1)])
def test_the_outer_round_follows_the_rule(world, tau, overlap):
    # 8 steps: tau=3 ends inside a round (after its snapshot at overlap 1 and 3), tau=4 does not.
    trajectory, final, _ = train(
        lambda: CoCoDRounds("test", tau=tau, overlap=overlap, outer_optimizer=NESTEROV), world
    )
    expected, expected_final = reference_outer(world, STEPS, tau, overlap)
    assert_close(trajectory, expected)
    assert_close(final, expected_final)
    assert all(rank == final[0] for rank in final)


@pytest.mark.parametrize(("tau", "overlap"), [(2, 0), (2, 1)])
def test_an_outer_scheduler_sets_each_outer_step_s_learning_rate(tau, overlap):
    # 8 steps at tau=2: four outer steps at a quarter, half, three quarters and all of LR.
    outer = {}
    trajectory, final, _ = train(
        lambda: CoCoDRounds(
            "test", tau=tau, overlap=overlap, outer_optimizer=NESTEROV, outer_scheduler=WARMUP
        )
    )
    expected, expected_final = reference_outer(2, STEPS, tau, overlap, lr_at=warmed_lr, outer=outer)
    assert_close(trajectory, expected)
    assert_close(final, expected_final)
    assert len(outer["history"]) == 4
    unscheduled, _ = reference_outer(2, STEPS, tau, overlap)
    assert trajectory[1] != unscheduled[1]  # the first outer step is a quarter of LR's


def test_heterogeneous_workers_weight_the_mean_pseudo_gradient():
    # A rank with 3/4 of the global batch moves theta three times as far as the other.
    weights = [0.25, 0.75]
    trajectory, final, _ = train(
        lambda: CoCoDRounds("test", tau=3, overlap=1, outer_optimizer=NESTEROV), weights=weights
    )
    expected, expected_final = reference_outer(2, STEPS, 3, 1, weights=weights)
    assert_close(trajectory, expected)
    assert_close(final, expected_final)
    plain, _ = reference_outer(2, STEPS, 3, 1)
    assert max(abs(a - b) for a, b in zip(plain[3][0], expected[3][0])) > 1e-3


def test_diloco_is_the_outer_round_with_no_overlap_and_nesterov():
    trajectory, final, _ = train(lambda: DiLoCoRounds("test", tau=3))
    expected, expected_final = reference_outer(2, STEPS, 3, 0)
    assert_close(trajectory, expected)
    assert_close(final, expected_final)


def test_outer_sgd_with_lr_1_and_no_momentum_is_local_sgd():
    diloco, diloco_final, _ = train(lambda: DiLoCoRounds("test", tau=3, outer_optimizer=PLAIN_SGD))
    local, local_final, _ = train(lambda: LocalSGDRounds("test", tau=3))
    # theta - (theta - mean s) is mean s up to one rounding of each subtraction: equal to the last
    # bits, not bit for bit.
    torch.testing.assert_close(torch.tensor(diloco), torch.tensor(local), rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.tensor(diloco_final), torch.tensor(local_final), rtol=0, atol=1e-14)
    # ...and the rounds did move the models (a round that did nothing would pass the above too
    # only if Local-SGD did nothing): the workers differ before a merge and agree after it.
    assert diloco[1][0] != diloco[1][1] and diloco[2][0] == diloco[2][1]


def _todays_cocod(tau, steps=STEPS, world=2):
    """The paper's round driven straight from ``core.CoCoDRound`` in lockstep: launched at every
    round's start, finished tau steps later; the trajectory only (the end averages apart)."""
    w = toy._Workers(world, steps)
    cluster = FakeCluster(world)
    rounds = [CoCoDRound(w.params(r), cluster.comms[r]) for r in range(world)]
    trajectory = []
    for step in range(steps):
        if step % tau == 0:
            with torch.no_grad():
                for r in rounds:
                    r.begin()
        w.grads(step)
        for o in w.opts:
            o.step()
        if (step + 1) % tau == 0:
            with torch.no_grad():
                for r in rounds:
                    r.finish()
        trajectory.append(w.state())
    return trajectory


@pytest.mark.parametrize("tau", [2, 4])
def test_no_overlap_or_outer_optimizer_given_is_todays_cocod_bit_for_bit(tau):
    default, default_final, _ = train(lambda: CoCoDRounds("test", tau=tau))
    explicit, explicit_final, _ = train(
        lambda: CoCoDRounds("test", tau=tau, overlap=None, outer_optimizer=None)
    )
    whole, _, _ = train(lambda: CoCoDRounds("test", tau=tau, overlap=tau))
    assert default == _todays_cocod(tau) == explicit == whole  # exact equality, every bit
    assert default_final == explicit_final
    expected, expected_final = toy.reference_cocod(2, STEPS, tau)
    assert_close(default, expected)
    assert_close(default_final, expected_final)


def test_overlap_without_an_outer_optimizer_merges_the_mean_of_later_snapshots():
    # The paper's merge x_i <- mean s + (x_i - s_i) with the snapshot one step before the merge:
    # the outer SGD with lr 1 and no momentum is the same rule, computed through theta.
    plain, _, _ = train(lambda: CoCoDRounds("test", tau=4, overlap=1))
    outer, _, _ = train(lambda: CoCoDRounds("test", tau=4, overlap=1, outer_optimizer=PLAIN_SGD))
    paper, _, _ = train(lambda: CoCoDRounds("test", tau=4))
    torch.testing.assert_close(torch.tensor(plain), torch.tensor(outer), rtol=0, atol=1e-14)
    assert plain[3] != paper[3]  # a later snapshot is another round


@pytest.mark.parametrize(("tau", "overlap", "at"), [(3, 1, 4), (3, 1, 5), (4, 2, 3), (3, 0, 4)])
def test_resuming_mid_round_with_the_outer_state_is_the_run_that_went_on(tau, overlap, at):
    # at=4 with tau=3, overlap=1: before the round's snapshot; at=5: the round in flight, which
    # the synchronisation point merges; either way theta and the momentum must travel.
    def make():
        return CoCoDRounds("test", tau=tau, overlap=overlap, outer_optimizer=NESTEROV)

    whole, whole_final, saved = train(make, checkpoint_at=at)
    resumed, resumed_final, _ = train(make, resume=saved)
    assert resumed == whole[at:]  # bit for bit
    assert resumed_final == whole_final
    assert "outer" in saved[0]["rounds"] and saved[0]["rounds"]["round_start"] <= at
    # Without the outer state the momentum and theta restart, and the run is another one.
    for state in saved:
        state["rounds"] = {k: v for k, v in state["rounds"].items() if k != "outer"}
    if overlap == 0 and at % tau:
        lost, _, _ = train(make, resume=saved)
        assert lost != whole[at:]


@pytest.mark.parametrize("at", [3, 5])
def test_resuming_mid_warm_up_goes_on_with_the_schedule_where_it_was(at):
    # tau=2, overlap=1: at 3 the second round is in flight (one outer step taken), at 5 the third.
    def make(schedule=WARMUP):
        return CoCoDRounds("test", tau=2, overlap=1, outer_optimizer=NESTEROV, outer_scheduler=schedule)

    whole, whole_final, saved = train(make, checkpoint_at=at)
    resumed, resumed_final, _ = train(make, resume=saved)
    assert resumed == whole[at:]  # bit for bit
    assert resumed_final == whole_final
    # A state saved with a schedule is refused by a run without one, and the other way round.
    with pytest.raises(
        ValueError, match=r"^test: the state's outer scheduler='dict' is invalid; accepted: none"
    ):
        train(lambda: make(None), resume=saved)
    for state in saved:
        state["rounds"]["outer"] = {k: v for k, v in state["rounds"]["outer"].items() if k != "scheduler"}
    with pytest.raises(
        ValueError,
        match=r"^test: the state's outer scheduler='none' is invalid; accepted: the state of this run's outer_scheduler$",
    ):
        train(make, resume=saved)


def test_the_figures_say_the_period_and_overlap_of_each_round():
    built = []

    def make():
        built.append(CoCoDRounds("test", tau=4, overlap=1, outer_optimizer=NESTEROV))
        return built[-1]

    train(make)
    rounds = [(r.launch_step, r.finish_step) for r in built[0].comm_stats.rounds]
    assert rounds[:2] == [(3, 4), (7, 8)]
    figures = built[0].figures()
    assert figures["comm/tau"] == 4.0 and figures["comm/overlap"] == 1.0
    assert figures["comm/payload_bytes"] > 0


def test_a_state_whose_outer_part_does_not_fit_is_refused_in_one_line():
    _, _, saved = train(lambda: DiLoCoRounds("test", tau=3), checkpoint_at=4)
    rounds = DiLoCoRounds("test", tau=3)
    model = toy.initial_model()
    rounds.attach(model, FakeCluster(1).comms[0], rank=0, world_size=1, device=torch.device("cpu"))
    rounds.start()
    state = saved[0]["rounds"]
    rounds.load_state(state)  # fits
    bad = {**state, "outer": {**state["outer"], "theta": [torch.zeros(3, dtype=torch.float64)]}}
    with pytest.raises(
        ValueError,
        match=r"^test: the state's outer theta='list' is invalid; accepted: a list of tensors of 10 torch.float64$",
    ):
        rounds.load_state(bad)
    other = {**state, "outer": {**state["outer"], "optimizer": {"state": {}, "param_groups": []}}}
    with pytest.raises(ValueError, match=r"^test: the state's outer optimizer does not fit this run's \("):
        rounds.load_state(other)
