"""The outer round on real gloo ranks, in every front-end: the loop API on 2 and 4 ranks, Fabric and
the Trainer on 2, against the rule in plain tensors (``tests.rounds.test_outer_round``), the
loop's state_dict resuming mid-round with theta and the outer momentum, and on_nonfinite="skip"."""

import functools
import json
from pathlib import Path

import pytest
import torch

from lightning_cocod import CoCoDStrategy, DiLoCoStrategy
from lightning_cocod.loop import CoCoD, DiLoCo
from tests.helpers import toy
from tests.helpers.gloo_ranks import results, run_ranks
from tests.loop.test_loop_and_fabric import batches, run_fabric, sgd
from tests.rounds.test_outer_round import NESTEROV, WARMUP, reference_outer, warmed_lr
from tests.strategies.test_against_reference import assert_matches, fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

STEPS, TAU = 10, 4  # rounds of 4, 4 and a partial 2


def train(rank, overlap, steps=STEPS, folder=None, save_at=None, resume=False, compression=None):
    """A plain loop under ``CoCoD(tau=TAU, overlap=..., outer_optimizer=Nesterov)``; the final
    weights and the rounds (launch and finish steps)."""
    torch.set_num_threads(1)
    model = toy.initial_model()
    optimizer = sgd(model)
    loop = CoCoD(
        model, optimizer, tau=TAU, overlap=overlap, outer_optimizer=NESTEROV, compression=compression
    )
    if resume:
        saved = torch.load(Path(folder, f"rank{rank}.pt"), weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loop.load_state_dict(saved["loop"])
    with loop:
        for x, y in batches(rank, steps)[loop.steps :]:
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if loop.steps == save_at:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state | {"loop": loop.state_dict()}, Path(folder, f"rank{rank}.pt"))
    return toy.flat(model), [(r.launch_step, r.finish_step) for r in loop.stats.rounds]


@pytest.mark.parametrize(("world", "overlap"), [(2, 0), (2, 1), (2, TAU), (4, 1)])
def test_the_loop_api_follows_the_rule(tmp_path, world, overlap):
    ranks = results(run_ranks(train, tmp_path, overlap, world=world))
    _, final = reference_outer(world, STEPS, TAU, overlap)
    for rank, (weights, _) in enumerate(ranks):
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(final[rank]), rtol=0, atol=1e-9)
    # The snapshot after step kH - d, the merge after step kH; the fit ends inside the third round.
    launch = [TAU - overlap, 2 * TAU - overlap] + ([2 * TAU] if overlap > TAU - 2 else [])
    assert [r[0] for r in ranks[0][1]][: len(launch)] == launch


def test_the_loop_state_dict_resumes_mid_round_with_the_outer_state(tmp_path):
    # Saved at step 6: round 2 (steps 4-8) has its snapshot at 7, so none is in flight: what
    # carries the run is theta, the outer momentum and where the round began.
    straight = results(run_ranks(train, tmp_path / "straight", 1, STEPS, tmp_path, 6))
    resumed = results(run_ranks(train, tmp_path / "resumed", 1, STEPS, tmp_path, None, True))
    assert [r[0] for r in resumed] == [r[0] for r in straight]  # bit for bit
    assert straight[0][0] == straight[1][0]


def test_compressed_pseudo_gradients_follow_the_rule_to_the_codec_s_precision(tmp_path):
    exact = results(run_ranks(train, tmp_path / "exact", 1))
    bf16 = results(run_ranks(train, tmp_path / "bf16", 1, STEPS, None, None, False, "bf16"))
    _, final = reference_outer(2, STEPS, TAU, 1)
    for rank in range(2):
        got, want = torch.tensor(bf16[rank][0]), torch.tensor(final[rank])
        # bf16 keeps 8 bits of each pseudo-gradient (error feedback carries the rest forward):
        # close to the rule, and not the exact run's bits (the codec did run).
        torch.testing.assert_close(got, want, rtol=0, atol=5e-3)
        assert bf16[rank][0] != exact[rank][0]
    assert bf16[0][0] == bf16[1][0]


def test_fabric_diloco_follows_the_rule(tmp_path):
    from lightning_cocod.fabric import DiLoCoFabricStrategy

    strategy = DiLoCoFabricStrategy(tau=TAU, overlap=1, start_method="fork")
    ranks = run_fabric(strategy, tmp_path / "fabric", STEPS)
    _, final = reference_outer(2, STEPS, TAU, 1)
    for rank in range(2):
        torch.testing.assert_close(torch.tensor(ranks[rank]), torch.tensor(final[rank]), rtol=0, atol=1e-9)


@pytest.mark.parametrize("overlap", [0, 1])
def test_the_trainer_follows_the_rule(tmp_path, overlap):
    ranks = fit(DiLoCoStrategy(tau=TAU, overlap=overlap, start_method="fork"), tmp_path)
    assert_matches(ranks, *reference_outer(2, STEPS, TAU, overlap))
    assert ranks[0]["final"] == ranks[1]["final"]


def test_the_trainer_warms_the_outer_learning_rate_up_as_scheduled(tmp_path):
    ranks = fit(DiLoCoStrategy(tau=TAU, overlap=1, outer_scheduler=WARMUP, start_method="fork"), tmp_path)
    assert_matches(ranks, *reference_outer(2, STEPS, TAU, 1, lr_at=warmed_lr))


def test_the_trainer_loop_and_fabric_run_the_same_round(tmp_path):
    outer = functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)
    lightning = fit(CoCoDStrategy(tau=TAU, overlap=2, outer_optimizer=outer, start_method="fork"), tmp_path)
    loop = results(run_ranks(train, tmp_path / "loop", 2))
    assert [r[0] for r in loop] == [r["final"] for r in lightning]  # bit for bit
    assert json.dumps(loop[0][1][:2]) == json.dumps(lightning[0]["rounds"][:2])


