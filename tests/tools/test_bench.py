"""The benchmark's arithmetic on made-up runs whose answers are known by construction."""

import pytest

from lightning_cocod.tools.bench import combine, ratio, round_ends, summarize


def rank_result(step_seconds: list[float], rounds=(), comm=None, rss=100, model_bytes=10) -> dict:
    ends, t = [], 0.0
    for seconds in step_seconds:
        t += seconds
        ends.append(t)
    return {
        "step_ends": ends,
        "rounds": [list(r) for r in rounds],
        "comm": comm,
        "peak_rss_bytes": rss,
        "model_bytes": model_bytes,
        "buffer_bytes": 2 * model_bytes,
    }


def test_a_run_takes_as_long_as_its_slowest_rank():
    fast, slow = rank_result([1.0] * 10, rss=100), rank_result([1.2] * 10, rss=130)
    figures = summarize([fast, slow], warmup=2, periodic=False)
    assert figures["step_seconds"] == pytest.approx(1.2)
    assert figures["step_seconds_per_rank"] == pytest.approx([1.0, 1.2])
    assert figures["peak_rss_bytes"] == 130 and figures["buffer_copies"] == 2


def test_a_lag_from_the_warm_up_is_not_charged_to_the_steady_state():
    # Rank 0 is slow during the 2 warm-up steps; rank 1 then waits 4 s for it at its third step.
    # After the warm-up both finish every step together, 1 s apart: the run's pace is 1 s/step,
    # although rank 1 alone spent 10 s on its last 6 steps.
    lagging, waiting = rank_result([3, 3, 1, 1, 1, 1, 1, 1]), rank_result([1, 1, 5, 1, 1, 1, 1, 1])
    figures = summarize([lagging, waiting], warmup=2, periodic=False)
    assert figures["step_seconds"] == pytest.approx(1.0)
    assert figures["step_seconds_per_rank"] == pytest.approx([1.0, 10 / 6])


def test_periodic_step_time_spans_whole_rounds_so_the_round_end_wait_counts():
    # tau=4: steps 1-3 take 1 s, the fourth (the round's last, with the wait) 3 s.
    steps = [1.0, 1.0, 1.0, 3.0] * 4
    rounds = [(0, 4, 2.0, 0.0), (4, 8, 2.0, 2.0), (8, 12, 2.0, 2.0), (12, 16, 2.0, 2.0)]
    comm = {"exposed_seconds": 6.0, "hidden_fraction": 0.25}
    figures = summarize([rank_result(steps, rounds, comm)] * 2, warmup=4, periodic=True)
    assert figures["step_seconds"] == pytest.approx(6.0 / 4)
    assert figures["exposed_seconds_per_step"] == pytest.approx(6.0 / 16)


def test_a_partial_last_round_is_not_a_round_end():
    result = {"rounds": [(0, 4), (4, 8), (8, 10)], "tau_history": [(0, 4)]}
    assert round_ends(result) == [4, 8]


def one_pass(bound: float, ssgd: float, cocod: float) -> dict:
    methods = {"S-SGD": {"1": {"step_seconds": ssgd}}, "CoCoD": {"1": {"step_seconds": cocod}}}
    for by_rate in methods.values():
        f = by_rate["1"]
        f["vs_bound"], f["vs_ssgd"] = f["step_seconds"] / bound, ssgd / f["step_seconds"]
    return {"bound": {"step_seconds": bound, "tau_history": None}, "methods": methods}


def test_ratios_are_formed_within_a_pass_then_medianed():
    # The machine runs 2x slower in the second pass: a ratio of medians would mix the passes,
    # the median of per-pass ratios does not.
    passes = [one_pass(1.0, 3.0, 1.05), one_pass(2.0, 6.0, 2.1), one_pass(1.0, 3.0, 1.2)]
    figures = combine(passes)
    cocod = figures["methods"]["CoCoD"]["1"]
    assert cocod["vs_bound"] == pytest.approx(1.05)
    assert cocod["vs_bound_range"] == pytest.approx([1.05, 1.2])
    assert cocod["vs_ssgd"] == pytest.approx(3.0 / 1.05)
    assert cocod["step_seconds"] == pytest.approx(1.2)  # the median of 1.05, 2.1, 1.2
    assert figures["bound"]["step_seconds"] == pytest.approx(1.0)
    assert ratio(cocod, "vs_bound") == "1.05x (1.05-1.20)"


