"""The loop API and the Fabric strategies on 2 gloo ranks: bit for bit the parameters of the Lightning
strategy from the same data and seed (and of the update rule's reference), an exact resume from
``state_dict()`` taken mid-round, and the misuses a loop invites refused in one line."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy
from lightning_cocod.loop import LOOPS, CoCoD, LocalSGD, PipeSGD
from tests.helpers import toy
from tests.helpers.gloo_ranks import results, run_ranks
from tests.strategies.test_against_reference import fit

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

WORLD, STEPS, TAU, SAVE_AT = 2, 10, 4, 6  # rounds of 4, 4 and a partial 2; the save is mid-round


def batches(rank, steps=STEPS):
    x, y = toy.rank_batches(rank, steps)
    return [
        (x[s * toy.BATCH : (s + 1) * toy.BATCH], y[s * toy.BATCH : (s + 1) * toy.BATCH]) for s in range(steps)
    ]


def sgd(model):
    return torch.optim.SGD(
        model.parameters(), lr=toy.LR, momentum=toy.MOMENTUM, weight_decay=toy.WEIGHT_DECAY
    )


def train(rank, method, steps=STEPS, folder=None, save_at=None, resume=False):
    """A plain loop: the toy's data, model and optimizer, under the loop API; the final weights,
    the rounds (launch and finish steps) and, from a save, the loop's state."""
    model = toy.initial_model()
    optimizer = sgd(model)
    method, _, codec = method.partition("+")  # "cocod+int8": compressed rounds
    options = ({} if method == "pipe_sgd" else {"tau": TAU}) | ({"compression": codec} if codec else {})
    loop = LOOPS[method](model, optimizer, **options)
    if resume:
        saved = torch.load(Path(folder, f"rank{rank}.pt"), weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loop.load_state_dict(saved["loop"])
    saved_state = None
    with loop:
        for x, y in batches(rank, steps)[loop.steps :]:
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if loop.steps == save_at:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loop": loop.state_dict(),
                }
                torch.save(state, Path(folder, f"rank{rank}.pt"))
                saved_state = state["loop"]
    return toy.flat(model), [(r.launch_step, r.finish_step) for r in loop.stats.rounds], saved_state


def fabric_train(fabric, out, steps, separately):
    torch.set_num_threads(1)
    model = toy.initial_model()
    if separately:  # as for sharded strategies: the model first, then the optimizer of its parameters
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(sgd(model))
    else:
        model, optimizer = fabric.setup(model, sgd(model))
    for x, y in batches(fabric.global_rank, steps):
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    fabric.strategy.loop.close()
    Path(out, f"rank{fabric.global_rank}.json").write_text(json.dumps(toy.flat(model)))


