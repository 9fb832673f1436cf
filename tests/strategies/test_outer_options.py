"""``overlap``, ``outer_optimizer`` and ``outer_scheduler`` refused at construction, in one line naming the option and what
is accepted, by every front-end (Trainer strategies of both namespaces, the loop API, Fabric),
before any worker starts."""

import functools

import pytest
import torch

from tests.helpers import toy

# tau=4: below 0, above tau, floats, a bool, strings that are not "auto"
BAD_OVERLAP = [-1, 5, 1.0, 2.5, True, "1", "sometimes", "AUTO"]
NOT_AN_OPTIMIZER = [3, "torch.optim.SGD", lambda params: 3, lambda params: torch.zeros(1)]
# Not a scheduler: a number, a name, a factory of an optimizer (the outer_optimizer's, misplaced)
NOT_A_SCHEDULER = [3, "LinearLR", lambda optimizer: torch.optim.SGD([torch.zeros(1)], lr=1.0)]
NESTEROV = functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


def _front_ends():
    import lightning_cocod
    import lightning_cocod.lightning as lit
    from lightning_cocod.fabric import CoCoDFabricStrategy, DiLoCoFabricStrategy
    from lightning_cocod.loop import CoCoD, DiLoCo

    model = toy.initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "CoCoDStrategy": lightning_cocod.CoCoDStrategy,
        "DiLoCoStrategy": lightning_cocod.DiLoCoStrategy,
        "DiLoCoStrategy ": lit.DiLoCoStrategy,  # the lightning.pytorch class
        "CoCoD": functools.partial(CoCoD, model, optimizer),
        "DiLoCo": functools.partial(DiLoCo, model, optimizer),
        "CoCoDFabricStrategy": CoCoDFabricStrategy,
        "DiLoCoFabricStrategy": DiLoCoFabricStrategy,
    }


FRONT_ENDS = sorted(_front_ends())


def _refusal(make, **options):
    with pytest.raises(ValueError) as raised:  # the message is checked below
        make(tau=4, **options)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", FRONT_ENDS)
@pytest.mark.parametrize("overlap", BAD_OVERLAP, ids=repr)
def test_a_bad_overlap_is_refused_in_one_line(name, overlap):
    message = _refusal(_front_ends()[name], overlap=overlap)
    assert message == (
        f"{name.strip()}: overlap={overlap!r} is invalid; accepted: None (the whole period, the paper's "
        "round), 'auto' (the fewest steps that hide the round as measured) or an integer from 0 to tau=4"
    )


@pytest.mark.parametrize("name", FRONT_ENDS)
def test_every_front_end_takes_an_automatic_overlap(name):
    strategy = _front_ends()[name](tau=4, overlap="auto")
    rounds = strategy.rounds if hasattr(strategy, "rounds") else strategy._rounds
    assert rounds.options()["overlap"] == "auto" and rounds.overlap_in_force == 4  # hides all, to start


@pytest.mark.parametrize("name", FRONT_ENDS)
@pytest.mark.parametrize("outer", NOT_AN_OPTIMIZER, ids=["int", "str", "returns-int", "returns-tensor"])
def test_an_outer_optimizer_that_builds_no_optimizer_is_refused_in_one_line(name, outer):
    message = _refusal(_front_ends()[name], outer_optimizer=outer)
    assert message.startswith(
        f"{name.strip()}: outer_optimizer={outer!r} is invalid; accepted: None (the paper's"
    )
    assert "torch.optim.Optimizer" in message
    if callable(outer):  # what it built instead is said
        assert message.endswith(f"(it returned a {type(outer([])).__name__})")


@pytest.mark.parametrize("name", FRONT_ENDS)
@pytest.mark.parametrize("schedule", NOT_A_SCHEDULER, ids=["int", "str", "returns-an-optimizer"])
def test_an_outer_scheduler_that_builds_no_scheduler_is_refused_in_one_line(name, schedule):
    message = _refusal(_front_ends()[name], outer_optimizer=NESTEROV, outer_scheduler=schedule)
    assert message.startswith(
        f"{name.strip()}: outer_scheduler={schedule!r} is invalid; accepted: None (the outer learning rate as given)"
    )
    assert "torch.optim.lr_scheduler.LRScheduler" in message
    if callable(schedule):
        assert message.endswith("(it returned a SGD)")


