"""Lightning's own strategy behaviours on ours, in the spirit of Lightning's DDP tests: fit,
validate, test and predict; ModelCheckpoint top-k; early stopping; SWA and EMA; manual
optimization; collectives; samplers; checkpoints saved by the main process; a model whose
tensors change under the strategy; the environment a rank leaves behind.

Each test runs 2 forked CPU workers on a tiny model and checks against an expectation computed
here independently (a reference update rule, the model evaluated in this process, an
invariant). Where ours differ from DDPStrategy by design, the README's "Differences from
DDPStrategy" says so; these tests cover what a Lightning user keeps.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import socket
import traceback
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import (
    EarlyStopping,
    EMAWeightAveraging,
    ModelCheckpoint,
    ModelPruning,
    StochasticWeightAveraging,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_cocod
from tests.helpers import toy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WORLD = 2
OURS = ["cocod_fork", "local_sgd_fork", "pipe_sgd_fork"]
N, BATCH = 32, 4  # 16 samples per rank under the distributed sampler: 4 steps per epoch


def data(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 4, generator=g)
    return TensorDataset(
        x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)
    )


def loader(seed: int) -> DataLoader:
    return DataLoader(data(seed), batch_size=BATCH)


def trainer(strategy, **kwargs) -> pl.Trainer:
    settings = {
        "accelerator": "cpu",
        "devices": WORLD,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
        **kwargs,
    }
    return pl.Trainer(strategy=strategy, **settings)


class Regression(pl.LightningModule):
    """A linear model that records, per rank, what the tests look at (workers are forked: files)."""

    def __init__(self, out_dir: Path | None = None, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.out_dir, self.lr = out_dir, lr
        self.record: dict[str, list] = {"seen": [], "val": [], "epoch_end_weights": []}

    def on_fit_start(self) -> None:
        torch.set_num_threads(1)

    def loss(self, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.record["val"].append([self.current_epoch, float(self.trainer.callback_metrics["val_loss"])])

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def on_predict_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.record.setdefault("predicted", []).extend(outputs.flatten().tolist())

    def on_predict_end(self) -> None:
        (self.out_dir / f"predicted{self.global_rank}.json").write_text(json.dumps(self.record["predicted"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return loader(1)

    def val_dataloader(self):
        return loader(2)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self.record["seen"].append(batch[0].tolist())

    def on_train_epoch_end(self) -> None:
        self.record["epoch_end_weights"].append(weights(self))

    def on_fit_end(self) -> None:
        if self.out_dir is not None:
            self.record["final"] = weights(self)
            self.record["global_step"] = self.trainer.global_step
            (self.out_dir / f"rank{self.global_rank}.json").write_text(json.dumps(self.record))


def weights(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).tolist()


def ranks(out_dir: Path) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def full_loss(model: Regression, seed: int) -> float:
    x, y = data(seed).tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(model.net(x), y))


# -- the four entry points --------------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        "find_unused_parameters",
        "static_graph",
        "gradient_as_bucket_view",
        "bucket_cap_mb",
        "broadcast_buffers",
        "model_averaging_period",
        "ddp_comm_hook",
    ],
)
@pytest.mark.parametrize("strategy", OURS)
def test_ddp_options_are_refused_naming_them_and_why(strategy, option):
    cls = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, logger=False).strategy.__class__
    with pytest.raises(TypeError, match=rf"unsupported option\(s\) {option}=1: they configure DDP's wrapper"):
        cls(**{option: 1})
    with pytest.raises(
        TypeError, match=r"unsupported option\(s\) taux=4: it accepts the algorithm's own options"
    ):
        cls(taux=4)


@pytest.mark.parametrize("strategy", OURS)
def test_fit_validate_test_predict(tmp_path, strategy):
    model = Regression(tmp_path)
    t = trainer(strategy, max_epochs=2)
    t.fit(model)
    final = ranks(tmp_path)
    assert final[0]["final"] == final[1]["final"] == weights(model)  # every rank, and the main process
    # The sampler's shards are half the set each: the mean of the ranks' means is the whole set's.
    (validated,) = t.validate(model, dataloaders=loader(2))
    assert validated["val_loss"] == pytest.approx(full_loss(model, 2), rel=1e-5)
    (tested,) = t.test(model, dataloaders=loader(3))
    assert tested["test_loss"] == pytest.approx(full_loss(model, 3), rel=1e-5)
    # Under spawn/fork, predict returns nothing to the main process (as with DDP): a writer keeps them.
    t.predict(model, dataloaders=loader(4), return_predictions=False)
    x = data(4).tensors[0]
    for r in range(WORLD):  # each rank's share: every other sample
        with torch.no_grad():
            expected = model.net(x[r::WORLD]).flatten().tolist()
        assert json.loads((tmp_path / f"predicted{r}.json").read_text()) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("strategy", OURS)
def test_distributed_sampler_gives_each_rank_its_own_shard_every_epoch(tmp_path, strategy):
    model = Regression(tmp_path)
    trainer(strategy, max_epochs=2, limit_val_batches=0).fit(model)
    seen = [[tuple(row) for batch in r["seen"] for row in batch] for r in ranks(tmp_path)]
    everything = sorted(tuple(row) for row in data(1).tensors[0].tolist())
    per_epoch = N // WORLD
    for epoch in range(2):
        shards = [s[epoch * per_epoch : (epoch + 1) * per_epoch] for s in seen]
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == everything
    # Lightning's sampler reshuffles every epoch (set_epoch): rank 0 sees another order.
    assert seen[0][:per_epoch] != seen[0][per_epoch:]


# -- callbacks --------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", OURS)
def test_model_checkpoint_keeps_the_top_k_and_each_holds_the_model_validation_scored(tmp_path, strategy):
    model = Regression(tmp_path, lr=0.02)
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=2, filename="{epoch}"
    )
    t = trainer(strategy, max_epochs=4, enable_checkpointing=True, callbacks=[checkpoints])
    t.fit(model)
    scores = {epoch: loss for epoch, loss in ranks(tmp_path)[0]["val"]}
    best = sorted(scores, key=scores.get)[:2]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.ckpt")) == sorted(
        f"epoch={e}.ckpt" for e in best
    )
    assert Path(t.checkpoint_callback.best_model_path).name == f"epoch={best[0]}.ckpt"
    for epoch in best:
        # A checkpoint is a synchronisation point and validation sees the workers' average: the
        # two are the same model.
        saved = Regression()
        saved.load_state_dict(
            torch.load(tmp_path / "ckpt" / f"epoch={epoch}.ckpt", weights_only=False)["state_dict"]
        )
        assert full_loss(saved, 2) == pytest.approx(scores[epoch], rel=1e-5)


class RankScore(Regression):
    """Rank 0's score stops improving after epoch 2, rank 1's never does (no sync_dist)."""

    def on_validation_epoch_end(self) -> None:
        series = [5.0, 4.0, 3.0, 3.0, 3.0, 3.0] if self.global_rank == 0 else [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
        self.log("score", series[self.current_epoch])


@pytest.mark.parametrize("strategy", OURS)
def test_early_stopping_stops_every_rank_at_the_same_step(tmp_path, strategy):
    # EarlyStopping decides on each rank and agrees with the others ("any rank stops"): with
    # patience 1, rank 0 asks to stop after epoch 3; rank 1 must stop there too, or fit hangs.
    stop = EarlyStopping(monitor="score", patience=1, mode="min")
    trainer(strategy, max_epochs=6, callbacks=[stop]).fit(RankScore(tmp_path))
    assert [r["global_step"] for r in ranks(tmp_path)] == [4 * (N // WORLD // BATCH)] * WORLD


@pytest.mark.parametrize("strategy", OURS)
def test_swa_ends_with_the_average_of_the_workers_swa_models(tmp_path, strategy):
    model = Regression(tmp_path)
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2)
    trainer(strategy, max_epochs=4, limit_val_batches=0, callbacks=[swa]).fit(model)
    # SWA (swa_epoch_start=2 is its 0-based epoch 1) averages each worker's weights at the start
    # of epochs 1, 2 and 3 (the ends of epochs 0, 1, 2) and puts the result in the model when
    # training ends; the strategy's final average is over the workers (a mean of means).
    per_rank = [torch.tensor(r["epoch_end_weights"][0:3]).mean(dim=0) for r in ranks(tmp_path)]
    torch.testing.assert_close(torch.tensor(weights(model)), sum(per_rank) / WORLD, rtol=0, atol=1e-6)


class Normalised(Regression):
    def __init__(self, out_dir: Path | None = None) -> None:
        super().__init__(out_dir)
        self.net = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 1))

    def on_fit_end(self) -> None:
        state = {k: v.tolist() for k, v in self.state_dict().items() if v.is_floating_point()}
        (self.out_dir / f"state{self.global_rank}.json").write_text(json.dumps(state))


@pytest.mark.parametrize("strategy", OURS)
def test_swa_with_batchnorm_ends_with_identical_workers(tmp_path, strategy):
    # SWA's last epoch recomputes BatchNorm statistics into freshly assigned buffers, with no
    # optimizer step: only the strategy's final average, which must follow them, makes them agree.
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    trainer(strategy, max_epochs=2, limit_val_batches=0, callbacks=[swa]).fit(Normalised(tmp_path))
    states = [json.loads((tmp_path / f"state{r}.json").read_text()) for r in range(WORLD)]
    assert set(states[0]) >= {"net.0.running_mean", "net.0.running_var", "net.1.weight"}
    assert states[0] == states[1]


@pytest.mark.parametrize("strategy", OURS)
def test_ema_ends_with_the_average_of_the_workers_ema_models(tmp_path, strategy):
    decay = 0.5

    class Track(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            self.ema = None

        def on_train_batch_end(self, trainer, pl_module, *args):
            now = torch.tensor(weights(pl_module), dtype=torch.float64)
            self.ema = now if self.ema is None else decay * self.ema + (1 - decay) * now

        def on_fit_end(self, trainer, pl_module):
            (tmp_path / f"ema{trainer.global_rank}.json").write_text(json.dumps(self.ema.tolist()))

    model = Regression(tmp_path)
    ema = EMAWeightAveraging(decay=decay, use_buffers=False)
    trainer(strategy, max_epochs=2, limit_val_batches=0, callbacks=[Track(), ema]).fit(model)
    expected = (
        sum(torch.tensor(json.loads((tmp_path / f"ema{r}.json").read_text())) for r in range(WORLD)) / WORLD
    )
    torch.testing.assert_close(
        torch.tensor(weights(model), dtype=torch.float64), expected.double(), rtol=0, atol=1e-5
    )


# -- manual optimization and collectives --------------------------------------------------------


class ManualToy(toy.ToyRegression):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


def test_manual_optimization_follows_the_update_rule(tmp_path):
    steps, tau = 10, 4
    model = ManualToy(steps, str(tmp_path))
    # A fixed period, as the reference's: the name's default is tau="auto", which follows timing.
    strategy = lightning_cocod.CoCoDStrategy(tau=tau, start_method="fork")
    trainer(strategy, max_steps=steps, limit_val_batches=0, use_distributed_sampler=False).fit(model)
    trajectory, final = toy.reference_cocod(WORLD, steps, tau)
    for r, record in enumerate(toy.read_ranks(tmp_path, WORLD)):
        want = torch.tensor([step[r] for step in trajectory], dtype=torch.float64)
        torch.testing.assert_close(
            torch.tensor(record["trajectory"], dtype=torch.float64), want, rtol=0, atol=1e-6
        )
        torch.testing.assert_close(torch.tensor(record["final"]), torch.tensor(final[r]), rtol=0, atol=1e-6)


class Collectives(Regression):
    def on_train_start(self) -> None:
        rank, strategy = self.global_rank, self.trainer.strategy
        value = torch.tensor([float(rank + 1)])
        strategy.barrier("conformance")
        found = {
            "all_gather": self.all_gather(value).flatten().tolist(),
            "reduce_sum": strategy.reduce(value.clone(), reduce_op="sum").tolist(),
            "reduce_mean": strategy.reduce(value.clone(), reduce_op="mean").tolist(),
            "broadcast": strategy.broadcast({"from": rank}, src=0),
            "any": strategy.reduce_boolean_decision(rank == 1, all=False),
            "all": strategy.reduce_boolean_decision(rank == 1, all=True),
        }
        (self.out_dir / f"collectives{rank}.json").write_text(json.dumps(found))


@pytest.mark.parametrize("strategy", OURS)
def test_collectives(tmp_path, strategy):
    trainer(strategy, max_steps=1, limit_val_batches=0).fit(Collectives(tmp_path))
    for r in range(WORLD):
        found = json.loads((tmp_path / f"collectives{r}.json").read_text())
        assert found == {
            "all_gather": [1.0, 2.0],
            "reduce_sum": [3.0],
            "reduce_mean": [1.5],
            "broadcast": {"from": 0},
            "any": True,
            "all": False,
        }


# -- item: the averaged tensors follow the model --------------------------------------------------

STRATEGIES = {"cocod_fork": "cocod", "local_sgd_fork": "local_sgd", "pipe_sgd_fork": "pipe_sgd"}


class Rebinding(toy.ToyRegression):
    """Rebinds every parameter's storage before each step, as Lightning's spike-detection test
    model and weight-surgery callbacks do: same values, new tensors."""

    def on_train_batch_start(self, batch, batch_idx):
        for p in self.net.parameters():
            p.data = p.data.clone()


class Replacing(toy.ToyRegression):
    """Replaces the layer by a copy every third step and points the optimizer (and its momentum)
    at the copy's Parameters, as a weight-surgery callback would."""

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step % 3 != 1:
            return
        old, new = self.net, copy.deepcopy(self.net)
        optimizer = self.trainer.optimizers[0]
        swap = {id(o): n for o, n in zip(old.parameters(), new.parameters())}
        for group in optimizer.param_groups:
            group["params"] = [swap.get(id(p), p) for p in group["params"]]
        for o, n in zip(old.parameters(), new.parameters()):
            if o in optimizer.state:
                optimizer.state[n] = optimizer.state.pop(o)
        self.net = new