def run_fabric(strategy, out, steps, separately=False):
    from lightning_fabric import Fabric

    out.mkdir()
    Fabric(accelerator="cpu", devices=WORLD, strategy=strategy).launch(
        fabric_train, str(out), steps, separately
    )
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize(
    ("method", "steps"),
    [("cocod", STEPS), ("cocod", 2 * TAU), ("local_sgd", STEPS), ("pipe_sgd", STEPS)],
    ids=["cocod-partial-last-round", "cocod-whole-rounds", "local_sgd", "pipe_sgd"],
)
def test_loop_fabric_and_lightning_give_the_same_bits(tmp_path, method, steps):
    from lightning_cocod.fabric import LocalSGDFabricStrategy

    loop = results(run_ranks(train, tmp_path / "loop", method, steps))
    from lightning_cocod.fabric import CoCoDFabricStrategy

    # Fabric by its registry name (Pipe-SGD, which has no period) and by instances with the
    # reference's fixed period (CoCoD's default, tau="auto", follows timing).
    by_method = {"local_sgd": LocalSGDFabricStrategy, "cocod": CoCoDFabricStrategy}
    fabric_strategy = (
        by_method[method](tau=TAU, start_method="fork") if method in by_method else f"{method}_fork"
    )
    fabric = run_fabric(fabric_strategy, tmp_path / "fabric", steps, separately=method == "pipe_sgd")
    if method == "pipe_sgd":
        strategy, reference = PipeSGDStrategy(start_method="fork"), toy.reference_pipe_sgd(WORLD, steps)[1]
    else:
        strategy = {"cocod": CoCoDStrategy, "local_sgd": LocalSGDStrategy}[method](
            tau=TAU, start_method="fork"
        )
        reference = {"cocod": toy.reference_cocod, "local_sgd": toy.reference_local_sgd}[method](
            WORLD, steps, TAU
        )[1]
    lightning = fit(strategy, tmp_path / "lightning", steps=steps)
    # The loop launches a round after every step, the last one's too: the end waits for it, and
    # the figures count it (of no steps); Lightning launches before a step, so has none.
    eager = [(steps, steps)] if method == "cocod" and steps % TAU == 0 else []
    if method == "cocod":
        assert loop[0][1] == [(0, 4), (4, 8), (8, 10)][: -(-steps // TAU)] + eager
    for rank in range(WORLD):
        assert loop[rank][0] == fabric[rank] == lightning[rank]["final"] == loop[0][0]
        assert [list(r) for r in loop[rank][1]] == lightning[rank]["rounds"] + [list(r) for r in eager]
        torch.testing.assert_close(
            torch.tensor(loop[rank][0]), torch.tensor(reference[rank]), rtol=0, atol=1e-6
        )


@pytest.mark.parametrize("method", ["cocod", "local_sgd", "cocod+int8", "local_sgd+bf16"])
def test_state_dict_resumes_mid_round_exactly(tmp_path, method):
    straight = results(run_ranks(train, tmp_path / "straight", method, STEPS, tmp_path, SAVE_AT))
    resumed = results(run_ranks(train, tmp_path / "resumed", method, STEPS, tmp_path, None, True))
    for rank in range(WORLD):
        assert resumed[rank][0] == straight[rank][0]
        assert straight[rank][2]["steps"] == SAVE_AT
    assert straight[0][0] == straight[1][0]


def misuses(rank):
    """Every misuse, in order; what each raised (None: nothing)."""
    raised = []

    def attempt(action):
        try:
            action()
            raised.append(None)
        except Exception as err:  # noqa: BLE001 - the message is the point
            raised.append(f"{type(err).__name__}: {err}")

    model = toy.initial_model()
    optimizer = sgd(model)
    stranger = torch.nn.Linear(3, 1)
    attempt(
        lambda: CoCoD(
            model, torch.optim.SGD([*model.parameters(), *stranger.parameters()], lr=0.1)
        ).__enter__()
    )
    with CoCoD(model, optimizer) as cocod:
        attempt(cocod.__enter__)
        attempt(LocalSGD(model, optimizer).__enter__)
        attempt(lambda: cocod.load_state_dict(cocod.state_dict()))
    torch.manual_seed(rank)  # each rank builds its model from a seed of its own
    apart = torch.nn.Linear(4, 2)
    attempt(CoCoD(apart, torch.optim.SGD(apart.parameters(), lr=0.1)).__enter__)
    attempt(CoCoD(model, optimizer, weight=0.9).__enter__)  # 0.9 + 0.9 is no split of a batch
    return raised


def test_the_misuses_a_loop_invites_are_refused_in_one_line(tmp_path):
    first, second = results(run_ranks(misuses, tmp_path))
    assert first == second  # every rank refuses alike
    foreign, twice, other, late, apart, weights = first
    assert foreign.startswith(
        "ValueError: CoCoD: the optimizer trains a tensor of shape (1, 3) (param group 0, index 2)"
    )
    assert twice == "RuntimeError: CoCoD is entered already: enter it once, around the whole training loop"
    assert other == "RuntimeError: LocalSGD: this optimizer is hooked by another CoCoD already"
    assert late == "RuntimeError: CoCoD: load_state_dict inside the with block; call it before entering"
    assert apart.startswith(
        "ValueError: CoCoD: the model's tensor 'weight' differs between ranks at the start"
    )
    assert weights.startswith("ValueError: CoCoD: the ranks' weights sum to 1.8")
    assert all("\n" not in message for message in first)


def test_no_process_group_is_refused():
    assert not dist.is_initialized()
    model = toy.initial_model()
    with pytest.raises(
        RuntimeError, match=r"^CoCoD: no process group is initialised; call torch.distributed"
    ):
        CoCoD(model, sgd(model)).__enter__()
    with pytest.raises(
        ValueError,
        match=r"^CoCoD: tau='often' is invalid; accepted: a positive integer \(optimizer steps per round\) or \"auto\"$",
    ):
        CoCoD(model, sgd(model), tau="often")
    # Pipe-SGD exchanges gradients: a codec for rounds it never sends is refused, not ignored.
    with pytest.raises(
        ValueError,
        match=r"^PipeSGD: compression='int8' is invalid; accepted: None: Pipe-SGD exchanges gradients",
    ):
        PipeSGD(model, sgd(model), compression="int8")
