"""Proportional split and the adaptive period against hand-computed values; bad input."""

import math

import pytest

from lightning_cocod import CoCoDStrategy
from lightning_cocod.callbacks import ProportionalSampling, SimulatedSlowdown
from lightning_cocod.core import RoundRecord
from lightning_cocod.core.adapt import SAFE_TAU_MAX, AdaptivePeriod, proportional_split


@pytest.mark.parametrize(
    ("batch", "caps", "expected"),
    [
        (48, [2.0, 1.0], [32, 16]),
        (48, [1.0, 1.0], [24, 24]),
        (10, [1.0, 1.0, 1.0], [4, 3, 3]),  # 1 + 7/3 each: the tie goes to the lowest rank
        (4, [1000.0, 1.0, 1.0, 1.0], [1, 1, 1, 1]),  # everyone keeps one sample
        (100, [3.0, 1.0], [75, 25]),
        (7, [1.0, 2.0], [2, 5]),  # 2.33 and 4.67: the larger remainder takes the spare sample
    ],
)
def test_proportional_split(batch, caps, expected):
    sizes = proportional_split(batch, caps)
    assert sizes == expected and sum(sizes) == batch


def test_proportional_split_rejects_what_cannot_fit():
    with pytest.raises(ValueError, match="global batch 3 cannot give each of 4 workers at least one sample"):
        proportional_split(3, [1.0] * 4)
    with pytest.raises(ValueError, match="capabilities must be positive finite"):
        proportional_split(8, [1.0, 0.0])


def test_adaptive_period_hides_the_measured_communication():
    period = AdaptivePeriod(tau_min=1, tau_max=64, initial=4, margin=1.2, smoothing=1.0, patience=1)
    assert period.tau == 4
    assert period.update(comm_seconds=2.4, step_seconds=0.68) == 5  # ceil(1.2 * 2.4 / 0.68) = ceil(4.24)
    assert period.update(comm_seconds=7.2, step_seconds=0.68) == 13  # 100 Mbit/s: ceil(12.7)
    assert period.update(comm_seconds=0.05, step_seconds=0.68) == 1
    assert period.update(comm_seconds=100.0, step_seconds=0.1) == 64  # clamped
    assert period.update(comm_seconds=1.0, step_seconds=0.0) == 64  # nothing measured: unchanged


def test_adaptive_period_amortises_the_rounds_own_cost():
    period = AdaptivePeriod(margin=1.2, overhead=0.02, smoothing=1.0, patience=1)
    # One round's own work is not enough to go by: hiding alone asks for ceil(1.2 * 0.05 / 0.1) = 1.
    assert period.update(comm_seconds=0.05, step_seconds=0.1, round_seconds=0.01) == 1
    # With two, a fast link hides in one step, but a 10 ms round over 0.1 s steps needs 5 steps
    # to stay under 2%: ceil(0.01 / (0.02 * 0.1)).
    assert period.update(comm_seconds=0.05, step_seconds=0.1, round_seconds=0.01) == 5
    # The slower link asks for more: the larger of the two wins.
    assert period.update(comm_seconds=1.0, step_seconds=0.1, round_seconds=0.01) == 12
    assert period.update(comm_seconds=0.05, step_seconds=0.1, round_seconds=0.0) == 1


def test_without_an_overhead_only_hiding_counts():
    # What overlap="auto" chooses: the round costs the same whatever its overlap.
    period = AdaptivePeriod(tau_max=8, initial=8, margin=1.2, overhead=None, smoothing=1.0, patience=1)
    for _ in range(3):  # a 10 ms round over 0.1 s steps would ask for 5 steps at 2%
        assert period.update(comm_seconds=0.05, step_seconds=0.1, round_seconds=0.01) == 1
    assert period.update(comm_seconds=1.0, step_seconds=0.1, round_seconds=0.01) == 8  # ceil(12), clamped


def test_one_slow_round_does_not_raise_the_rounds_own_cost():
    period = AdaptivePeriod(margin=1.2, overhead=0.01, smoothing=1.0, patience=1)
    assert period.update(comm_seconds=0.01, step_seconds=0.1, round_seconds=0.002) == 1
    assert period.update(comm_seconds=0.01, step_seconds=0.1, round_seconds=0.002) == 2  # ceil(0.002 / 0.001)
    # A preempted round measures 20 ms of its own work: the period stays.
    assert period.update(comm_seconds=0.01, step_seconds=0.1, round_seconds=0.02) == 2


def test_a_slow_first_round_does_not_set_the_period():
    period = AdaptivePeriod(margin=1.2, overhead=0.01, smoothing=1.0, patience=1)
    # The first timed round was preempted (20 ms of own work): alone it would ask for 20 steps.
    assert period.update(comm_seconds=0.01, step_seconds=0.1, round_seconds=0.02) == 1
    assert period.update(comm_seconds=0.01, step_seconds=0.1, round_seconds=0.002) == 2


