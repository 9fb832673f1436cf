"""A state read back is checked as strictly as the same options given to a constructor: every
field of the loop API's ``state_dict`` (and of the strategies' checkpoints, which hold the same
state), refused in one line naming the field. No processes: the state is refused before entering."""

import math

import pytest
import torch

from lightning_cocod import CoCoDStrategy
from lightning_cocod.loop import CoCoD, LocalSGD


def loop(cls=CoCoD, **options):
    model = torch.nn.Linear(2, 2)
    return cls(model, torch.optim.SGD(model.parameters(), lr=0.1), **options)


def saved(**options):
    """A state as the loop API writes it, from a tau="auto" run that measured something."""
    source = loop(**options)
    source.rounds.auto.period.update(comm_seconds=0.3, step_seconds=0.1, round_seconds=0.001)
    return source.state_dict()


def tampered(path, value, **options):
    state = saved(**options)
    *parents, key = path.split(".")
    holder = state
    for parent in parents:
        holder = holder[parent]
    holder[key] = value
    return state


def test_an_untouched_state_loads():
    state = saved()
    resumed = loop()
    resumed.load_state_dict(state)
    assert resumed.rounds.auto.period.comm_seconds == 0.3 and resumed.tau == 2


@pytest.mark.parametrize(
    ("path", "value", "accepted"),
    [
        ("tau", 2.5, "a positive integer (optimizer steps per round)"),
        ("tau", True, "a positive integer (optimizer steps per round)"),
        ("tau", "x", "a positive integer (optimizer steps per round)"),
        ("tau", "3", "a positive integer (optimizer steps per round)"),
        ("steps", -1, "an integer >= 0"),
        ("steps", 1.5, "an integer >= 0"),
        ("weight", 2.0, "None (the plain mean) or a number in (0, 1]"),
        ("tau_history", [(0, 2.5)], "a list of (step >= 0, tau >= 1) pairs"),
        ("tau_history", "x", "a list of (step >= 0, tau >= 1) pairs"),
        ("adaptive.comm_seconds", math.nan, "None or a number of seconds >= 0"),
        ("adaptive.comm_seconds", "0.3", "None or a number of seconds >= 0"),
        ("adaptive.step_seconds", 0.0, "None or a number of seconds > 0"),
        ("adaptive.round_seconds", math.inf, "None or a number of seconds >= 0"),
        ("adaptive.round_samples", True, "an integer >= 0"),
        ("adaptive.shorter_asks", [1.5], "a list of positive integers (periods)"),
        ("measured", [math.nan, 0.1, 0.0], "None or 2 or 3 numbers of seconds >= 0"),
        ("adaptive", None, "a dict of the figures measured"),
    ],
)
def test_a_tampered_field_is_refused_in_one_line_naming_it(path, value, accepted):
    state = tampered(path, value)
    resumed = loop()
    with pytest.raises(ValueError) as refused:
        resumed.load_state_dict(state)
    message = str(refused.value)
    assert message == f"CoCoD: the state's {path}={value!r} is invalid; accepted: {accepted}"
    assert resumed._loaded is None  # nothing of it is applied on entering


def test_a_fixed_period_checks_the_saved_one_too():
    # The saved period is not applied (a fixed tau is the caller's), but a bad one is still refused.
    state = {**loop(tau=4).state_dict(), "tau": 2.5}
    with pytest.raises(ValueError, match=r"^CoCoD: the state's tau=2.5 is invalid"):
        loop(tau=4).load_state_dict(state)
    state = {**loop(LocalSGD, tau=4).state_dict(), "steps": True}
    with pytest.raises(ValueError, match=r"^LocalSGD: the state's steps=True is invalid"):
        loop(LocalSGD, tau=4).load_state_dict(state)


def test_a_strategy_checkpoint_is_checked_the_same_way():
    strategy = CoCoDStrategy(tau="auto")
    state = {**strategy.rounds.state(), "tau": 2.5}
    with pytest.raises(
        ValueError, match=r"^CoCoDStrategy: the state's tau=2.5 is invalid; accepted: a positive"
    ):
        CoCoDStrategy(tau="auto").rounds.load_state(state)
    state = strategy.rounds.state()
    state["adaptive"]["comm_seconds"] = math.nan
    with pytest.raises(ValueError, match=r"^CoCoDStrategy: the state's adaptive.comm_seconds=nan is invalid"):
        CoCoDStrategy(tau="auto").rounds.load_state(state)
