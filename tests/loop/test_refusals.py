"""The loop API on 2 gloo ranks refuses what would otherwise fail far from its cause: ranks given
different options (a gloo abort, or the timeout blaming a peer) and a state of another run."""

import pytest
import torch

from lightning_cocod.loop import CoCoD, LocalSGD
from tests.helpers import toy
from tests.helpers.gloo_ranks import run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(150)]

TAU = 4


def enter_with(rank, options):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
    kind, kwargs = options[rank]
    # A short timeout: what the ranks did before the check was to wait on each other's collectives.
    with kind(model, optimizer, timeout=20, **kwargs):
        x, y = toy.rank_batches(rank, 2 * TAU)
        for step in range(2 * TAU):
            batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
            optimizer.zero_grad()
    return "trained"


@pytest.mark.parametrize(
    ("first", "second", "problem"),
    [
        (
            (CoCoD, {"tau": TAU, "compression": "int8"}),
            (CoCoD, {"tau": TAU, "compression": "bf16"}),
            "compression: 'int8' on rank 0, 'bf16' on rank 1",
        ),
        (
            (CoCoD, {"tau": TAU, "compression": "int8"}),
            (CoCoD, {"tau": TAU}),
            "compression: 'int8' on rank 0, None on rank 1",
        ),
        ((CoCoD, {"tau": TAU}), (CoCoD, {"tau": 2}), "tau: 4 on rank 0, 2 on rank 1"),
        (
            (CoCoD, {"tau": TAU}),
            (CoCoD, {"tau": TAU, "progress": 0.5}),
            "progress: 1.0 on rank 0, 0.5 on rank 1",
        ),
        (
            (CoCoD, {"tau": "auto", "tau_max": 8}),
            (CoCoD, {"tau": "auto", "tau_max": 16}),
            "tau_max: 8 on rank 0, 16 on rank 1",
        ),
        ((CoCoD, {"tau": TAU}), (LocalSGD, {"tau": TAU}), "class: 'CoCoD' on rank 0, 'LocalSGD' on rank 1"),
    ],
)
def test_ranks_given_different_options_are_told_which_at_the_start(tmp_path, first, second, problem):
    payloads = run_ranks(enter_with, tmp_path, (first, second), timeout=100)
    expected = f"rank 1 disagrees with rank 0 on {problem}; every rank must be given the same options"
    for rank, payload in enumerate(payloads):
        assert payload[0] == "error", payload
        name = first[0].__name__ if rank == 0 else second[0].__name__
        assert payload[1] == f"ValueError: {name}: {expected}", payload[1]


def test_ranks_that_agree_still_train(tmp_path):
    options = (CoCoD, {"tau": TAU, "compression": "int8"})
    assert [p[:2] for p in run_ranks(enter_with, tmp_path, (options, options), timeout=100)] == [
        ("ok", "trained")
    ] * 2


def resume_with(rank, tamper):
    """One compressed round's state, tampered with, loaded by a loop about to enter."""

    def loop():
        model = toy.initial_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
        return model, optimizer, CoCoD(model, optimizer, tau=2, compression="int8", timeout=20)

    model, optimizer, first = loop()
    x, y = toy.rank_batches(rank, 3)
    with first:
        for step in range(3):
            batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
            optimizer.zero_grad()
        state = first.state_dict()
    assert state["rank"]["compression"]["reference"] is not None  # a round has set A
    compression = state["rank"]["compression"]
    compression[tamper[0]] = tamper[1](compression[tamper[0]])
    model, optimizer, second = loop()
    second.load_state_dict(state)
    with second:
        torch.nn.functional.mse_loss(model(x[: toy.BATCH]), y[: toy.BATCH]).backward()
        optimizer.step()
    return "resumed"


@pytest.mark.parametrize(
    "tamper",
    [
        ("reference", lambda ts: [t[:-1] for t in ts]),  # another model's size
        ("reference", lambda ts: [t.double() for t in ts]),  # another dtype
        ("residuals", lambda ts: [torch.cat([t, t]) for t in ts]),  # as if saved on more ranks
        ("reference", lambda ts: [*ts, ts[0]]),  # another number of buckets
    ],
)
def test_a_compression_state_of_another_shape_or_dtype_is_refused_on_entering(tmp_path, tamper):
    payloads = run_ranks(resume_with, tmp_path, tamper, timeout=100)
    for payload in payloads:
        assert payload[0] == "error", payload
        assert payload[1].startswith(
            f"ValueError: CoCoD: compression state's {tamper[0]} does not fit this run: accepted: "
        ), payload[1]
        assert "\n" not in payload[1]


def test_a_state_of_steps_that_are_no_count_is_refused_in_one_line():
    model = toy.initial_model()
    loop = CoCoD(model, torch.optim.SGD(model.parameters(), lr=toy.LR), tau=TAU)
    state = loop.state_dict()
    for steps in ("abc", -7, 2.5, True, None):
        with pytest.raises(
            ValueError, match=rf"^CoCoD: the state's steps={steps!r} is invalid; accepted: an integer >= 0$"
        ):
            loop.load_state_dict({**state, "steps": steps})
    with pytest.raises(ValueError, match="^CoCoD: a state is the dict state_dict\\(\\) returned, not list$"):
        loop.load_state_dict([state])
    loop.load_state_dict({**state, "steps": 3})
    assert loop._loaded["steps"] == 3


def end_inside_a_round(rank, steps, codec):
    """``steps`` steps of compressed CoCoD rounds of TAU; the average evaluation saw just before the
    end, the final weights, and the rounds the figures hold."""
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR, momentum=toy.MOMENTUM)
    loop = CoCoD(model, optimizer, tau=TAU, compression=codec, timeout=20)
    x, y = toy.rank_batches(rank, steps)
    with loop:
        for step in range(steps):
            batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
            optimizer.zero_grad()
        with loop.averaged():
            shown = toy.flat(model)
    rounds = [(r.launch_step, r.finish_step) for r in loop.stats.rounds]
    return shown, toy.flat(model), rounds, loop.stats.rounds[-1].bytes_sent


@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_the_end_of_compressed_rounds_is_the_exact_mean_evaluation_showed(tmp_path, codec):
    # 6 steps: the end comes 2 steps into the second round, whose compressed average carries the
    # codec's error; the end is the exact mean of the workers' models, what averaged() showed.
    ranks = [p[1] for p in run_ranks(end_inside_a_round, tmp_path, 6, codec, timeout=100)]
    shown, final, rounds, _ = ranks[0]
    assert final == shown  # bit for bit: the same exact average of the same weights
    assert ranks[1][1] == final and ranks[1][0] == shown
    assert rounds == [(0, 4), (4, 6)]


def test_a_round_launched_after_the_last_step_counts_in_the_figures(tmp_path):
    # 8 steps: the loop launches a round after the 8th step, which the end waits for: it was sent,
    # so it is among the rounds, of zero steps, with its bytes.
    ranks = [p[1] for p in run_ranks(end_inside_a_round, tmp_path, 2 * TAU, "int8", timeout=100)]
    for _, final, rounds, sent in ranks:
        assert rounds == [(0, TAU), (TAU, 2 * TAU), (2 * TAU, 2 * TAU)]
        assert sent > 0
    assert ranks[0][1] == ranks[1][1]