def test_one_pass_has_no_range():
    figures = combine([one_pass(1.0, 3.0, 1.5)])
    cocod = figures["methods"]["CoCoD"]["1"]
    assert "vs_bound_range" not in cocod
    assert ratio(cocod, "vs_bound") == "1.50x" and ratio(cocod, "vs_ssgd") == "2.00x"
    assert ratio({"vs_ssgd": None}, "vs_ssgd") == "n/a"


def test_a_pass_measures_the_bound_between_runs_and_divides_by_their_median(monkeypatch, tmp_path):
    from lightning_cocod.tools import bench

    bound_steps = iter([1.0, 1.0, 3.0, 1.2])  # one slow outlier; the median (1.1) ignores it
    calls = []

    def fake_run_method(spec, workers, rate, out, timeout_s=0, suffix="", topology="loopback", latency=None):
        calls.append(spec["method"] + (f"-{spec['tau']}" if spec["method"] == "cocod" else ""))
        if spec["method"] == "bound":
            return [rank_result([next(bound_steps)] * 12)] * workers
        if spec["method"] == "ssgd":
            return [rank_result([3.3] * 12)] * workers
        if spec["tau"] == 4:
            rounds = [(k, k + 4, 1.0, 0.0) for k in range(0, 12, 4)]
            return [
                rank_result([1.21] * 12, rounds, {"exposed_seconds": 0.0, "hidden_fraction": 1.0})
            ] * workers
        return [rank_result([1.1] * 12)] * workers  # the overhead run: no round completes

    monkeypatch.setattr(bench, "run_method", fake_run_method)
    args = bench.parse_args(
        ["--methods", "ssgd,cocod", "--steps", "12", "--warmup", "4", "--rates", "300mbit"]
    )
    figures = bench.measure(args, {"tau": 4}, tmp_path)

    assert calls == ["bound", "cocod-13", "bound", "ssgd", "bound", "cocod-4", "bound"]
    assert figures["bound"]["step_seconds"] == pytest.approx(1.1)
    assert figures["overhead"]["vs_bound"] == pytest.approx(1.0)
    ssgd, cocod = (figures["methods"][name][str(300_000_000)] for name in ("S-SGD", "CoCoD-SGD tau=4"))
    assert ssgd["vs_bound"] == pytest.approx(3.0) and cocod["vs_bound"] == pytest.approx(1.1)
    assert cocod["vs_ssgd"] == pytest.approx(3.3 / 1.21) and ssgd["vs_ssgd"] == pytest.approx(1.0)


# --- several worker counts, per-node links, and what the performance model needs -----------------


def test_worker_counts_are_read_sorted_and_checked():
    from lightning_cocod.tools.bench import parse_worker_counts

    assert parse_worker_counts("8,2,4,4") == [2, 4, 8]
    assert parse_worker_counts("2") == [2]
    for bad in ("1", "2,x", "", "-2"):
        with pytest.raises(ValueError, match="give counts of at least 2"):
            parse_worker_counts(bad)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "2,4", "--slowdown", "1,2"], "--slowdown gives one factor per rank"),
        (["--latency", "fast"], "latency 'fast' is not understood"),
        (["--topology", "mesh"], "invalid choice: 'mesh'"),
        (["--width", "8"], "--width 8 is not understood: a positive width of --model small_cnn only"),
        (["--bound-every", "0"], "--bound-every must be at least 1"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message, capsys):
    from lightning_cocod.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


def test_summary_keeps_the_jitter_the_allreduce_time_and_the_periods():
    # Two ranks, warm-up 2: steps after it take 1, 3 and 1, 3 s: mean 2, population std 1.
    a, b = rank_result([9, 9, 1, 3]), rank_result([9, 9, 1, 3])
    a["rounds"] = [[0, 2, 5.0, 0.0], [2, 4, 0.4, 0.0]]  # the warm-up's round is not counted
    b["rounds"] = [[0, 2, 5.0, 0.0], [2, 4, 0.6, 0.0]]
    a["tau_history"] = b["tau_history"] = [[0, 4], [1, 2], [3, 1]]
    figures = summarize([a, b], warmup=2, periodic=False)
    assert figures["step_cv"] == pytest.approx(0.5)
    assert figures["comm_seconds_per_round"] == pytest.approx(0.5)
    assert figures["taus"] == [2, 1]  # in force when the warm-up ended, then each change


