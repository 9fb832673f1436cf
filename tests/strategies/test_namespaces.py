"""Both Lightning namespaces (``pytorch_lightning`` and the ``lightning`` package's
``lightning.pytorch``), imported before or after ``lightning_cocod``; spawn parents; hints."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_cocod
from tests.helpers import toy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

# A script, because strategy="cocod" (start_method popen) re-executes sys.argv in its second rank.
FIT = """
import json, sys
{imports}
from tests.helpers import toy

trainer = L.Trainer(strategy="cocod", accelerator="cpu", devices=2, max_steps=8, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    limit_val_batches=0, use_distributed_sampler=False)
trainer.fit(toy.toy_module(L.LightningModule)(8, sys.argv[1]))
strategy = trainer.strategy
open(f"{{sys.argv[1]}}/result{{trainer.global_rank}}.json", "w").write(json.dumps({{"class": f"{{type(strategy).__module__}}.{{type(strategy).__name__}}",
                  "rounds": [[r.launch_step, r.finish_step] for r in strategy.comm_stats.rounds], "rank": trainer.global_rank,
                  "is_theirs": isinstance(strategy, L.strategies.DDPStrategy)}}))
"""


@pytest.mark.parametrize(
    ("imports", "ours"),
    [
        ("import lightning_cocod\nimport lightning.pytorch as L", "lightning_cocod.lightning.CoCoDStrategy"),
        ("import pytorch_lightning as L\nimport lightning_cocod", "lightning_cocod.pl.CoCoDStrategy"),
    ],
    ids=["lightning.pytorch, imported after", "pytorch_lightning, imported before"],
)
def test_strategy_by_name_fits_in_either_namespace(tmp_path, imports, ours):
    script = tmp_path / "fit.py"
    script.write_text(FIT.format(imports=imports))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result{rank}.json").read_text()) for rank in (0, 1)]
    rounds = results[0].pop("rounds")
    assert results[1].pop("rounds") == rounds
    assert results == [{"class": ours, "rank": rank, "is_theirs": True} for rank in (0, 1)]
    assert_default_rounds(rounds, 8)
    ranks = toy.read_ranks(tmp_path, 2)
    assert ranks[0]["final"] == ranks[1]["final"]


def assert_default_rounds(rounds, steps):
    """The name's default period is tau="auto" within its bound: rounds of at most SAFE_TAU_MAX
    steps, one after another, over every step (which periods depends on the machine's timing)."""
    from lightning_cocod.core.adapt import SAFE_TAU_MAX

    assert next(list(r) for r in rounds)[0] == 0 and rounds[-1][1] == steps
    assert all(0 < finish - launch <= SAFE_TAU_MAX for launch, finish in rounds)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(rounds))


def test_each_namespace_has_its_own_classes_and_registry():
    import lightning.pytorch as L
    import pytorch_lightning as pl

    from lightning_cocod import lightning as for_lightning
    from lightning_cocod import pl as for_pl

    for name in ("CoCoDStrategy", "LocalSGDStrategy", "PipeSGDStrategy", "SSGDStrategy"):
        assert issubclass(getattr(for_lightning, name), L.strategies.DDPStrategy)
        assert issubclass(getattr(for_pl, name), pl.strategies.DDPStrategy)
        assert not issubclass(getattr(for_lightning, name), pl.strategies.DDPStrategy)
    assert lightning_cocod.CoCoDStrategy is for_pl.CoCoDStrategy
    for method in ("cocod", "local_sgd_fork", "pipe_sgd_spawn", "ssgd_notebook"):
        assert method in L.strategies.StrategyRegistry and method in pl.strategies.StrategyRegistry
    trainer = L.Trainer(
        strategy=for_lightning.CoCoDStrategy(tau=3), accelerator="cpu", devices=2, logger=False
    )
    assert trainer.strategy.tau == 3
    # the logic is one class, shared
    assert for_lightning.CoCoDStrategy.__mro__[1] is for_pl.CoCoDStrategy.__mro__[1]


def test_importing_the_package_imports_no_lightning():
    code = "import sys, lightning_cocod; print(sorted(m for m in ('pytorch_lightning', 'lightning', 'torch') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_spawn_parent_holds_the_workers_figures(tmp_path):
    import pytorch_lightning as pl

    trainer = pl.Trainer(
        strategy="cocod_spawn",
        accelerator="cpu",
        devices=2,
        max_steps=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(toy.ToyRegression(8, str(tmp_path)))
    stats = trainer.strategy.comm_stats
    assert_default_rounds([(r.launch_step, r.finish_step) for r in stats.rounds], 8)
    assert stats.summary()["rounds"] == len(stats.rounds) and trainer.strategy.tau_history[0] == (0, 2)


def test_an_interactive_session_is_told_our_notebook_strategy(monkeypatch):
    import pytorch_lightning as pl

    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # as under python -i or Jupyter
    with pytest.raises(RuntimeError, match=r"interactive session .* use strategy='cocod_notebook' \(fork\)"):
        pl.Trainer(strategy="cocod", accelerator="cpu", devices=2)
    assert (
        pl.Trainer(strategy="cocod_notebook", accelerator="cpu", devices=2).strategy._start_method == "fork"
    )


def test_spawn_without_a_main_guard_names_our_strategy(monkeypatch):
    import multiprocessing

    import pytorch_lightning as pl

    # What a spawned child sees while it re-runs an unguarded script that builds the Trainer.
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(
        RuntimeError, match=r"`if __name__ == \"__main__\":`.*strategy='cocod' \(start_method 'popen'\)"
    ):
        pl.Trainer(strategy="cocod_spawn", accelerator="cpu", devices=2)


@pytest.mark.parametrize(
    ("trainer_package", "strategy_home", "right_home"),
    [
        ("pytorch_lightning", "lightning_cocod.lightning", "lightning_cocod"),
        ("lightning.pytorch", "lightning_cocod", "lightning_cocod.lightning"),
    ],
)
def test_a_trainer_of_the_other_namespace_names_where_the_class_is(
    trainer_package, strategy_home, right_home
):
    import importlib

    trainer_class = importlib.import_module(trainer_package).Trainer
    strategy = importlib.import_module(strategy_home).CoCoDStrategy(tau=3)
    with pytest.raises(ValueError, match="invalid strategy") as refused:
        trainer_class(strategy=strategy, accelerator="cpu", devices=2)
    assert f"a {trainer_package} Trainer takes {right_home}.CoCoDStrategy" in str(refused.value)
    assert str(strategy) == "CoCoDStrategy(tau=3, progress=1.0, average_buffers=True, start_method='popen')"
