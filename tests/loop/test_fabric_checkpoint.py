"""``fabric.save``/``fabric.load`` under our Fabric strategies on 2 gloo ranks: one file holding
every rank's own state, from which a run saved mid-round and resumed in fresh processes ends with
the uninterrupted run's parameters bit for bit; a plain Fabric file still loads; a file of
another world size is refused in one line."""

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from lightning_fabric.plugins.io import TorchCheckpointIO

from lightning_cocod.rounds.checkpoint import INTEGRITY_KEY, TRUST_ENV, atomic_save
from tests.helpers import toy
from tests.helpers.checkpoints import flip_byte_inside
from tests.loop.test_loop_and_fabric import SAVE_AT, TAU, WORLD, batches, sgd

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def strategy(method):
    from lightning_cocod.fabric import CoCoDFabricStrategy, LocalSGDFabricStrategy

    method, _, codec = method.partition("+")  # "cocod+int8": compressed rounds
    options = {"compression": codec} if codec else {}
    return {"cocod": CoCoDFabricStrategy, "local_sgd": LocalSGDFabricStrategy}[method](
        tau=TAU, start_method="fork", **options
    )


def train(fabric, out, checkpoint, save_at, resume, load_first):
    """The toy's loop under Fabric: saves at step ``save_at``, or resumes from ``checkpoint``
    (before or after ``fabric.setup``) and runs the steps left; writes the final weights."""
    torch.set_num_threads(1)
    model = toy.initial_model()
    optimizer = sgd(model)
    state = {"model": model, "optimizer": optimizer}
    if resume and load_first:
        fabric.load(checkpoint, state)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer}
    if resume and not load_first:
        fabric.load(checkpoint, state)
    loop = fabric.strategy.loop
    for x, y in batches(fabric.global_rank)[loop.steps :]:
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if loop.steps == save_at:
            fabric.save(checkpoint, state)
    loop.close()
    Path(out, f"rank{fabric.global_rank}.json").write_text(json.dumps(toy.flat(model)))


def run(method, out, *args):
    from lightning_fabric import Fabric

    out.mkdir()
    Fabric(accelerator="cpu", devices=WORLD, strategy=strategy(method)).launch(train, str(out), *args)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize(
    ("method", "load_first"),
    [("cocod", False), ("cocod+int8", False), ("local_sgd", False), ("cocod+int8", True)],
    ids=["cocod", "cocod-int8", "local_sgd", "cocod-int8-loaded-before-setup"],
)
def test_a_run_resumed_from_fabric_save_mid_round_ends_bit_for_bit(tmp_path, method, load_first):
    checkpoint = str(tmp_path / "checkpoint.pt")
    straight = run(method, tmp_path / "straight", checkpoint, SAVE_AT, False, False)
    saved = torch.load(checkpoint, weights_only=True)  # one file, plain torch data
    resumed = run(method, tmp_path / "resumed", checkpoint, None, True, load_first)
    assert resumed == straight
    assert straight[0] == straight[1]
    ours = saved["lightning_cocod"]
    assert ours["world_size"] == WORLD and [r["loop"]["steps"] for r in ours["ranks"]] == [SAVE_AT] * WORLD
    momenta = [r["optimizers"]["optimizer"]["state"][0]["momentum_buffer"] for r in ours["ranks"]]
    assert not torch.equal(*momenta)  # each rank's own, from its own data
    fabrics = saved["optimizer"]["state"][0]["momentum_buffer"]  # Fabric's entry: rank 0's, stored once
    assert torch.equal(fabrics, momenta[0])
    assert fabrics.untyped_storage().data_ptr() == momenta[0].untyped_storage().data_ptr()
    if "int8" in method:
        residuals = [r["loop"]["rank"]["compression"]["residuals"] for r in ours["ranks"]]
        assert not torch.equal(torch.cat(residuals[0]), torch.cat(residuals[1]))  # each rank's own


