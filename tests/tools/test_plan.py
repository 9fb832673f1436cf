"""The performance model against cases computed by hand, and the command around it.

The hand setting: 4 workers, a 4 MB model, 80 Mbit/s (10 MB/s) per node at full efficiency,
0.1 ms latency, 0.1 s of compute and 1 ms of a round's own work per step. A ring all-reduce
is 2 (N-1) = 6 hops, each of 0.1 ms plus a quarter of the model (1 MB, 0.1 s):
T = 6 x 0.1001 = 0.6006 s, and a tiny all-reduce t_0 = 6 x 0.1 ms = 0.6 ms.
"""

import math
import re
import subprocess
import sys

import pytest

from lightning_cocod.tools import costmodel, plan, plan_check
from lightning_cocod.tools.costmodel import (
    Setting,
    allreduce_seconds,
    auto_period,
    expected_max_of_normals,
    step_seconds,
)

HAND = Setting(
    step_seconds=0.1,
    model_bytes=4_000_000,
    workers=4,
    bandwidth_bps=80_000_000,
    latency_seconds=1e-4,
    round_seconds=0.001,
    efficiency=1.0,
)


def with_(**changes) -> Setting:
    from dataclasses import replace

    return replace(HAND, **changes)


@pytest.mark.timeout(10)
def test_ring_allreduce_on_per_node_links():
    assert allreduce_seconds(HAND) == pytest.approx(0.6006)
    assert allreduce_seconds(HAND, 0) == pytest.approx(0.0006)
    # 80% efficiency: the wire part takes 1/0.8 as long, the latency part does not change.
    assert allreduce_seconds(with_(efficiency=0.8)) == pytest.approx(0.0006 + 0.6 / 0.8)
    assert allreduce_seconds(with_(workers=1)) == 0.0


@pytest.mark.timeout(10)
def test_one_shared_link_carries_every_workers_traffic():
    # Each hop moves N chunks of S/N through the same pipe: S per hop, 0.4 s.
    assert allreduce_seconds(with_(topology="loopback")) == pytest.approx(6 * (1e-4 + 0.4))


@pytest.mark.timeout(10)
def test_a_full_bucket_sends_its_bytes_at_once():
    assert allreduce_seconds(with_(burst_bytes=100_000)) == pytest.approx(0.6006 - 0.01)
    # Never below the latency part.
    assert allreduce_seconds(with_(burst_bytes=10**9)) == pytest.approx(0.0006)


@pytest.mark.timeout(10)
def test_step_time_of_every_method_by_hand():
    assert step_seconds(HAND, "bound") == pytest.approx(0.1)
    assert step_seconds(HAND, "ssgd") == pytest.approx(0.1 + 0.6006 + 0.0006)
    assert step_seconds(with_(overlap=0.5), "ssgd") == pytest.approx(0.1 + (0.6006 - 0.05) + 0.0006)
    assert step_seconds(HAND, "pipe_sgd") == pytest.approx(0.6012)  # the link, not compute, sets the pace
    assert step_seconds(HAND, "local_sgd", 4) == pytest.approx(0.1 + (0.0006 + 0.6006 + 0.001) / 4)
    assert step_seconds(HAND, "cocod", 4) == pytest.approx((0.001 + 0.6012) / 4)  # 4 steps do not hide it
    assert step_seconds(HAND, "cocod", 8) == pytest.approx((0.001 + 0.8) / 8)  # 8 do
    with pytest.raises(ValueError, match="'adam' is not one of bound, ssgd"):
        step_seconds(HAND, "adam")