def test_runs_go_over_the_topology_asked_for_and_bounds_every_few_runs(monkeypatch, tmp_path):
    from lightning_cocod.tools import bench

    calls = []

    def fake_run_method(spec, workers, rate, out, timeout_s=0, suffix="", topology="loopback", latency=None):
        calls.append((spec["method"], workers, rate, topology, latency))
        return [rank_result([1.0 if spec["method"] == "bound" else 2.0] * 12)] * workers

    monkeypatch.setattr(bench, "run_method", fake_run_method)
    args = bench.parse_args(
        [
            "--methods",
            "ssgd,pipe_sgd",
            "--rates",
            "10mbit,50mbit",
            "--steps",
            "12",
            "--warmup",
            "4",
            "--workers",
            "2,4",
            "--topology",
            "pernode",
            "--bound-every",
            "2",
            "--no-overhead",
        ]
    )
    figures = bench.measure(args, {"tau": 4}, tmp_path, workers=4)
    # Bounds (no process group, so no links) before the first run, then after every second.
    assert [c[0] for c in calls] == ["bound", "ssgd", "pipe_sgd", "bound", "ssgd", "pipe_sgd", "bound"]
    assert all(c[1] == 4 for c in calls)
    assert {c[2:] for c in calls if c[0] != "bound"} == {
        ("10mbit", "pernode", None),
        ("50mbit", "pernode", None),
    }
    assert {c[2:] for c in calls if c[0] == "bound"} == {(None, "loopback", None)}
    ssgd = figures["methods"]["S-SGD"][str(10_000_000)]
    assert ssgd["method"] == "ssgd" and ssgd["tau"] is None and ssgd["vs_bound"] == pytest.approx(2.0)


def test_unshaped_runs_have_no_rate_plot_and_gpu_runs_default_to_unshaped(tmp_path):
    from lightning_cocod.tools import bench

    assert (
        bench.plot({"methods": {}, "bound": {"step_seconds": 1.0}}, [None], tmp_path / "p.png", "t") is False
    )
    assert not (tmp_path / "p.png").exists()
    assert bench.parse_args(["--accelerator", "gpu"]).rate_list == ["none"]
    assert bench.parse_args([]).rate_list == ["300mbit"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--one-device"])


# --- the bound of tau="auto" ----------------------------------------------------------------------


def test_tau_max_bounds_every_cocod_auto_method_and_names_itself(monkeypatch, tmp_path):
    from lightning_cocod.tools import bench

    args = bench.parse_args(["--methods", "ssgd,cocod:auto,cocod:8,cocod:auto:ps", "--tau-max", "64"])
    ssgd, auto, fixed, auto_ps = args.method_specs
    assert auto["tau_max"] == 64 and auto_ps["tau_max"] == 64
    assert "tau_max" not in ssgd and "tau_max" not in fixed
    assert bench.method_label(auto) == "CoCoD-SGD tau=auto (tau_max 64)"
    assert bench.method_label(auto_ps) == "CoCoD-SGD tau=auto (tau_max 64) +PS"
    assert bench.method_label(fixed) == "CoCoD-SGD tau=8"
    # Without the option the strategy keeps its own default, and the label is the old one.
    default = bench.parse_args(["--methods", "cocod:auto"]).method_specs[0]
    assert "tau_max" not in default and bench.method_label(default) == "CoCoD-SGD tau=auto"

    sent = []

    def fake_run_method(spec, workers, rate, out, timeout_s=0, suffix="", topology="loopback", latency=None):
        sent.append(spec)
        if spec["method"] == "bound":
            return [rank_result([1.0] * 12)] * workers
        result = rank_result([1.0] * 12, rounds=[(k, k + 2, 0.5, 0.0) for k in range(0, 12, 2)])
        result["tau_history"] = [[0, 2]]
        return [result] * workers

    monkeypatch.setattr(bench, "run_method", fake_run_method)
    for argv, bound, name in (
        (["--tau-max", "64"], 64, "CoCoD-SGD tau=auto (tau_max 64)"),
        ([], 2, "CoCoD-SGD tau=auto"),  # the strategy's default, SAFE_TAU_MAX
    ):
        sent.clear()
        args = bench.parse_args(
            [
                "--methods",
                "cocod:auto",
                "--steps",
                "12",
                "--warmup",
                "4",
                "--rates",
                "300mbit",
                "--no-overhead",
                *argv,
            ]
        )
        figures = bench.measure(args, {"tau": 4}, tmp_path)
        runs = [spec for spec in sent if spec["method"] == "cocod"]
        assert len(runs) == 1 and runs[0]["tau"] == "auto"
        assert runs[0].get("tau_max") == (64 if argv else None)
        # What plan_check.validate predicts the run with.
        assert figures["methods"][name][str(300_000_000)]["tau_max"] == bound


def test_the_worker_builds_cocod_auto_with_the_bound_it_is_given():
    from lightning_cocod.tools.worker import make_strategy

    # A link that needs 24 steps to hide (2 s against 0.1 s steps, with the rule's 1.2 margin).
    raised = make_strategy("cocod", "auto", tau_max=64)
    assert raised.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 24
    default = make_strategy("cocod", "auto")
    assert default.rounds.auto.period.update(comm_seconds=2.0, step_seconds=0.1, round_seconds=0.001) == 2
    with pytest.raises(ValueError, match="tau_max=64 bounds tau='auto' only; 'local_sgd' takes none"):
        make_strategy("local_sgd", 4, tau_max=64)
    with pytest.raises(ValueError, match="tau_min/tau_max bound tau='auto' only"):
        make_strategy("cocod", 4, tau_max=64)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--methods", "cocod:auto", "--tau-max", "0"],
            "--tau-max must be at least 1 (cocod:auto's longest period)",
        ),
        (
            ["--methods", "ssgd,cocod", "--tau-max", "64"],
            "--tau-max bounds cocod:auto only, and --methods 'ssgd,cocod'",
        ),
        (["--methods", "cocod:auto", "--tau-max", "two"], "argument --tau-max: invalid int value: 'two'"),
    ],
)
def test_a_bad_tau_max_is_a_one_line_error(argv, message, capsys):
    from lightning_cocod.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


