"""The loop API's options on 2 gloo ranks, as the strategies have them: proportional weights,
the non-finite policy, tau="auto" (agreed by every rank), one rank alone."""

import math

import pytest
import torch

from lightning_cocod.loop import CoCoD, LocalSGD
from lightning_cocod.strategies import NonFiniteError
from tests.helpers import toy
from tests.helpers.gloo_ranks import results, run_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

TAU, SHARES = 4, (0.75, 0.25)


def steps(model, optimizer, rank, count, poison_at=None):
    x, y = toy.rank_batches(rank, count)
    for step in range(count):
        batch = slice(step * toy.BATCH, (step + 1) * toy.BATCH)
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == poison_at and rank == 1:
            with torch.no_grad():
                model.weight[0, 0] = float("nan")


def weighted(rank):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
    with LocalSGD(model, optimizer, tau=TAU, weight=SHARES[rank]):
        steps(model, optimizer, rank, TAU)
    return toy.flat(model)


def test_proportional_weights_weigh_the_average(tmp_path):
    # One Local-SGD round: each rank trains alone, then the models average with the ranks' shares.
    alone = []
    for rank in range(2):
        model = toy.initial_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
        steps(model, optimizer, rank, TAU)
        alone.append(torch.tensor(toy.flat(model), dtype=torch.float64))
    expected = SHARES[0] * alone[0] + SHARES[1] * alone[1]
    for final in results(run_ranks(weighted, tmp_path)):
        torch.testing.assert_close(torch.tensor(final, dtype=torch.float64), expected, rtol=0, atol=1e-12)


def poisoned(rank, policy):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR, momentum=toy.MOMENTUM)
    with CoCoD(model, optimizer, tau=TAU, on_nonfinite=policy) as cocod:
        steps(model, optimizer, rank, 3 * TAU, poison_at=TAU + 1)
    return cocod.rounds.skipped, toy.flat(model)


def test_non_finite_values_raise_on_every_rank(tmp_path):
    payloads = run_ranks(poisoned, tmp_path, "raise")
    for payload in payloads:
        assert payload[0] == "error" and payload[1].startswith(
            "NonFiniteError: CoCoD: non-finite values (NaN/Inf) on rank 1"
        )
    assert issubclass(NonFiniteError, FloatingPointError)


def test_non_finite_values_are_skipped_on_request(tmp_path):
    (skipped, final), (skipped_1, final_1) = results(run_ranks(poisoned, tmp_path, "skip"))
    # Poisoned after step 6: the round launched at 4 merges it in, the round launched at 8 would
    # send it, and its merge (at 12) is dropped on every rank.
    assert skipped == skipped_1 == [(3 * TAU, [1])]
    assert final == final_1 and all(math.isfinite(v) for v in final)  # every rank finite, and the same


def test_non_finite_values_are_averaged_on_request_as_ddp_does(tmp_path):
    (skipped, final), (skipped_1, final_1) = results(run_ranks(poisoned, tmp_path, "allow"))
    assert skipped == skipped_1 == []
    # Rank 1's NaN went into the average: every rank ends with the same weights, NaN included.
    assert not all(math.isfinite(v) for v in final)
    torch.testing.assert_close(torch.tensor(final), torch.tensor(final_1), rtol=0, atol=0, equal_nan=True)


def adaptive(rank):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
    with CoCoD(model, optimizer, tau="auto", tau_max=8) as cocod:
        steps(model, optimizer, rank, 40)
    return cocod.tau_history, toy.flat(model)


def test_the_adaptive_period_is_agreed_by_every_rank(tmp_path):
    (history, final), (history_1, final_1) = results(run_ranks(adaptive, tmp_path))
    assert history == history_1 and history[0] == (0, 4)  # the first rounds use 4
    assert all(1 <= tau <= 8 for _, tau in history)
    assert final == final_1


def alone(rank):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
    with CoCoD(model, optimizer, tau=TAU) as cocod:
        steps(model, optimizer, rank, TAU + 1)
        with cocod.averaged():
            pass
    return toy.flat(model), len(cocod.stats), cocod.steps


def test_one_rank_trains_as_plain_sgd(tmp_path):
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR)
    steps(model, optimizer, 0, TAU + 1)
    assert results(run_ranks(alone, tmp_path, world=1)) == [(toy.flat(model), 0, TAU + 1)]


def on_group(rank, own_group):
    import torch.distributed as dist

    group = dist.new_group(backend="gloo") if own_group else None
    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=toy.LR, momentum=toy.MOMENTUM)
    with CoCoD(model, optimizer, tau=TAU, group=group) as cocod:
        steps(model, optimizer, rank, 2 * TAU + 1)
    return toy.flat(model), [(r.launch_step, r.finish_step) for r in cocod.stats]


def test_a_group_of_the_users_gives_the_default_groups_run(tmp_path):
    default = results(run_ranks(on_group, tmp_path / "default", False))
    assert results(run_ranks(on_group, tmp_path / "own", True)) == default
    assert default[0][0] == default[1][0] and default[0][1] == [(0, 4), (4, 8), (8, 9)]