def test_a_scheduler_with_no_outer_optimizer_to_schedule_is_refused_in_one_line():
    import lightning_cocod

    warmup = functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.25, total_iters=3)
    message = _refusal(lightning_cocod.CoCoDStrategy, outer_scheduler=warmup)
    assert message.startswith(
        "CoCoDStrategy: outer_scheduler=functools.partial(<class 'torch.optim.lr_scheduler.LinearLR'>"
    )
    assert message.endswith(
        "is invalid; accepted: None without an outer_optimizer (it schedules the outer optimizer's learning rate)"
    )
    message = _refusal(lightning_cocod.DiLoCoStrategy, outer_optimizer=None, outer_scheduler=warmup)
    assert message.startswith("DiLoCoStrategy: outer_scheduler=")
    # A scheduler that cannot be built on the outer optimizer says what it raised.
    wrong = functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=2.0)
    message = _refusal(lightning_cocod.DiLoCoStrategy, outer_scheduler=wrong)
    assert "(it raised: Starting multiplicative factor expected to be" in message


def test_a_factory_that_raises_is_refused_with_its_first_line():
    import lightning_cocod

    def broken(params):
        raise RuntimeError("no such optimizer\nsecond line")

    message = _refusal(lightning_cocod.DiLoCoStrategy, outer_optimizer=broken)
    assert message.endswith("(it raised: no such optimizer)")


def test_what_does_not_combine_is_refused_in_one_line():
    import lightning_cocod

    nesterov = functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)
    for overlap in (1, "auto"):  # the paper's round overlaps the whole period tau="auto" chooses
        with pytest.raises(
            ValueError,
            match=rf"^CoCoDStrategy: overlap={overlap!r} is invalid; accepted: None with tau='auto' and no "
            r"outer_optimizer \(the paper's round, which overlaps the whole period chosen\); give tau a number",
        ):
            lightning_cocod.CoCoDStrategy(tau="auto", overlap=overlap)
    # With an outer optimizer tau="auto" is the fixed period OUTER_TAU and the overlap is chosen.
    with pytest.raises(
        ValueError,
        match=r"^CoCoDStrategy: overlap=1 is invalid; accepted: None or 'auto' with tau='auto' and an "
        r"outer_optimizer \(the period is then 8 and the overlap chosen\); give tau a number for a fixed overlap$",
    ):
        lightning_cocod.CoCoDStrategy(tau="auto", overlap=1, outer_optimizer=nesterov)
    for bound in ("tau_min", "tau_max"):
        with pytest.raises(
            ValueError,
            match=rf"^CoCoDStrategy: {bound}=4 is invalid; accepted: None with an outer_optimizer "
            r"\(tau='auto' then runs the outer round at tau=8 and chooses its overlap\)$",
        ):
            lightning_cocod.CoCoDStrategy(tau="auto", outer_optimizer=nesterov, **{bound: 4})
    with pytest.raises(
        ValueError, match=r"^DiLoCoStrategy: tau='auto' is invalid; accepted: a positive integer"
    ):
        lightning_cocod.DiLoCoStrategy(tau="auto")
    with pytest.raises(
        ValueError, match=r"^CoCoDStrategy: progress=2.0 is invalid; accepted: 1 with an outer_optimizer"
    ):
        lightning_cocod.CoCoDStrategy(tau=4, progress=2.0, outer_optimizer=nesterov)
    with pytest.raises(TypeError, match=r"^DiLoCoStrategy got unsupported option\(s\) progress=2.0"):
        lightning_cocod.DiLoCoStrategy(progress=2.0)


def test_the_options_print_as_given_and_every_name_is_registered():
    import pytorch_lightning as pl

    import lightning_cocod

    outer = functools.partial(torch.optim.SGD, lr=1.0)
    strategy = lightning_cocod.CoCoDStrategy(tau=4, overlap=1, outer_optimizer=outer)
    assert strategy.rounds.options()["outer_optimizer"] == "torch.optim.sgd.SGD(lr=1.0)"
    assert strategy.overlap == 1
    auto = lightning_cocod.CoCoDStrategy(outer_optimizer=outer)  # tau="auto", the default
    assert auto.tau == 8 and auto.overlap == "auto" and auto.rounds.options()["tau"] == "auto"
    assert lightning_cocod.CoCoDStrategy(tau=4).rounds.options() == {
        "tau": 4,
        "progress": 1.0,
        "average_buffers": True,
    }  # the paper's round prints as it did
    warmup = functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.25, total_iters=3)
    scheduled = lightning_cocod.DiLoCoStrategy(tau=4, outer_scheduler=warmup)
    assert scheduled.rounds.options()["outer_scheduler"] == (
        "torch.optim.lr_scheduler.LinearLR(start_factor=0.25, total_iters=3)"
    )
    for name in ("diloco", "diloco_fork", "diloco_spawn"):
        assert name in pl.strategies.StrategyRegistry