class RunsSystem:
    """Unpickled, runs a shell command that writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def other_files(fabric, out, plain, other_size):
    """Two steps, a save, a step and a load of that save; a plain Fabric file loaded; a step; the
    save loaded once it says it comes from 3 ranks; a step. The loop's step count after each."""
    torch.set_num_threads(1)
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("lightning_cocod.fabric_strategy").addHandler(handler)
    model = toy.initial_model()
    model, optimizer = fabric.setup(model, sgd(model))
    state, loop, data = (
        {"model": model, "optimizer": optimizer},
        fabric.strategy.loop,
        batches(fabric.global_rank),
    )

    def step(x, y):
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    step(*data[0])
    step(*data[1])
    fabric.save(other_size, state)
    # fabric.save's filter, on the optimizer's entry: each rank's own copy is filtered alike.
    fabric.save(
        Path(other_size).with_name("filtered.pt"),
        state,
        filter={"optimizer": lambda k, v: k == "param_groups"},
    )
    step(*data[2])
    fabric.load(other_size, state)  # back to step 2
    steps = [loop.steps]
    flipped, evil = Path(other_size).with_name("flipped.pt"), Path(other_size).with_name("evil.pt")
    if fabric.global_rank == 0:
        saved = torch.load(other_size, weights_only=True)
        assert INTEGRITY_KEY in saved  # the save carries its record, as the Trainer strategies' do
        flipped.write_bytes(Path(other_size).read_bytes())
        flip_byte_inside(flipped, saved["model"]["weight"])
        torch.save({"model": saved["model"], "payload": RunsSystem(Path(out, "marker"))}, evil)
        del saved[INTEGRITY_KEY]
        saved["lightning_cocod"]["world_size"] = 3
        atomic_save(
            TorchCheckpointIO(), saved, other_size
        )  # whole, with a record: refused for its size alone
    fabric.barrier()
    refusals = []
    for path in (flipped, evil):
        try:
            fabric.load(path, state)
        except ValueError as err:
            refusals.append(str(err))
    fabric.load(plain, state)
    loaded = [toy.flat(model), optimizer.state_dict()["state"][0]["momentum_buffer"].tolist()]
    steps.append(loop.steps)
    step(*data[3])  # the loop is entered again: the step counts
    steps.append(loop.steps)
    before = [toy.flat(model), optimizer.state_dict()["state"][0]["momentum_buffer"].tolist()]
    try:
        fabric.load(other_size, state)
        refused = None
    except ValueError as err:
        refused = str(err)
    untouched = before == [toy.flat(model), optimizer.state_dict()["state"][0]["momentum_buffer"].tolist()]
    step(*data[4])  # refused, the load leaves the loop running
    steps.append(loop.steps)
    result = {
        "steps": steps,
        "loaded": loaded,
        "warnings": warnings,
        "refused": refused,
        "untouched": untouched,
        "refusals": refusals,
    }
    Path(out, f"rank{fabric.global_rank}.json").write_text(json.dumps(result))


def test_a_plain_fabric_file_loads_and_another_world_size_is_refused(tmp_path):
    from lightning_fabric import Fabric

    model = toy.initial_model()
    with torch.no_grad():
        model.weight.add_(1.0)
    optimizer = sgd(model)
    torch.nn.functional.mse_loss(model(batches(0)[0][0]), batches(0)[0][1]).backward()
    optimizer.step()
    plain, other_size = tmp_path / "plain.pt", tmp_path / "three.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, plain)
    out = tmp_path / "out"
    out.mkdir()
    Fabric(accelerator="cpu", devices=WORLD, strategy=strategy("cocod")).launch(
        other_files, str(out), str(plain), str(other_size)
    )
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].tolist()
    for rank in ranks:
        assert rank["steps"] == [2, 2, 3, 4]  # a file of no loop state of ours leaves the count running
        assert rank["loaded"] == [toy.flat(model), momentum]
        assert rank["untouched"]  # the refusal came before anything of the file was loaded
        flipped, evil = tmp_path / "flipped.pt", tmp_path / "evil.pt"
        assert rank["refusals"] == [
            f"checkpoint {flipped} is damaged: its entry 'model' does not match the SHA-256 recorded when it was "
            "written; resume from another checkpoint",
            f"checkpoint {evil} is not plain data: loading it would call posix.system; refused, as checkpoints load as "
            f"data only (if you trust this file and what it runs, name it in {TRUST_ENV})",
        ]
        assert rank["refused"] == (
            f"CoCoDFabricStrategy: {other_size} was saved by 3 ranks, this run has 2: each rank's optimizer and "
            "round state is its own; resume on as many ranks"
        )
    assert not (out / "marker").exists()
    assert ranks[0]["warnings"] == [
        (
            f"{plain} holds no rank's own state (a plain Fabric file): every rank takes rank 0's optimizer state, "
            "and the rounds start afresh from the loaded weights"
        )
    ]
    assert ranks[1]["warnings"] == []
    filtered = torch.load(tmp_path / "filtered.pt", weights_only=True)
    assert set(filtered["optimizer"]) == {"param_groups"}
    assert [set(r["optimizers"]["optimizer"]) for r in filtered["lightning_cocod"]["ranks"]] == [
        {"param_groups"}
    ] * WORLD


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"start_method": "bogus"},
            "start_method='bogus' is invalid; accepted: one of 'popen', 'spawn', 'fork', 'forkserver'",
        ),
        ({"weight": 2.0}, "weight=2.0 is invalid; accepted: None (the plain mean) or a number in (0, 1]"),
        (
            {"process_group_backend": "bogus"},
            "process_group_backend='bogus' is invalid; accepted: None (gloo on CPU, nccl on GPU) or one of gloo, nccl",
        ),
    ],
)
def test_fabric_strategy_options_are_refused_at_construction(options, message):
    from lightning_cocod.fabric import CoCoDFabricStrategy

    with pytest.raises(ValueError) as err:
        CoCoDFabricStrategy(tau=TAU, **options)
    assert str(err.value).startswith(f"CoCoDFabricStrategy: {message}") and "\n" not in str(err.value)
