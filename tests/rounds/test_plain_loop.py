"""The rounds without Lightning: driven from a plain PyTorch loop over simulated workers."""

import subprocess
import sys
from pathlib import Path

import torch

from lightning_cocod.strategies import CoCoDRounds
from tests.helpers import toy
from tests.helpers.fake_comm import FakeCluster

WORLD, STEPS, TAU = 2, 8, 4


def drive(rounds_of_rank, steps=STEPS):
    """A plain training loop on every simulated worker, in lockstep (no blocking collective: the
    fake cluster cannot wait for a worker that has not run yet); the per-step weights."""
    workers = toy._Workers(WORLD, steps)
    model_group, control_group = FakeCluster(WORLD), FakeCluster(WORLD)
    rounds = [rounds_of_rank(rank) for rank in range(WORLD)]
    for rank, r in enumerate(rounds):
        r.attach(
            workers.models[rank],
            model_group.comms[rank],
            rank=rank,
            world_size=WORLD,
            device=torch.device("cpu"),
            control=control_group.comms[rank],
        )
        r.optimizers = [workers.opts[rank]]
        r.start()
    trajectory = []
    for step in range(steps):
        with torch.no_grad():
            for r in rounds:
                r.begin_step()
        workers.grads(step)
        with torch.no_grad():
            for r in rounds:
                r.exchange()
        for r, optimizer in zip(rounds, workers.opts):
            optimizer.step()
            r.steps += 1
            with torch.no_grad():
                r.end_step()
        trajectory.append(workers.state())
    return rounds, trajectory


def test_cocod_rounds_from_a_plain_loop_follow_the_update_rule():
    rounds, trajectory = drive(lambda rank: CoCoDRounds("loop", tau=TAU))
    expected, _ = toy.reference_cocod(WORLD, STEPS, TAU)
    torch.testing.assert_close(torch.tensor(trajectory), torch.tensor(expected), rtol=0, atol=1e-6)
    assert [(r.launch_step, r.finish_step) for r in rounds[0].comm_stats.rounds] == [(0, 4), (4, 8)]
    assert rounds[0].state() == {
        "class": "loop",
        "steps": STEPS,
        "weight": None,
        "tau": TAU,
        "tau_history": [(0, TAU)],
        "round_start": STEPS,  # the last round merged at the last step, where the next one begins
    }


def test_the_rounds_import_no_lightning():
    code = (
        "import sys, lightning_cocod.rounds, lightning_cocod.loop, lightning_cocod.fabric_strategy; "
        "print(sorted(m for m in ('pytorch_lightning', 'lightning') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