def test_diloco_in_a_loop_is_the_outer_round_with_its_defaults():
    model = toy.initial_model()
    assert DiLoCo(model, sgd(model)).rounds.options() == {
        "tau": 8,
        "overlap": 0,
        "outer_optimizer": "torch.optim.sgd.SGD(lr=0.7, momentum=0.9, nesterov=True)",
        "average_buffers": True,
    }


def test_ranks_given_different_outer_optimizers_are_refused_before_any_round(tmp_path):
    def run(rank):
        model = toy.initial_model()
        outer = functools.partial(torch.optim.SGD, lr=0.7 if rank == 0 else 0.5, momentum=0.9)
        try:
            DiLoCo(model, sgd(model), tau=TAU, outer_optimizer=outer).__enter__()
        except ValueError as err:
            return str(err)
        return None

    first, second = results(run_ranks(run, tmp_path))
    assert (
        first
        == second
        == (
            "DiLoCo: rank 1 disagrees with rank 0 on outer_optimizer: 'torch.optim.sgd.SGD(lr=0.7, momentum=0.9)' "
            "on rank 0, 'torch.optim.sgd.SGD(lr=0.5, momentum=0.9)' on rank 1; every rank must be given the same options"
        )
    )


def train_poisoned(rank, overlap, poison_after):
    """``train``'s loop with on_nonfinite="skip" and NaN put into rank 1's weights after step
    ``poison_after``: the final weights, the rounds skipped, theta and the outer momentum."""
    torch.set_num_threads(1)
    model = toy.initial_model()
    optimizer = sgd(model)
    loop = CoCoD(model, optimizer, tau=TAU, overlap=overlap, outer_optimizer=NESTEROV, on_nonfinite="skip")
    with loop:
        for x, y in batches(rank, STEPS):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if rank == 1 and loop.steps == poison_after:
                with torch.no_grad():
                    model.weight[0, 0] = float("nan")
    outer = loop.rounds.round  # after the exit's synchronisation point, which may finish a round
    theta = torch.cat(list(outer.theta.buckets))
    momentum = torch.cat([outer.optimizer.state[b]["momentum_buffer"] for b in outer.theta.buckets])
    return toy.flat(model), loop.rounds.skipped, theta.tolist(), momentum.tolist()


@pytest.mark.parametrize(("overlap", "seen_at"), [(0, 8), (1, 8), (TAU, 10)])
def test_skip_with_the_outer_round_on_gloo_follows_the_rule(tmp_path, overlap, seen_at):
    # Over a real group the restart is a broadcast; at overlap TAU the round ending at 8 merges
    # the NaN into rank 1 alone and the fit's synchronisation point drops the next one.
    ranks = results(run_ranks(train_poisoned, tmp_path, overlap, 5))
    outer = {}
    _, final = reference_outer(2, STEPS, TAU, overlap, poison=(1, 5), outer=outer)
    assert outer["skipped"] == [(seen_at, [1])]
    for rank, (weights, skipped, theta, momentum) in enumerate(ranks):
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(final[rank]), rtol=0, atol=1e-9)
        assert skipped == [(seen_at, [1])]
        want = torch.cat([t.reshape(-1) for t in outer["theta"]])
        torch.testing.assert_close(torch.tensor(theta, dtype=torch.float64), want, rtol=0, atol=1e-9)
        want = torch.cat([b.reshape(-1) for b in outer["buffer"]])
        torch.testing.assert_close(torch.tensor(momentum, dtype=torch.float64), want, rtol=0, atol=1e-9)
    assert ranks[0][2:] == ranks[1][2:] and ranks[0][0] == ranks[1][0]  # bit for bit


def _on_a_known_link(rank, comm, steps):
    """``DiLoCo(tau=TAU, overlap="auto")`` where a step takes 0.1 s and this rank's model all-reduce
    ``comm[rank]`` s (both faked in this forked rank's modules); the overlap it ended at, the rounds
    and the final weights."""
    import types

    from lightning_cocod.core import comm as core_comm
    from lightning_cocod.rounds import cocod as cocod_rounds

    torch.set_num_threads(1)
    model = toy.initial_model()
    optimizer = sgd(model)
    loop = DiLoCo(model, optimizer, tau=TAU, overlap="auto")
    cocod_rounds.time = types.SimpleNamespace(perf_counter=lambda: loop.rounds.steps * 0.1)
    core_comm._CpuHandle.comm_seconds = property(lambda handle: comm[rank])  # the control's too: unread
    with loop:
        for x, y in batches(rank, steps):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    return (
        loop.rounds.overlap_in_force,
        [(r.launch_step, r.finish_step) for r in loop.stats.rounds],
        toy.flat(model),
    )


def test_the_loop_chooses_the_overlap_from_the_figures_the_ranks_exchange(tmp_path):
    # Alone rank 0 would hide its 0.05 s in 1 step and rank 1 its 0.25 s in 3: the mean round,
    # 0.15 s, takes ceil(1.2 x 0.15 / 0.1) = 2, once two timed rounds have asked for it.
    ranks = results(run_ranks(_on_a_known_link, tmp_path, [0.05, 0.25], 6 * TAU))
    assert [r[0] for r in ranks] == [2, 2]
    assert ranks[0][1] == ranks[1][1] and ranks[0][1][0] == (0, TAU)
    assert ranks[0][1][-2:] == [(5 * TAU - 2, 5 * TAU), (6 * TAU - 2, 6 * TAU)]
    assert ranks[0][2] == ranks[1][2]