# --- compressed rounds and DDP's hooks as methods -------------------------------------------------


def test_codecs_and_hooks_are_methods_of_their_own():
    from lightning_cocod.tools import bench

    specs = bench.parse_args(
        [
            "--methods",
            "cocod,cocod:int8,cocod:auto:bf16,local_sgd:8:int8,ssgd:bf16,ssgd:powersgd,ssgd:powersgd4",
        ]
    ).method_specs
    assert [s.get("compression") for s in specs] == [None, "int8", "bf16", "int8", None, None, None]
    assert [s.get("comm_hook") for s in specs] == [None, None, None, None, "bf16", "powersgd", "powersgd"]
    assert specs[6]["powersgd_rank"] == 4 and "powersgd_rank" not in specs[5]
    assert [bench.method_label(s) for s in specs] == [
        "CoCoD-SGD tau=4",
        "CoCoD-SGD tau=4 int8",
        "CoCoD-SGD tau=auto bf16",
        "Local-SGD tau=8 int8",
        "S-SGD +bf16 hook",
        "S-SGD +PowerSGD rank 1",
        "S-SGD +PowerSGD rank 4",
    ]


def test_the_tools_codec_names_are_the_strategies():
    from lightning_cocod.core.compress import CODECS
    from lightning_cocod.strategies.ssgd import COMM_HOOKS
    from lightning_cocod.tools import compare

    assert compare.COMPRESSIONS == tuple(CODECS) and compare.COMM_HOOKS == COMM_HOOKS


@pytest.mark.parametrize(
    "methods, message",
    [
        ("cocod:int4", "option 'int4' of method 'cocod:int4' not understood; accepted: "),
        (
            "ssgd:int8",
            "compression bf16 or int8 (local_sgd, cocod, diloco), DDP hook bf16, fp16 or powersgd[RANK] (ssgd)",
        ),
        ("pipe_sgd:bf16", "option 'bf16' of method 'pipe_sgd:bf16' not understood"),
        ("cocod:int8:bf16", "method 'cocod:int8:bf16' names two codecs, 'int8' and 'bf16': give one"),
        ("ssgd:powersgd0", "PowerSGD's rank must be at least 1, got 0"),
    ],
)
def test_a_bad_codec_is_a_one_line_error_naming_the_accepted(methods, message, capsys):
    from lightning_cocod.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", methods])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


