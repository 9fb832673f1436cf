"""Construction, argument checks and registration; no processes."""

import importlib
import re
import subprocess
import sys

import pytest
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry

import lightning_cocod
from lightning_cocod import CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy, SSGDStrategy


@pytest.mark.parametrize("cls", [CoCoDStrategy, LocalSGDStrategy])
@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True, None])
def test_tau_must_be_a_positive_integer(cls, bad):
    accepted = "a positive integer (optimizer steps per round)"
    with pytest.raises(
        ValueError, match=re.escape(f"{cls.__name__}: tau={bad!r} is invalid; accepted: {accepted}")
    ):
        cls(tau=bad)


@pytest.mark.parametrize("bad", [0, -0.5, float("inf"), float("nan"), 10**400, True, "0.5", None])
def test_cocod_progress_must_be_a_positive_number(bad):
    # 10**400 fits no float: refused here, in one line, not as an OverflowError naming nothing.
    with pytest.raises(ValueError) as refused:
        CoCoDStrategy(progress=bad)
    message = str(refused.value)
    assert message.startswith(f"CoCoDStrategy: progress={bad!r} is invalid; accepted: a positive number")
    assert "\n" not in message


@pytest.mark.parametrize("cls", [CoCoDStrategy, LocalSGDStrategy, PipeSGDStrategy])
def test_unsupported_options_are_named(cls):
    with pytest.raises(TypeError, match=r"model_averaging_period=4.*DDP's wrapper"):
        cls(model_averaging_period=4)
    with pytest.raises(TypeError, match=r"find_unused_parameters=True"):
        cls(find_unused_parameters=True)
    with pytest.raises(TypeError, match="average_buffers='yes' is invalid; accepted: True or False"):
        cls(average_buffers="yes")
    with pytest.raises(ValueError, match="start_method='thread'"):
        cls(start_method="thread")
    with pytest.raises(
        ValueError, match="on_nonfinite='ignore' is invalid; accepted: one of 'raise', 'skip', 'allow'"
    ):
        cls(on_nonfinite="ignore")


def test_registered_names_resolve_to_fresh_instances():
    expected = {
        "cocod": (CoCoDStrategy, "popen"),
        "cocod_spawn": (CoCoDStrategy, "spawn"),
        "cocod_fork": (CoCoDStrategy, "fork"),
        "cocod_notebook": (CoCoDStrategy, "fork"),
        "local_sgd": (LocalSGDStrategy, "popen"),
        "local_sgd_spawn": (LocalSGDStrategy, "spawn"),
        "pipe_sgd": (PipeSGDStrategy, "popen"),
        "pipe_sgd_fork": (PipeSGDStrategy, "fork"),
        "ssgd": (SSGDStrategy, "popen"),
        "ssgd_spawn": (SSGDStrategy, "spawn"),
    }
    for name, (cls, start_method) in expected.items():
        strategy = pl.Trainer(strategy=name, accelerator="cpu", devices=2, logger=False).strategy
        assert type(strategy) is cls, name
        assert strategy._start_method == start_method, name
    a = pl.Trainer(strategy="cocod", accelerator="cpu", devices=2, logger=False).strategy
    b = pl.Trainer(strategy="cocod", accelerator="cpu", devices=2, logger=False).strategy
    # The default period is tau="auto", starting at its bound, SAFE_TAU_MAX = 2.
    assert a is not b and a.tau == 2 and a.rounds.auto is not None and a.rounds.average_buffers is True
    assert str(a) == "CoCoDStrategy(tau='auto', progress=1.0, average_buffers=True, start_method='popen')"
    assert (
        "ddp" in StrategyRegistry
        and type(pl.Trainer(strategy="ddp", devices=2, accelerator="cpu").strategy) is DDPStrategy
    )


def test_ssgd_is_lightnings_ddp():
    assert issubclass(SSGDStrategy, DDPStrategy)
    strategy = SSGDStrategy(find_unused_parameters=True, timeout=30)
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}
    assert strategy._timeout.total_seconds() == 30


def test_registration_is_idempotent():
    importlib.reload(lightning_cocod)
    lightning_cocod._registration.register_in_every_namespace()
    assert StrategyRegistry["cocod"]["strategy"] is lightning_cocod.CoCoDStrategy


def test_readme_one_liner_prints_the_strategy():
    code = (
        "import lightning_cocod, pytorch_lightning as pl; "
        "print(pl.Trainer(strategy='cocod', accelerator='cpu', devices=2).strategy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "CoCoDStrategy(tau='auto'" in out.stdout


def test_every_overridden_lightning_hook_says_override():
    import lightning_fabric.strategies as fabric_strategies

    from lightning_cocod.fabric_strategy import FabricRounds
    from lightning_cocod.strategies import SSGDMethod, StrategyCommon, SyncStrategyBase
    from lightning_cocod.strategies.reliability import ReliableStrategy

    mixins = {c: DDPStrategy for c in (ReliableStrategy, StrategyCommon, SyncStrategyBase, SSGDMethod)}
    mixins[FabricRounds] = fabric_strategies.DDPStrategy
    unmarked = [
        f"{mixin.__name__}.{name}"
        for mixin, lightning in mixins.items()
        for name, member in vars(mixin).items()
        if callable(member) and not name.startswith("__") and hasattr(lightning, name)
        if not getattr(member, "__override__", False)
    ]
    assert unmarked == []
    assert getattr(StrategyCommon.optimizer_step, "__override__", False)  # the check sees a marked one
