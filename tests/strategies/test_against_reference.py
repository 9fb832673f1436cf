"""Each strategy through a real Trainer on 2 gloo processes (fork) against a single-process
reference simulation of its update rule on the same per-rank data."""

from typing import ClassVar

import pytest
import pytorch_lightning as pl
import torch

from lightning_cocod import CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy
from tests.helpers import toy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WORLD, STEPS, TAU = 2, 10, 4  # rounds of 4, 4 and a partial 2


def fit(strategy, out_dir, steps=STEPS, callbacks=(), module=None, **trainer_kwargs):
    model = module or toy.ToyRegression(steps, str(out_dir))
    trainer_kwargs = {"limit_val_batches": 0, "num_sanity_val_steps": 0, "logger": False, **trainer_kwargs}
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=WORLD,
        max_steps=steps,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=list(callbacks),
        **trainer_kwargs,
    )
    trainer.fit(model)
    return toy.read_ranks(out_dir, WORLD)


def assert_matches(ranks, trajectory, final):
    for r, record in enumerate(ranks):
        got = torch.tensor(record["trajectory"], dtype=torch.float64)
        want = torch.tensor([step[r] for step in trajectory], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(torch.tensor(record["final"]), torch.tensor(final[r]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("progress", [None, 0.5], ids=["paper-merge", "half-progress"])
def test_cocod_matches_reference_and_ends_identical(tmp_path, progress):
    options = {} if progress is None else {"progress": progress}
    ranks = fit(CoCoDStrategy(tau=TAU, start_method="fork", **options), tmp_path)
    trajectory, final = toy.reference_cocod(WORLD, STEPS, TAU, **options)
    # the ranks really diverge within a round (otherwise the test proves little)
    assert max(abs(a - b) for a, b in zip(trajectory[5][0], trajectory[5][1])) > 1e-3
    assert_matches(ranks, trajectory, final)
    assert ranks[0]["final"] == ranks[1]["final"]


def test_local_sgd_matches_reference(tmp_path):
    ranks = fit(LocalSGDStrategy(tau=TAU, start_method="fork"), tmp_path)
    assert_matches(ranks, *toy.reference_local_sgd(WORLD, STEPS, TAU))
    assert ranks[0]["final"] == ranks[1]["final"]


def test_pipe_sgd_matches_reference(tmp_path):
    ranks = fit(PipeSGDStrategy(start_method="fork"), tmp_path)
    assert_matches(ranks, *toy.reference_pipe_sgd(WORLD, STEPS))
    # the all-reduce launched at step t is waited on at step t+1
    for record in ranks:
        assert record["rounds"][: STEPS - 1] == [[t, t + 1] for t in range(STEPS - 1)]


def test_local_sgd_tau_one_plain_sgd_equals_ssgd(tmp_path):
    module = toy.ToyRegression(STEPS, str(tmp_path), momentum=0.0, weight_decay=0.0)
    ranks = fit(LocalSGDStrategy(tau=1, start_method="fork"), tmp_path, module=module)
    trajectory, _final = toy.reference_ssgd(WORLD, STEPS, momentum=0.0, weight_decay=0.0)
    for r, record in enumerate(ranks):
        got = torch.tensor(record["trajectory"])
        torch.testing.assert_close(got, torch.tensor([s[r] for s in trajectory]), rtol=0, atol=1e-5)


def test_ssgd_name_is_lightning_ddp_and_matches_reference(tmp_path):
    ranks = fit("ssgd_fork", tmp_path)
    assert_matches(ranks, *toy.reference_ssgd(WORLD, STEPS))


class RecordOrder(pl.Callback):
    """Wraps the strategy's communicator before set-up builds the round on it."""

    def __init__(self):
        self.events = []

    def setup(self, trainer, pl_module, stage):
        strategy, log = trainer.strategy, self.events
        inner = strategy.driver.comm

        class Recording:
            def __getattr__(self, name):
                return getattr(inner, name)

            def start_mean(self, buckets, weight=None):
                handle = inner.start_mean(buckets, weight)
                # Only the model's all-reduce: the tiny control message of each round (figures
                # and non-finite flags) goes along with it and is not the point.
                if strategy.rounds.round is None or buckets is not strategy.rounds.round.average.buckets:
                    return handle
                log.append(("launch", strategy._steps))
                wait = handle.wait

                def recorded_wait():
                    log.append(("wait", strategy._steps))
                    wait()

                handle.wait = recorded_wait
                return handle

        strategy.driver.comm = Recording()

    def on_train_batch_start(self, trainer, *args):
        self.events.append(("step", trainer.global_step))

    def on_fit_end(self, trainer, pl_module):
        import json

        (pl_module.out_dir / f"order{trainer.global_rank}.json").write_text(json.dumps(self.events))


def test_cocod_allreduce_in_flight_during_the_rounds_local_steps(tmp_path):
    import json

    fit(CoCoDStrategy(tau=TAU, start_method="fork"), tmp_path, callbacks=[RecordOrder()])
    for r in range(WORLD):
        log = [tuple(e) for e in json.loads((tmp_path / f"order{r}.json").read_text())]
        train = [e for e in log if e[0] in ("step", "launch", "wait")]
        # launch before step 0's compute, then 4 local steps, then the wait; the partial last
        # round (steps 8, 9) is waited on when fit ends, followed by the final average.
        expected = [
            ("step", 0),
            ("launch", 0),
            ("step", 1),
            ("step", 2),
            ("step", 3),
            ("wait", 4),
            ("step", 4),
            ("launch", 4),
            ("step", 5),
            ("step", 6),
            ("step", 7),
            ("wait", 8),
            ("step", 8),
            ("launch", 8),
            ("step", 9),
            ("wait", 10),
            ("launch", 10),
            ("wait", 10),
        ]
        assert train == expected


class CountDefaultGroupCollectives(pl.Callback):
    """Counts collectives on the default group while training steps run (not set-up or teardown),
    whichever way the group is given: left out, None, by position, or as the WORLD group."""

    # Where each function takes its group when passed by position.
    GROUP_AT: ClassVar[dict[str, int]] = {
        "broadcast": 2,
        "all_reduce": 2,
        "barrier": 0,
        "all_gather": 2,
        "all_gather_object": 2,
        "broadcast_object_list": 2,
        "reduce": 3,
    }

    def __init__(self, out_dir):
        self.out_dir, self.count, self.training = out_dir, 0, False

    def setup(self, trainer, pl_module, stage):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        default = distributed_c10d._get_default_group()
        for name, position in self.GROUP_AT.items():
            original = getattr(distributed_c10d, name)

            def counted(*args, _original=original, _position=position, **kwargs):
                group = (
                    kwargs["group"]
                    if "group" in kwargs
                    else (args[_position] if len(args) > _position else None)
                )
                if self.training and group in (None, dist.group.WORLD, default):
                    self.count += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
            setattr(distributed_c10d, name, counted)

    def on_train_batch_start(self, *args):
        self.training = True

    def on_train_end(self, trainer, pl_module):
        self.training = False
        (self.out_dir / f"collectives{trainer.global_rank}.txt").write_text(str(self.count))


@pytest.mark.parametrize("strategy_cls", [CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy])
def test_no_per_step_rendezvous_on_the_default_group(tmp_path, strategy_cls):
    # Lightning broadcasts a SIGTERM flag before every step; ours must not couple the workers so.
    fit(strategy_cls(start_method="fork"), tmp_path, callbacks=[CountDefaultGroupCollectives(tmp_path)])
    assert [int((tmp_path / f"collectives{r}.txt").read_text()) for r in range(WORLD)] == [0, 0]


def test_the_counter_sees_lightnings_own_per_step_collectives(tmp_path):
    # The control: Lightning's DDP broadcasts on the default group before every step (counted from
    # the second: the first comes before on_train_batch_start).
    fit("ddp_fork", tmp_path, callbacks=[CountDefaultGroupCollectives(tmp_path)])
    counts = [int((tmp_path / f"collectives{r}.txt").read_text()) for r in range(WORLD)]
    assert all(c >= STEPS - 1 for c in counts), counts


class FrozenBiasToy(toy.ToyRegression):
    """The bias starts frozen and outside the optimizer; before step `unfreeze_at` it joins both."""

    def __init__(self, steps, out_dir, unfreeze_at):
        super().__init__(steps, out_dir)
        self.unfreeze_at = unfreeze_at
        self.net.bias.requires_grad_(False)

    def configure_optimizers(self):
        return torch.optim.SGD(
            [self.net.weight], lr=toy.LR, momentum=toy.MOMENTUM, weight_decay=toy.WEIGHT_DECAY
        )

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step == self.unfreeze_at:
            self.net.bias.requires_grad_(True)
            self.trainer.optimizers[0].add_param_group({"params": [self.net.bias]})


def test_a_layer_unfrozen_mid_fit_is_averaged_like_the_rest(tmp_path):
    ranks = fit(
        CoCoDStrategy(tau=TAU, start_method="fork"), tmp_path, module=FrozenBiasToy(STEPS, str(tmp_path), 3)
    )
    trajectory, final = toy.reference_cocod(WORLD, STEPS, TAU, unfreeze_bias_at=3)
    assert trajectory[2][0][-2:] == trajectory[0][0][-2:]  # the bias really was frozen, then moved
    assert_matches(ranks, trajectory, final)
    assert ranks[0]["final"] == ranks[1]["final"]


@pytest.mark.timeout(180)
def test_a_long_fork_fit_returns_and_hands_its_round_figures_to_the_parent(tmp_path):
    # tau=1: a round per step. 2000 rounds of figures pickle to about 100 KiB, more than the 64 KiB
    # a pipe holds: what rank 0 could send back through Lightning's queue before the parent, which joins the
    # workers before reading it, deadlocked with it.
    steps = 2000
    strategy = CoCoDStrategy(tau=1, start_method="fork")
    ranks = fit(strategy, tmp_path, steps=steps)
    assert all(len(r["trajectory"]) == steps for r in ranks)
    # Here, in the parent: every round of rank 0, as the worker counted them.
    assert len(strategy.comm_stats.rounds) == steps
    assert [r.launch_step for r in strategy.comm_stats.rounds] == list(range(steps))