def test_adaptive_period_grows_at_once_and_shrinks_after_patience():
    period = AdaptivePeriod(initial=4, margin=1.0, smoothing=1.0, patience=2)
    assert period.update(0.8, 0.1) == 8  # exposed communication: grow now
    assert period.update(0.5, 0.1) == 8  # one round asks for 5: not yet
    assert period.update(0.9, 0.1) == 9  # a larger ask resets the count
    assert period.update(0.6, 0.1) == 9
    assert period.update(0.7, 0.1) == 7  # two in a row: the larger of the two asks
    assert period.shorter_asks == []


def test_adaptive_period_smooths():
    period = AdaptivePeriod(margin=1.0, smoothing=0.5)
    period.update(1.0, 0.1)  # first figures taken as they are: tau 10
    assert period.update(3.0, 0.1) == 20  # (1 + 3) / 2 = 2 s over 0.1 s


def test_bad_heterogeneous_input_is_named():
    with pytest.raises(
        ValueError,
        match=r"AdaptivePeriod: overhead=2 is invalid; accepted: None or a share of the step time in \(0, 1\)",
    ):
        AdaptivePeriod(overhead=2)
    with pytest.raises(
        ValueError, match=r"AdaptivePeriod: patience=0 is invalid; accepted: a positive integer \(rounds\)"
    ):
        AdaptivePeriod(patience=0)
    with pytest.raises(
        ValueError, match=r"tau_min=8 is invalid; accepted: a period no longer than tau_max=4"
    ):
        CoCoDStrategy(tau="auto", tau_min=8, tau_max=4)
    with pytest.raises(ValueError, match="tau_min/tau_max bound tau='auto' only"):
        CoCoDStrategy(tau=4, tau_max=16)
    with pytest.raises(
        ValueError, match="tau='fast' is invalid; accepted: a positive integer .* or \"auto\""
    ):
        CoCoDStrategy(tau="fast")
    with pytest.raises(ValueError, match=r"slowdown factors must be numbers >= 1.*\[1, 0.5\]"):
        SimulatedSlowdown([1, 0.5])
    with pytest.raises(
        ValueError, match=r"batch_sizes \[30, 20\] must be positive integers summing to global_batch_size=48"
    ):
        ProportionalSampling(48, batch_sizes=[30, 20])
    assert repr(CoCoDStrategy(tau="auto")).startswith("CoCoDStrategy(tau='auto'")


def test_auto_keeps_to_the_safe_period_unless_its_bound_is_raised():
    # The accuracy studies' bound: a link that needs 24 steps to hide still gets tau 2 by default,
    # from the first round on (the rule's initial 4 is above it); a raised bound lets the rule hide it.
    default = CoCoDStrategy(tau="auto")
    assert SAFE_TAU_MAX == 2 and default.tau == 2
    assert default.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 2
    raised = CoCoDStrategy(tau="auto", tau_max=64)
    assert raised.tau == 4
    assert raised.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 24


def test_an_outer_step_bounds_auto_at_one_unless_told_otherwise():
    # progress above 1 held S-SGD's loss only at tau=1 in the GPT study: the bound follows.
    outer = CoCoDStrategy(tau="auto", progress=2.0)
    assert outer.tau == 1
    assert outer.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 1
    assert CoCoDStrategy(tau="auto", progress=0.5).tau == SAFE_TAU_MAX  # a damped merge keeps the bound
    # A bound or a shortest period the user set wins; a fixed tau is the user's.
    assert CoCoDStrategy(tau="auto", progress=2.0, tau_max=4).rounds.auto.period.tau_max == 4
    assert CoCoDStrategy(tau="auto", progress=2.0, tau_min=3).rounds.auto.period.tau_max == 3
    assert CoCoDStrategy(tau=2, progress=2.0).tau == 2
    with pytest.raises(
        ValueError, match=r"^CoCoDStrategy: tau_min='x' is invalid; accepted: a positive integer$"
    ):
        CoCoDStrategy(tau="auto", progress=2.0, tau_min="x")