def test_bytes_and_codec_time_per_round_and_the_codecs_share_of_the_rounds_compute(monkeypatch, tmp_path):
    from lightning_cocod.tools import bench

    sent = []

    def fake_run_method(spec, workers, rate, out, timeout_s=0, suffix="", topology="loopback", latency=None):
        sent.append(spec)
        if spec["method"] == "bound":
            return [rank_result([1.0] * 16)] * workers
        compressed = spec.get("compression") == "int8"
        # The fit's first round (launched at step 0, in the warm-up) is exact fp32 and slow to encode.
        rounds = [(0, 4, 1.0, 0.0, 400, 400, 0.0)] + [
            (
                k,
                k + 4,
                0.5,
                0.0,
                101 if compressed else 400,
                101 if compressed else 400,
                0.06 if compressed else 0.0,
            )
            for k in range(4, 16, 4)
        ]
        if spec["method"] == "ssgd":  # DDP: the strategy sees no rounds
            return [rank_result([1.0] * 16)] * workers
        result = rank_result([1.0] * 16, rounds=rounds, comm={"exposed_seconds": 0.0, "hidden_fraction": 1.0})
        return [result] * workers

    monkeypatch.setattr(bench, "run_method", fake_run_method)
    args, figures = _measure_16_steps_at_100mbit("ssgd,cocod,cocod:int8", tmp_path)
    assert [s.get("compression") for s in sent if s["method"] == "cocod"] == [None, "int8"]
    by_name = {name: runs[str(100_000_000)] for name, runs in figures["methods"].items()}
    int8, fp32 = by_name["CoCoD-SGD tau=4 int8"], by_name["CoCoD-SGD tau=4"]
    assert int8["bytes_sent_per_round"] == 101 and fp32["bytes_sent_per_round"] == 400
    assert int8["codec_seconds_per_round"] == pytest.approx(0.06) and int8["compression"] == "int8"
    assert int8["codec_share"] == pytest.approx(0.06 / (4 * 1.0))  # a round of 4 steps of 1 s
    assert "codec_share" not in fp32 and by_name["S-SGD"]["bytes_sent_per_round"] is None
    table = bench.results_table(args, {"workers": {"2": figures}}).splitlines()

    def last_cells(label: str) -> list[str]:
        row = next(line for line in table if f"| {label} " in line)
        return [cell.strip() for cell in row.strip(" |").split("|")][-2:]

    assert last_cells("CoCoD-SGD tau=4 int8") == ["0.00", "0.060 (1.5%)"]
    assert last_cells("CoCoD-SGD tau=4") == ["0.00", "-"] and last_cells("S-SGD") == ["-", "-"]


def test_the_worker_builds_compressed_rounds_and_ddp_hooks_and_refuses_them_elsewhere():
    from lightning_cocod.tools.worker import make_strategy

    assert make_strategy("cocod", 4, compression="int8").rounds.codec.name == "int8"
    assert make_strategy("local_sgd", 4, compression="bf16").rounds.codec.name == "bf16"
    assert make_strategy("cocod", 4).rounds.codec is None
    hooked = make_strategy("ssgd", 4, comm_hook="powersgd", powersgd_rank=2)
    assert hooked.comm_hook == "powersgd" and hooked._ddp_comm_state.matrix_approximation_rank == 2
    with pytest.raises(
        ValueError, match="compression='int8' compresses rounds of local_sgd, cocod, diloco only"
    ):
        make_strategy("ssgd", 4, compression="int8")
    with pytest.raises(ValueError, match="comm_hook='bf16' is a DDP hook of ssgd only; 'cocod' takes none"):
        make_strategy("cocod", 4, comm_hook="bf16")


# --- the outer round overlapped with its last steps -----------------------------------------------


def test_an_overlap_is_a_method_option_of_the_outer_rounds():
    from lightning_cocod.tools import bench

    specs = bench.parse_args(
        ["--methods", "ssgd,diloco:8,diloco:8:d1,diloco:8:d1:int8,diloco:d8:8,cocod:8:d2,diloco:d0"]
    ).method_specs
    assert [s.get("overlap") for s in specs] == [None, None, 1, 1, 8, 2, 0]
    assert [s["tau"] for s in specs] == [4, 8, 8, 8, 8, 8, 4]  # the period may come after the overlap
    assert specs[3]["compression"] == "int8"
    assert [bench.method_label(s) for s in specs] == [
        "S-SGD",
        "DiLoCo tau=8",
        "DiLoCo tau=8 overlap 1",
        "DiLoCo tau=8 overlap 1 int8",
        "DiLoCo tau=8 overlap 8",
        "CoCoD-SGD tau=8 overlap 2",
        "DiLoCo tau=4 overlap 0",
    ]