@pytest.mark.timeout(10)
def test_the_outer_round_hides_what_its_overlap_steps_cover():
    # tau=4, T + t_0 = 0.6012 s; (4 x 0.1 + 0.001 + max(0, 0.6012 - d x 0.1)) / 4 per step.
    blocking = 0.1 + (0.0006 + 0.6006 + 0.001) / 4  # Local-SGD's, written out
    assert step_seconds(HAND, "diloco", 4, 0) == pytest.approx(blocking)
    assert step_seconds(HAND, "diloco", 4) == pytest.approx(blocking)  # DiLoCo's default, d = 0
    assert step_seconds(HAND, "diloco", 4, 1) == pytest.approx((0.4 + 0.001 + 0.5012) / 4)
    assert step_seconds(HAND, "diloco", 4, 2) == pytest.approx((0.4 + 0.001 + 0.4012) / 4)
    # d = tau is CoCoD-SGD's round: (0.001 + 0.6012) / 4, as in the table above.
    assert step_seconds(HAND, "diloco", 4, 4) == pytest.approx((0.001 + 0.6012) / 4)
    assert step_seconds(HAND, "diloco", 4, 4) == pytest.approx(step_seconds(HAND, "cocod", 4))
    assert step_seconds(HAND, "diloco", 4, 0) == pytest.approx(step_seconds(HAND, "local_sgd", 4))
    # 7 of 8 steps hide the whole round (0.7 s >= 0.6012 s): only the round's own work is left.
    assert step_seconds(HAND, "diloco", 8, 7) == pytest.approx((0.8 + 0.001) / 8)
    # CoCoD-SGD with overlap=d is the same round; its default is the whole period.
    assert step_seconds(HAND, "cocod", 4, 1) == pytest.approx((0.4 + 0.001 + 0.5012) / 4)
    assert step_seconds(HAND, "cocod", 4, 0) == pytest.approx(blocking)
    assert costmodel.predict(HAND, "diloco", 4, overlap=1) == (pytest.approx(0.9022 / 4), 4)
    assert costmodel.predict(HAND, "cocod", 4) == (pytest.approx(0.6022 / 4), 4)