def test_auto_is_the_default_of_the_strategy_the_loop_and_fabric():
    import torch

    from lightning_cocod.fabric import CoCoDFabricStrategy
    from lightning_cocod.loop import CoCoD

    assert CoCoDStrategy().rounds.auto is not None and CoCoDStrategy().tau == SAFE_TAU_MAX
    assert CoCoDStrategy(tau=4).rounds.auto is None
    model = torch.nn.Linear(2, 2)
    loop = CoCoD(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loop.rounds.auto is not None and loop.tau == SAFE_TAU_MAX
    # Fabric's strategy="cocod" is this class with no options: its loop gets the same defaults.
    fabric = CoCoDFabricStrategy()
    assert (
        fabric.loop_class is CoCoD
        and fabric._weight is None
        and fabric._rounds.options() == loop.rounds.options()
    )


# A simulated link: 4 workers of a 408,074-parameter model (the time-to-accuracy study's CNN) on
# 100 Mbit/s each, steps of 50 ms. A round's communication is what the link takes to carry a ring
# all-reduce's share of the model, 2 (N - 1) / N of it, in the round's encoding, plus the codec's
# time, both worked out here from the encodings' definitions: fp32 4 bytes an element; int8 one
# byte an element and one fp32 scale per 2,048.
WORKERS, ELEMENTS, RATE, STEP, CODEC = 4, 408_074, 100e6, 0.05, 0.01
RING = 2 * (WORKERS - 1) / WORKERS


def simulated_rounds(rounds, encoded_bytes, codec_seconds, count=8, step=STEP):
    """``count`` rounds on the simulated clock: each takes the link's time, and whatever of it the
    round's ``tau`` steps do not cover is exposed; the rounds then consult tau="auto" as a merge does."""
    comm = RING * encoded_bytes * 8 / RATE + codec_seconds
    for i in range(count):
        exposed = max(0.0, comm - rounds.tau * step)
        rounds.comm_stats.add(RoundRecord(i, i + 1, comm, exposed, encoded_bytes, launched_at=10.0 * i))
        rounds._consult_auto([comm, step, 0.0, 1.0], None, 0, 0.0)  # untimed: one rank's figures
    return comm


def test_int8_rounds_settle_on_a_shorter_period_than_fp32_on_the_same_link(caplog):
    fp32 = CoCoDStrategy(tau="auto", tau_max=64).rounds
    int8 = CoCoDStrategy(tau="auto", tau_max=64, compression="int8").rounds
    with caplog.at_level("WARNING"):
        fp32_comm = simulated_rounds(fp32, 4 * ELEMENTS, 0.0)
        int8_comm = simulated_rounds(int8, ELEMENTS + 4 * -(-ELEMENTS // 2048), CODEC)
    # 0.196 s and 0.059 s of communication over 50 ms steps, with the rule's 20% margin.
    assert fp32.tau == math.ceil(1.2 * fp32_comm / STEP) == 5
    assert int8.tau == math.ceil(1.2 * int8_comm / STEP) == 2
    assert caplog.records == []  # a bound of 64 hides both: nothing to say


def test_a_hiding_period_beyond_tau_max_is_said_once_in_one_line_with_the_stats_figure(caplog):
    fp32 = CoCoDStrategy(tau="auto").rounds  # the default bound, 2
    int8 = CoCoDStrategy(tau="auto", compression="int8").rounds
    with caplog.at_level("WARNING", logger="lightning_cocod.rounds.auto"):
        simulated_rounds(int8, ELEMENTS + 4 * -(-ELEMENTS // 2048), CODEC)
        assert caplog.records == [] and int8.tau == 2  # int8 hides within the bound: no word
        simulated_rounds(fp32, 4 * ELEMENTS, 0.0, count=1)
        summary = fp32.comm_stats.summary()  # the run's figures when the warning is said
        simulated_rounds(fp32, 4 * ELEMENTS, 0.0, count=7)
    assert fp32.tau == SAFE_TAU_MAX
    [record] = caplog.records  # eight rounds, one line
    message = record.getMessage()
    assert "\n" not in message and "takes tau=5, above tau_max=2" in message
    # The exposure said is the stats' own: the round's 0.196 s less the two steps' 0.1 s.
    exposed, comm, share = summary["exposed_seconds"], summary["comm_seconds"], 1 - summary["hidden_fraction"]
    assert exposed == pytest.approx(0.196 - 0.1, abs=1e-3)
    assert (
        f"{exposed:.3f} s of the {comm:.3f} s of communication so far stayed exposed ({share:.0%})" in message
    )
    assert "compression='int8'" in message and "tau_max=5" in message and "Local-SGD" in message
    # Only rank 0 says it; the others see the same figures.
    other = CoCoDStrategy(tau="auto").rounds
    other.rank = 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="lightning_cocod.rounds.auto"):
        simulated_rounds(other, 4 * ELEMENTS, 0.0)
    assert caplog.records == []


def test_no_warning_when_nothing_stays_exposed(caplog):
    # 90 ms of communication over two 50 ms steps: the rule's 20% margin asks for tau=3, above the
    # bound, but the two steps cover the round: nothing is exposed, so there is nothing to say.
    rounds = CoCoDStrategy(tau="auto").rounds
    with caplog.at_level("WARNING", logger="lightning_cocod.rounds.auto"):
        simulated_rounds(rounds, 4 * ELEMENTS, 0.09 - RING * 4 * ELEMENTS * 8 / RATE)
    assert rounds.auto.period.hiding_period() == 3 > rounds.tau == 2
    assert rounds.comm_stats.summary()["exposed_seconds"] == 0.0 and caplog.records == []


def test_the_advice_never_names_a_setting_in_force(caplog):
    int8 = CoCoDStrategy(tau="auto", compression="int8").rounds
    bf16 = CoCoDStrategy(tau="auto", compression="bf16").rounds
    with caplog.at_level("WARNING", logger="lightning_cocod.rounds.auto"):
        simulated_rounds(int8, 4 * ELEMENTS, 0.0)  # a link too slow for int8 rounds at tau=2
        simulated_rounds(bf16, 4 * ELEMENTS, 0.0)
    int8_said, bf16_said = (r.getMessage() for r in caplog.records)
    assert "compression='int8' rounds" in int8_said and "send fewer bytes" not in int8_said
    assert "send fewer bytes (compression='int8')" in bf16_said