def reference(name: str, steps: int, tau: int):
    if name == "cocod":
        return toy.reference_cocod(WORLD, steps, tau)
    if name == "local_sgd":
        return toy.reference_local_sgd(WORLD, steps, tau)
    return toy.reference_pipe_sgd(WORLD, steps)


@pytest.mark.parametrize("module", [Rebinding, Replacing])
@pytest.mark.parametrize("strategy", OURS)
def test_rebound_or_replaced_parameters_are_still_averaged(tmp_path, strategy, module):
    steps, tau = 10, 4
    # A fixed period, as the reference's (CoCoD's default by name is tau="auto", which follows timing).
    built = (
        lightning_cocod.CoCoDStrategy(tau=tau, start_method="fork") if strategy == "cocod_fork" else strategy
    )
    trainer(built, max_steps=steps, limit_val_batches=0, use_distributed_sampler=False).fit(
        module(steps, str(tmp_path))
    )
    trajectory, _final = reference(STRATEGIES[strategy], steps, tau)
    records = toy.read_ranks(tmp_path, WORLD)
    for r, record in enumerate(records):
        want = torch.tensor([step[r] for step in trajectory], dtype=torch.float64)
        torch.testing.assert_close(
            torch.tensor(record["trajectory"], dtype=torch.float64), want, rtol=0, atol=1e-6
        )
    assert records[0]["final"] == records[1]["final"]