@pytest.mark.timeout(10)
def test_an_overlapped_rounds_jitter_is_paid_once_a_round():
    fast = with_(bandwidth_bps=80_000_000_000, workers=2, jitter=0.1)
    e2 = 1 / math.sqrt(math.pi)
    compute = 0.1 * (1 + 0.1 * e2 / 2)  # the slowest of two sums of 4 steps, per step
    t = allreduce_seconds(fast) + allreduce_seconds(fast, 0)
    assert step_seconds(fast, "diloco", 4, 0) == pytest.approx(compute + (t + 0.001) / 4)
    assert step_seconds(fast, "diloco", 4, 1) == pytest.approx((4 * compute + 0.001) / 4)  # one step hides t


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: step_seconds(HAND, "diloco", 4, 5),
            "overlap=5 is not understood; accepted: an integer from 0 to tau=4",
        ),
        (lambda: step_seconds(HAND, "diloco", 4, -1), "overlap=-1 is not understood"),
        (
            lambda: step_seconds(HAND, "local_sgd", 4, 1),
            "overlap=1 is the overlap of cocod, diloco's rounds; 'local_sgd' takes none",
        ),
        (lambda: costmodel.predict(HAND, "cocod", "auto", overlap=1), "overlap=1 needs a fixed period"),
    ],
)
def test_an_overlap_the_method_does_not_take_is_refused_in_one_line(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.timeout(10)
def test_auto_period_is_the_strategys_rule():
    # Hide: tau * 0.1 >= 1.2 * 0.6012 -> tau >= 7.21 -> 8; amortise: 0.001 <= 0.01 * tau * 0.1 -> 1.
    assert auto_period(HAND, tau_max=64) == 8
    # 10 GB/s: T = 6 x 0.2 ms, hiding needs 1 step, but 5 ms of own work needs 5 steps to be 1%.
    assert auto_period(with_(bandwidth_bps=80_000_000_000, round_seconds=0.005), tau_max=64) == 5
    assert costmodel.predict(HAND, "cocod", "auto", tau_max=64) == (pytest.approx((0.001 + 0.8) / 8), 8)


@pytest.mark.timeout(10)
def test_auto_keeps_to_the_strategys_default_bound_of_two():
    # The rule asks for 8 (above) and 5; CoCoDStrategy(tau="auto") stops at 2, where two steps of
    # 0.1 s hide a third of the 0.6012 s all-reduce: (0.001 + 0.6012) / 2 per step.
    assert auto_period(HAND) == 2
    assert auto_period(with_(bandwidth_bps=80_000_000_000, round_seconds=0.005)) == 2
    assert costmodel.predict(HAND, "cocod", "auto") == (pytest.approx(0.6022 / 2), 2)
    # A bound of 1 passed in: every step pays the whole round, 0.001 + 0.6012.
    assert costmodel.predict(HAND, "cocod", "auto", tau_max=1) == (pytest.approx(0.6022), 1)


@pytest.mark.timeout(10)
def test_expected_maximum_of_normals_matches_closed_forms():
    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_of_normals(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    assert expected_max_of_normals(5) == pytest.approx(
        1.162964, abs=1e-5
    )  # tables of normal order statistics


@pytest.mark.timeout(10)
def test_jitter_is_paid_every_step_by_ssgd_and_once_a_round_by_cocod():
    fast = with_(bandwidth_bps=80_000_000_000, workers=2, jitter=0.1)  # communication almost free
    e2 = 1 / math.sqrt(math.pi)
    t_ar, t_0 = allreduce_seconds(fast), allreduce_seconds(fast, 0)
    assert step_seconds(fast, "ssgd") == pytest.approx(0.1 * (1 + 0.1 * e2) + t_ar + t_0)
    # The slowest of two sums of 4 steps: sigma * sqrt(4) * e2 over 4 steps.
    assert step_seconds(fast, "cocod", 4) == pytest.approx((0.001 + 4 * 0.1 * (1 + 0.1 * e2 / 2)) / 4)


def _bench_figures(comm_seconds_per_round: float) -> dict:
    """A cocod-bench output at the hand setting (small_cnn: no S-SGD overlap)."""
    methods = {
        "S-SGD": {"method": "ssgd", "tau": None, "taus": None, "step_seconds": 0.9},
        "Local-SGD tau=4": {
            "method": "local_sgd",
            "tau": 4,
            "taus": [4],
            "step_seconds": 0.3,
            "comm_seconds_per_round": comm_seconds_per_round,
        },
        "CoCoD-SGD tau=auto": {"method": "cocod", "tau": "auto", "taus": [4, 8], "step_seconds": 0.12},
    }
    return {
        "args": {"rate_bps": [80_000_000], "topology": "pernode", "model": "small_cnn"},
        "link": {"round_trip_seconds": 2e-4},
        "workers": {
            "4": {
                "bound": {"step_seconds": 0.1, "model_bytes": 4_000_000},
                "methods": {name: {"80000000": f} for name, f in methods.items()},
            }
        },
    }


@pytest.mark.timeout(10)
def test_validation_calibrates_on_one_allreduce_and_predicts_every_run():
    # The per-node bucket at 80 Mbit/s: 4 ms of the rate, 40 kB. At 80% efficiency the
    # all-reduce is 0.6 ms + (6 MB - 40 kB) / (0.8 x 10 MB/s) = 0.7456 s.
    figures = _bench_figures(0.0006 + 5.96e6 / 8e6)
    latency, efficiency, how = plan_check.calibrate(figures)
    assert latency == pytest.approx(1e-4) and efficiency == pytest.approx(0.8)
    assert "Local-SGD tau=4" in how and "4 workers" in how
    rows = {r["method"]: r for r in plan_check.validate(figures)}
    t_ar, round_seconds = 0.7456, 4e6 / 1.5e9  # a CPU worker's round
    assert rows["S-SGD"]["predicted"] == pytest.approx(0.1 + t_ar + 0.0006)
    assert rows["S-SGD"]["error"] == pytest.approx((0.1 + t_ar + 0.0006) / 0.9 - 1)
    assert rows["Local-SGD tau=4"]["predicted"] == pytest.approx(0.1 + (0.0006 + t_ar + round_seconds) / 4)
    # tau="auto" of a run that recorded no bound (cocod-bench before --tau-max): the strategy's
    # default, 2, where two steps of 0.1 s leave most of the 0.7462 s all-reduce exposed.
    auto = rows["CoCoD-SGD tau=auto"]
    assert auto["period"] == 2 and auto["predicted"] == pytest.approx((round_seconds + 0.7462) / 2)
    # Such runs had the old default, 64: hide 1.2 x 0.7462 / 0.1 -> 9; amortise 2.7 ms / 1 ms -> 3.
    rows = {r["method"]: r for r in plan_check.validate(figures, tau_max=64)}
    auto = rows["CoCoD-SGD tau=auto"]
    assert auto["period"] == 9 and auto["predicted"] == pytest.approx((round_seconds + 0.9) / 9)
    table = plan_check.validation_table(list(rows.values()))
    assert "CoCoD-SGD tau=auto" in table and "9 / 4, 8" in table and "efficiency 0.800" in table


@pytest.mark.timeout(10)
def test_validation_predicts_an_overlapped_round_with_the_overlap_the_run_had():
    figures = _bench_figures(0.0006 + 5.96e6 / 8e6)  # an all-reduce of 0.7462 s, as above
    runs = figures["workers"]["4"]["methods"]
    for name, overlap in (("DiLoCo tau=4", None), ("DiLoCo tau=4 overlap 1", 1.0)):  # 1.0: a median
        runs[name] = {"80000000": {"method": "diloco", "tau": 4, "overlap": overlap, "step_seconds": 0.25}}
    rows = {r["method"]: r for r in plan_check.validate(figures)}
    round_seconds = 4e6 / 1.5e9
    assert rows["DiLoCo tau=4"]["predicted"] == pytest.approx(0.1 + (0.7462 + round_seconds) / 4)
    assert rows["DiLoCo tau=4 overlap 1"]["predicted"] == pytest.approx(
        (0.4 + round_seconds + 0.7462 - 0.1) / 4
    )


@pytest.mark.timeout(10)
def test_validation_predicts_auto_with_the_bound_the_run_recorded():
    figures = _bench_figures(0.0006 + 5.96e6 / 8e6)  # an all-reduce of 0.7462 s, as above
    auto = figures["workers"]["4"]["methods"]["CoCoD-SGD tau=auto"]["80000000"]
    auto["tau_max"] = 64.0  # the median over two passes of 64
    assert {r["method"]: r["period"] for r in plan_check.validate(figures)}["CoCoD-SGD tau=auto"] == 9
    auto["tau_max"] = 2
    assert {r["method"]: r["period"] for r in plan_check.validate(figures)}["CoCoD-SGD tau=auto"] == 2
    with pytest.raises(ValueError, match="recorded tau_max 2, --tau-max 64 contradicts it"):
        plan_check.validate(figures, tau_max=64)


@pytest.mark.timeout(10)
def test_without_a_measured_allreduce_the_nominal_efficiency_is_used():
    figures = _bench_figures(None)
    assert plan_check.calibrate(figures)[1:] == (
        costmodel.EFFICIENCY,
        "nominal: no Local-SGD all-reduce was measured",
    )


# --- the command --------------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_the_command_prints_every_method_and_a_period(capsys):
    assert (
        plan.main(
            [
                "--workers",
                "16,64",
                "--bandwidth",
                "10gbit",
                "--latency",
                "50us",
                "--model",
                "resnet18",
                "--step-ms",
                "60",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in (
        "compute only",
        "S-SGD",
        "Pipe-SGD",
        "Local-SGD tau=4",
        "CoCoD-SGD tau=4",
        "CoCoD-SGD tau=auto",
    ):
        assert out.count(f"| {name}") == 2  # one table per worker count
    # 64 workers, by hand: T = 126 x (50 us + 44.73 MB / 64 / (0.956 x 1.25 GB/s)) = 80.0 ms,
    # t_0 = 6.3 ms; hide: 1.2 x 86.3 / 60 -> 2; a GPU round (0.89 ms) within 1%: 0.89 / 0.6 -> 2.
    sixty_four = out.split("64 workers")[1]
    assert "recommended: CoCoD-SGD tau=2 " in sixty_four and "the all-reduce takes 80.0 ms" in sixty_four
    # The default bound, 2, is the hiding period: auto settles there, at no cost in accuracy.
    assert 'tau="auto" with tau_max 2 settles there' in sixty_four and "cost in accuracy" not in sixty_four
    # With a bound of 1, auto stops short of hiding the round and the line says what to raise it to.
    argv = ["--workers", "64", "--bandwidth", "10gbit", "--latency", "50us", "--model", "resnet18"]
    assert plan.main([*argv, "--step-ms", "60", "--tau-max", "1"]) == 0
    lowered = capsys.readouterr().out
    assert 'tau="auto" stays at or below 1 unless strategy.tau_max is raised to 2' in lowered


@pytest.mark.timeout(10)
def test_the_recommendation_gives_the_hiding_period_and_what_auto_does_with_it(capsys):
    # 64 workers at 1 Gbit/s, by hand: T = 126 x (50 us + 44.73 MB / 64 / (0.956 x 125 MB/s))
    # = 743.0 ms, t_0 = 6.3 ms; hide: 1.2 x 749.3 / 60 -> 15. At the default bound, 2:
    # (0.89 + 749.3) / 2 = 375.1 ms per step.
    argv = ["--workers", "64", "--bandwidth", "1gbit", "--latency", "50us", "--model", "resnet18"]
    argv += ["--step-ms", "60"]
    assert plan.main(argv) == 0
    out = capsys.readouterr().out
    assert "| CoCoD-SGD tau=auto (2, tau_max 2) | 375.1 " in out
    assert "recommended: CoCoD-SGD tau=15 " in out and "the all-reduce takes 743.0 ms" in out
    assert 'tau="auto" stays at or below 2 unless strategy.tau_max is raised to 15' in out
    assert "the accuracy studies (docs/accuracy/) show what periods above 2 cost in accuracy" in out
    # Raised to the old default, auto reaches the hiding period: (0.89 + 15 x 60) / 15 = 60.1 ms.
    assert plan.main([*argv, "--tau-max", "64"]) == 0
    out = capsys.readouterr().out
    assert "| CoCoD-SGD tau=auto (15, tau_max 64) | 60.1 " in out
    assert "recommended: CoCoD-SGD tau=15 " in out and 'tau="auto" with tau_max 64 settles there' in out
    assert "cost in accuracy" in out
    # A bound between: auto stops at it, and the line names the period to raise it to.
    assert plan.main([*argv, "--tau-max", "8"]) == 0
    assert 'tau="auto" stays at or below 8 unless strategy.tau_max is raised to 15' in capsys.readouterr().out


@pytest.mark.timeout(10)
def test_the_command_shows_diloco_overlapped_with_its_last_steps(capsys):
    # The hand setting: T + t_0 = 600.6 + 0.6 ms, 100 ms a step, 2 ms of a round's own work, tau 4.
    hand = ["--workers", "4", "--bandwidth", "80mbit", "--latency", "100us", "--model-bytes", "4000000"]
    hand += ["--step-ms", "100", "--round-ms", "2", "--efficiency", "1"]

    def step_ms(argv: list[str]) -> dict[str, str]:
        assert plan.main(argv) == 0
        rows = [line.strip(" |").split("|") for line in capsys.readouterr().out.splitlines()]
        return {row[0].strip(): row[1].strip() for row in rows if len(row) == 4}

    # The default row, d = 1: (4 x 100 + 2 + 601.2 - 100) / 4 = 225.8 ms.
    assert step_ms(hand)["DiLoCo tau=4 overlap 1"] == "225.8"
    rows = step_ms([*hand, "--overlap-steps", "0,4,2"])
    # d = 0: 100 + (0.6 + 600.6 + 2) / 4, Local-SGD's; d = 2: (400 + 2 + 401.2) / 4; d = 4:
    # (400 + 2 + 201.2) / 4, CoCoD-SGD's.
    assert rows["DiLoCo tau=4 overlap 0"] == rows["Local-SGD tau=4"] == "250.8"
    assert rows["DiLoCo tau=4 overlap 2"] == "200.8"
    assert rows["DiLoCo tau=4 overlap 4"] == rows["CoCoD-SGD tau=4"] == "150.8"
    assert "DiLoCo tau=4 overlap 1" not in rows
    assert not [name for name in step_ms([*hand, "--overlap-steps", "none"]) if "overlap" in name]
    # The command docs/performance.md shows: 64 workers at 1 Gbit/s, T + t_0 = 749.3 ms (as in the
    # recommendation's test), a GPU round of 0.89 ms, 60 ms a step, tau 8:
    # (480 + 0.89 + 749.3 - 60 d) / 8 = 146.3, 138.8 and 123.8 ms for d = 1, 2, 4.
    rows = step_ms(
        [
            "--workers",
            "64",
            "--bandwidth",
            "1gbit",
            "--step-ms",
            "60",
            "--tau",
            "8",
            "--overlap-steps",
            "1,2,4",
        ]
    )
    assert [rows[f"DiLoCo tau=8 overlap {d}"] for d in (1, 2, 4)] == ["146.3", "138.8", "123.8"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--step-ms", "60", "--overlap-steps", "5"],
            "--overlap-steps 5 is not understood; accepted: steps from 0 to --tau (4), comma-separated",
        ),
        (["--step-ms", "60", "--overlap-steps", "x"], "--overlap-steps 'x' is not understood; accepted: "),
        (["--bandwidth", "10 gbit", "--step-ms", "60"], "rate '10 gbit' is not understood; accepted: "),
        (["--bandwidth", "10GB", "--step-ms", "60"], "e.g. 100mbit, 100Mbps, 1.5gbit, 10Gbps, or 'none'"),
        (["--bandwidth", "none", "--step-ms", "60"], "a plan needs a finite rate"),
        (["--latency", "5 us", "--step-ms", "60"], "latency '5 us' is not understood"),
        (["--workers", "1", "--step-ms", "60"], "--workers '1' is not understood"),
        (["--workers", "x", "--step-ms", "60"], "--workers 'x' is not understood: give counts of at least 2"),
        ([], "--step-ms (compute per step, ms) is required"),
        (["--step-ms", "60", "--jitter", "2"], "--jitter is a coefficient of variation"),
        (
            ["--step-ms", "60", "--tau-max", "0"],
            '--tau-max must be at least 1 (the longest period of tau="auto")',
        ),
        (["--validate", "bench.json", "--tau-max", "-1"], "--tau-max must be at least 1"),
        (["--step-ms", "60", "--tau-max", "2.5"], "argument --tau-max: invalid int value: '2.5'"),
    ],
)
def test_bad_input_is_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        plan.main(argv)
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text, bits_per_second",
    [
        ("10gbit", "10gbit"),
        ("10Gbit", "10gbit"),
        ("10Gbps", "10gbit"),
        ("10gbps", "10gbit"),
        ("100mbit", "100mbit"),
        ("100Mbps", "100mbit"),
        ("1.5gbit", "1.5gbit"),
        ("500KBPS", "500kbit"),
    ],
)
def test_link_rates_take_the_usual_spellings_all_in_bits_per_second(text, bits_per_second, capsys):
    assert plan.main(["--workers", "16", "--step-ms", "60", "--bandwidth", text]) == 0
    assert f", {bits_per_second} per node (pernode)," in capsys.readouterr().out


@pytest.mark.timeout(10)
def test_help_shows_every_default_and_the_required_step_time(capsys):
    with pytest.raises(SystemExit) as info:
        plan.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    defaults = ["16", "10gbit", "50us", "resnet18", "4", "0.0", "gpu", "0.956", "pernode"]
    for default in defaults:
        assert f"(default: {default}" in text
    assert "required, unless --validate: --step-ms" in text


@pytest.mark.timeout(10)
def test_a_missing_benchmark_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"cannot validate against .*nothing.json: FileNotFoundError"):
        plan.main(["--validate", str(tmp_path / "nothing.json")])


@pytest.mark.timeout(60)
def test_the_model_imports_no_torch_of_its_own():
    """Whatever its package imports, the command (plan.py, with costmodel.py and plan_check.py) adds
    neither torch nor Lightning nor numpy."""
    code = (
        "import sys\n"
        "import lightning_cocod.core.adapt, lightning_cocod.launch.cluster, lightning_cocod.launch.netns\n"
        "before = set(sys.modules)\n"
        "import lightning_cocod.tools.plan\n"
        "heavy = {'torch', 'pytorch_lightning', 'lightning', 'numpy', 'matplotlib'}\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(60)
def test_cocod_plan_answers_without_loading_torch():
    """The command is cheap because it is arithmetic: the whole process, package and command
    together, never loads torch, Lightning, numpy or matplotlib (asserted, not timed)."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['cocod-plan', '--workers', '64', '--bandwidth', '10gbit', '--latency', '50us',\n"
        "            '--model', 'resnet18', '--step-ms', '60']\n"
        "try:\n"
        "    runpy.run_module('lightning_cocod.tools.plan', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code in (0, None), exit.code\n"
        "heavy = {'torch', 'pytorch_lightning', 'lightning', 'numpy', 'matplotlib'}\n"
        "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert "recommended: CoCoD-SGD tau=2 " in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


# --- compressed rounds ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_bytes_per_element_are_the_codecs_payloads():
    from lightning_cocod.core.compress import make_codec

    elements = 2048 * 1000  # whole int8 blocks: one fp32 scale each
    for name in ("bf16", "int8"):
        assert costmodel.BYTES_PER_ELEMENT[name] == make_codec(name).payload_bytes(elements) / elements
    assert costmodel.BYTES_PER_ELEMENT[None] == 4 and costmodel.BYTES_PER_ELEMENT["int8"] == 1 + 4 / 2048


# HAND in int8 at 10 ns an element a round: the wire carries 1e6 x (1 + 4/2048) = 1,001,953 bytes,
# T = 6 x (0.1 ms + 250,488 B / 10 MB/s) = 150.9 ms, and the codec 1e6 x 10 ns = 10 ms.
INT8_T = 6 * (1e-4 + 1e6 * (1 + 4 / 2048) / 4 / 1e7)


@pytest.mark.timeout(10)
def test_a_compressed_round_carries_its_codecs_bytes_and_takes_its_codecs_time():
    int8 = costmodel.with_codec(HAND, "int8", 10e-9)
    assert allreduce_seconds(int8) == pytest.approx(INT8_T) and int8.codec_seconds == pytest.approx(0.01)
    assert allreduce_seconds(costmodel.with_codec(HAND, "bf16")) == pytest.approx(6 * (1e-4 + 0.05))
    # tau=1: nothing hides the round; tau=2: 0.2 s of compute hide 150.9 + 10 + 0.6 ms.
    assert step_seconds(int8, "cocod", 1) == pytest.approx(0.001 + INT8_T + 0.01 + 0.0006)
    assert step_seconds(int8, "cocod", 2) == pytest.approx((0.001 + 0.2) / 2)
    assert step_seconds(int8, "local_sgd", 4) == pytest.approx(0.1 + (0.0006 + INT8_T + 0.01 + 0.001) / 4)
    # The rule sees the codec inside the round's time, as the strategy measures it: 1.2 x 161.5 ms
    # needs 2 steps of 0.1 s; fp32's 601.2 ms needs 8.
    assert auto_period(int8, tau_max=64) == 2 and auto_period(HAND, tau_max=64) == 8
    with pytest.raises(ValueError, match="codec 'int4' is not modelled; accepted: None, bf16, fp16, int8"):
        costmodel.with_codec(HAND, "int4")


@pytest.mark.timeout(10)
def test_the_command_gives_the_period_that_hides_a_compressed_round(capsys):
    argv = [
        "--workers",
        "4",
        "--model-bytes",
        "4000000",
        "--bandwidth",
        "80mbit",
        "--latency",
        "100us",
        "--efficiency",
        "1",
        "--step-ms",
        "100",
        "--round-ms",
        "1",
        "--tau-max",
        "64",
    ]
    assert plan.main([*argv, "--compression", "int8,bf16", "--codec-ns", "int8=10"]) == 0
    out = re.sub(" +", " ", capsys.readouterr().out)  # the table's cells without their padding
    assert "recommended: CoCoD-SGD tau=8 " in out  # fp32, as before
    assert (
        "with int8 rounds (1.00195 bytes an element, against fp32's 4): CoCoD-SGD tau=2 hides the round: "
        in out
    )
    assert (
        f"the round takes {1e3 * INT8_T:.1f} ms on the wire and 10.0 ms in the codec (5.0% of the period's"
        in out
    )
    # bf16: T = 6 x (0.1 ms + 0.05 s) = 300.6 ms, no codec cost given: 1.2 x 301.2 / 100 -> 4.
    assert "with bf16 rounds (2 bytes an element, against fp32's 4): CoCoD-SGD tau=4 hides" in out
    assert f"| CoCoD-SGD tau=4 int8 | {1e3 * (0.001 + 0.4) / 4:.1f} " in out
    assert f"| Local-SGD tau=4 bf16 | {1e3 * (0.1 + (0.0006 + 0.3006 + 0.001) / 4):.1f} " in out
    assert "| CoCoD-SGD tau=auto int8 (2, tau_max 64) |" in out
    # One figure prices every codec.
    assert plan.main([*argv, "--compression", "bf16", "--codec-ns", "10"]) == 0
    assert "300.6 ms on the wire and 10.0 ms in the codec" in capsys.readouterr().out


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--compression", "int4"],
            "--compression 'int4' is not understood; accepted: bf16, int8, comma-separated",
        ),
        (
            ["--compression", "int8", "--codec-ns", "int8=-1"],
            "--codec-ns 'int8=-1' is not understood; accepted: ",
        ),
        (["--compression", "int8", "--codec-ns", "fp16=3"], "(e.g. int8=40,bf16=20; codecs: bf16, int8)"),
        (
            ["--compression", "int8", "--codec-ns", "bf16=3"],
            "--codec-ns names bf16, not in --compression int8",
        ),
        (["--codec-ns", "3"], "--codec-ns prices a codec's rounds: give --compression too"),
    ],
)
def test_bad_codec_options_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        plan.main(["--step-ms", "60", *argv])
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]
    with pytest.raises(SystemExit):
        plan.main(["--validate", "bench.json", "--compression", "int8"])
    assert "are read from the benchmark with --validate" in capsys.readouterr().err


@pytest.mark.timeout(10)
def test_validation_predicts_compressed_runs_with_their_own_codec_time():
    figures = _bench_figures(0.0006 + 5.96e6 / 8e6)  # calibrated as above: efficiency 0.8, 40 kB bucket
    methods = figures["workers"]["4"]["methods"]
    methods["CoCoD-SGD tau=1 int8"] = {
        "80000000": {
            "method": "cocod",
            "tau": 1,
            "taus": [1],
            "step_seconds": 0.2,
            "compression": "int8",
            "codec_seconds_per_round": 0.01,
            "comm_seconds_per_round": 0.19,
            "bytes_sent_per_round": 1.5e6,
        }
    }
    # A compressed Local-SGD round does not calibrate the link (its time is not fp32's).
    methods["Local-SGD tau=4 int8"] = {
        "80000000": {
            "method": "local_sgd",
            "tau": 4,
            "taus": [4],
            "step_seconds": 0.15,
            "compression": "int8",
            "codec_seconds_per_round": 0.01,
            "comm_seconds_per_round": 0.01,
        }
    }
    figures["workers"]["4"]["methods"] = {
        "Local-SGD tau=4 int8": methods.pop("Local-SGD tau=4 int8"),
        **methods,
    }
    methods = figures["workers"]["4"]["methods"]
    methods["S-SGD +bf16 hook"] = {
        "80000000": {"method": "ssgd", "tau": None, "taus": None, "step_seconds": 0.5, "comm_hook": "bf16"}
    }
    methods["S-SGD +PowerSGD rank 1"] = {
        "80000000": {
            "method": "ssgd",
            "tau": None,
            "taus": None,
            "step_seconds": 0.3,
            "comm_hook": "powersgd",
        }
    }
    assert plan_check.calibrate(figures)[1] == pytest.approx(0.8)
    rows = {r["method"]: r for r in plan_check.validate(figures)}
    wire = 6 * 1e6 * (1 + 4 / 2048) / 4  # bytes over the 4 links' hops
    t_int8 = 0.0006 + (wire - 40_000) / 8e6
    round_seconds = 4e6 / 1.5e9
    int8 = rows["CoCoD-SGD tau=1 int8"]
    assert int8["predicted"] == pytest.approx(round_seconds + t_int8 + 0.01 + 0.0006)
    assert int8["allreduce"] == [0.19, pytest.approx(t_int8 + 0.01)]
    assert int8["bytes_sent"] == [1.5e6, pytest.approx(1.5 * 1e6 * (1 + 4 / 2048))]
    assert rows["S-SGD +bf16 hook"]["predicted"] == pytest.approx(
        0.1 + 0.0006 + (3e6 - 40_000) / 8e6 + 0.0006
    )
    assert rows["S-SGD +PowerSGD rank 1"]["predicted"] is None
    table = plan_check.validation_table(list(rows.values()))
    assert "not modelled (powersgd: its bytes follow the layers' shapes)" in table
    assert "1.50 / 1.50" in table and "of 6 step times within 15%" in table