@pytest.mark.parametrize(
    "methods, message",
    [
        ("diloco:8:d9", "method 'diloco:8:d9': overlap d9 is above the period; accepted: d0 to d8"),
        ("diloco:d5", "method 'diloco:d5': overlap d5 is above the period; accepted: d0 to d4"),  # --tau 4
        ("cocod:auto:d1", "method 'cocod:auto:d1': overlap d1 needs a fixed period"),
        ("local_sgd:8:d1", "option 'd1' of method 'local_sgd:8:d1' not understood; accepted: "),
        ("diloco:8:d", "overlap dN, 0 <= N <= TAU (cocod, diloco)"),
        ("diloco:8:d-1", "option 'd-1' of method 'diloco:8:d-1' not understood"),
    ],
)
def test_a_bad_overlap_is_a_one_line_error_naming_the_accepted(methods, message, capsys):
    from lightning_cocod.tools import bench

    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", methods])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


def test_an_overlapped_round_ends_d_steps_after_its_launch():
    # tau 4, d 2: launched after steps 2, 6, 10, merged after 4, 8, 12; the last, launched after
    # 14, was merged when fit ended after 15, one step short: not a round end.
    result = {"rounds": [(2, 4), (6, 8), (10, 12), (14, 15)], "tau": 4}
    assert round_ends(result, overlap=2) == [4, 8, 12]
    # DiLoCo's default, d = 0: launched and merged after the same step.
    assert round_ends({"rounds": [(4, 4), (8, 8)], "tau": 4}, overlap=0) == [4, 8]
    # An overlap above the period in force (tau="auto" shortened it) is the whole period.
    assert round_ends({"rounds": [(0, 2), (2, 4)], "tau_history": [(0, 2)]}, overlap=4) == [2, 4]


def test_a_pass_runs_the_overlap_asked_for_and_records_it_for_the_model(monkeypatch, tmp_path):
    from lightning_cocod.tools import bench

    sent = []

    def fake_run_method(spec, workers, rate, out, timeout_s=0, suffix="", topology="loopback", latency=None):
        sent.append(spec)
        if spec["method"] != "diloco":
            return [rank_result([1.0] * 16)] * workers
        d = spec.get("overlap", 0)
        # The overlapped run steps faster: 1 s a step, and its round waits 1 s where d = 0's waits 2.
        steps = [1.0, 1.0, 1.0, 3.0 - d] * 4
        rounds = [(k - d, k, 1.0, 2.0 - d) for k in range(4, 17, 4)]
        return [
            rank_result(steps, rounds, {"exposed_seconds": 0.0, "hidden_fraction": 1.0}) | {"tau": 4}
        ] * workers

    monkeypatch.setattr(bench, "run_method", fake_run_method)
    _, figures = _measure_16_steps_at_100mbit("diloco,diloco:d1", tmp_path)
    assert [s.get("overlap") for s in sent if s["method"] == "diloco"] == [None, 1]
    by_name = {name: runs[str(100_000_000)] for name, runs in figures["methods"].items()}
    blocking, overlapped = by_name["DiLoCo tau=4"], by_name["DiLoCo tau=4 overlap 1"]
    assert blocking["step_seconds"] == pytest.approx(6.0 / 4) and blocking["overlap"] is None
    assert overlapped["step_seconds"] == pytest.approx(5.0 / 4) and overlapped["overlap"] == 1


def test_the_worker_builds_the_overlap_and_refuses_it_elsewhere():
    import inspect

    from lightning_cocod import CoCoDStrategy, DiLoCoStrategy
    from lightning_cocod.methods import OVERLAPPED
    from lightning_cocod.tools.worker import make_strategy

    assert make_strategy("diloco", 8, overlap=1).overlap == 1
    assert make_strategy("cocod", 8, overlap=2).overlap == 2
    assert make_strategy("diloco", 8).overlap == 0
    with pytest.raises(
        ValueError, match="overlap=1 overlaps rounds of cocod, diloco only; 'local_sgd' takes none"
    ):
        make_strategy("local_sgd", 8, overlap=1)
    # The tools' defaults are the strategies' own.
    defaults = {
        name: inspect.signature(cls.__init__).parameters["overlap"].default
        for name, cls in (("cocod", CoCoDStrategy), ("diloco", DiLoCoStrategy))
    }
    assert defaults == OVERLAPPED


def _measure_16_steps_at_100mbit(methods: str, tmp_path):
    """(the arguments, ``bench.measure``'s figures) over ``methods``: 16 steps, 4 of warm-up, one
    100 Mbit/s link, no overhead run (with ``run_method`` faked by the caller)."""
    from lightning_cocod.tools import bench

    args = bench.parse_args(
        ["--methods", methods, "--steps", "16", "--warmup", "4", "--rates", "100mbit", "--no-overhead"]
    )
    return args, bench.measure(args, {"tau": 4}, tmp_path)