class Growing(toy.ToyRegression):
    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step == 5:
            self.extra = nn.Parameter(torch.zeros(3, dtype=torch.float64))


class Reshaping(toy.ToyRegression):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spare = nn.Parameter(torch.zeros(2, dtype=torch.float64))

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step == 5:
            self.spare.data = torch.zeros(3, dtype=torch.float64)


class Unregistered(toy.ToyRegression):
    """Trains a tensor that is not a parameter of the module: each worker's copy would drift alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = [torch.ones(1, dtype=torch.float64, requires_grad=True)]  # hidden from nn.Module

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x) * self.scale[0], y)

    def configure_optimizers(self):
        return torch.optim.SGD([*self.parameters(), *self.scale], lr=toy.LR)


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (Growing, r"tensor 'extra' was added at optimizer step \d+"),
        (
            Reshaping,
            r"tensor 'spare' changed from \(2,\) torch.float64 on cpu to \(3,\) torch.float64 on cpu",
        ),
        (
            Unregistered,
            r"optimizer trains a tensor of shape \(1,\) \(param group 0, index 2\) that is not a parameter",
        ),
    ],
)
@pytest.mark.parametrize("strategy", ["cocod_fork", "pipe_sgd_fork"])
def test_a_changed_set_of_parameters_is_refused_naming_it(tmp_path, strategy, module, message):
    with pytest.raises(Exception, match=message):
        trainer(strategy, max_steps=10, limit_val_batches=0, use_distributed_sampler=False).fit(
            module(10, str(tmp_path))
        )


def test_model_pruning_during_fit_is_refused_naming_the_pruned_parameter():
    # Pruning renames `weight` to `weight_orig` and adds a `weight_mask` buffer: a new layout.
    pruning = ModelPruning("l1_unstructured", amount=0.5)
    with pytest.raises(Exception, match=r"the model's tensor 'net.weight' was removed at optimizer step 4"):
        trainer("cocod_fork", max_epochs=2, limit_val_batches=0, callbacks=[pruning]).fit(Regression())


# -- item: a checkpoint saved by the main process resumes ---------------------------------------


@pytest.mark.parametrize("strategy", ["cocod_fork", "local_sgd_fork"])
@pytest.mark.parametrize("workers", [2, 1])
def test_a_checkpoint_saved_by_the_main_process_resumes(tmp_path, strategy, workers):
    # Lightning's test helpers save this way: trainer.save_checkpoint in the process that called
    # fit, which holds rank 0's weights and no worker's optimizer state.
    model = Regression()
    t = trainer(strategy, max_epochs=1, limit_val_batches=0)
    t.fit(model)
    path = tmp_path / "main.ckpt"
    t.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)

    class StartWeights(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            (tmp_path / f"start{trainer.global_rank}.json").write_text(json.dumps(weights(pl_module)))

    resumed = Regression(tmp_path)
    trainer(strategy, devices=workers, max_epochs=2, limit_val_batches=0, callbacks=[StartWeights()]).fit(
        resumed, ckpt_path=path
    )
    expected = torch.cat([t.flatten() for t in saved["state_dict"].values()]).tolist()
    for r in range(workers):
        assert json.loads((tmp_path / f"start{r}.json").read_text()) == pytest.approx(expected, abs=0)
    # Lightning's loops resume from what the file says (the main process ran none: epoch 0).
    steps_per_epoch = N // workers // BATCH
    assert (
        ranks_done(tmp_path, workers)
        == [saved["global_step"] + (2 - saved["epoch"]) * steps_per_epoch] * workers
    )


def ranks_done(out_dir: Path, workers: int) -> list[int]:
    return [json.loads((out_dir / f"rank{r}.json").read_text())["global_step"] for r in range(workers)]


# -- item: the environment a rank leaves behind ---------------------------------------------------


def _rank_process(rank: int, port: int, strategy: str, out: str) -> None:
    # As torchrun starts a rank: the environment names it, and the process runs fit itself (the
    # process that runs rank 0 is the user's own under the popen launcher and torchrun).
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(WORLD),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.pop(name, None)
    before = dict(os.environ)
    try:
        trainer(strategy, max_steps=2, limit_val_batches=0).fit(Regression())
        after = dict(os.environ)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        Path(out).write_text(json.dumps(changed))
    except BaseException:  # noqa: BLE001 - reported to the test through the file
        Path(out).write_text(json.dumps(traceback.format_exc()))
    finally:
        os._exit(0)


def changed_environment(tmp_path: Path, strategy: str) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("fork")
    outs = [tmp_path / f"env-{strategy}{r}.json" for r in range(WORLD)]
    processes = [
        context.Process(target=_rank_process, args=(r, port, strategy, str(outs[r]))) for r in range(WORLD)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=90)
        if process.is_alive():
            process.kill()
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.parametrize("strategy", ["cocod", "local_sgd", "ssgd"])
def test_a_rank_leaves_the_environment_as_lightning_ddp_does(tmp_path, strategy):
    # Lightning's DDP itself leaves OMP_NUM_THREADS and the like (its test harness allows them);
    # nothing more may change.
    ddp = changed_environment(tmp_path, "ddp")
    assert all(isinstance(found, list) for found in ddp), ddp
    assert changed_environment(tmp_path, strategy) == ddp
