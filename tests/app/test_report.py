"""cocod-report, the speedup rule and the search of a group's records on hand-made runs, with the
expected figures worked out by hand."""

import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest
import yaml

from lightning_cocod.app import report
from lightning_cocod.app.runs import load_runs
from lightning_cocod.app.speedup import baseline, speedup
from lightning_cocod.methods import METHODS

matplotlib.use("Agg")
# Two conditions of one group: the same model and data over an unshaped link and over 100 Mbit/s.
UNSHAPED = {"config": {"data": {"batch_size": 32}}, "measured": {"link": "unshaped", "threads": 1}}
SLOW = {"config": {"data": {"batch_size": 32}}, "measured": {"link": "100mbit", "threads": 1}}
CONDITIONS = {"A": UNSHAPED, "B": SLOW}


def run(
    method,
    seed,
    step,
    acc,
    tau=None,
    cond="A",
    finished=0.0,
    workers=2,
    hidden=None,
    to_target=None,
    recorded=None,
    **extra,
):
    """A finished run's record; ``recorded``: the speedup it recorded when it ended (by hand)."""
    return {
        "id": f"g/{method}-{tau}-{cond}-{seed}-{finished}",
        "name": f"{method}-{seed}",
        "group": "g",
        "method": method,
        "tau": tau,
        "progress": 1.0 if method == "cocod" else None,  # CoCoDStrategy's default merge
        "workers": workers,
        "seed": seed,
        "condition_id": cond,
        "condition": CONDITIONS.get(cond, {}),
        "link": CONDITIONS.get(cond, {}).get("measured", {}).get("link"),
        "finished_at": finished,
        "test_acc": acc,
        "steady_step_seconds": step,
        "hidden_fraction": hidden,
        "time_to_target_seconds": to_target,
        "speedup_vs_ssgd": recorded,
        "target_accuracy": 0.9,
        "version": "0.1.0",
        "git_commit": "abc",
        "git_dirty": False,
        "timeline": [
            {"seconds": step * 10, "epoch": 0, "step": 10, "accuracy": acc / 2},
            {"seconds": step * 20, "epoch": 1, "step": 20, "accuracy": acc},
        ],
        **extra,
    }


SSGD_A0 = run("ssgd", 0, 2.0, 0.90, finished=1, recorded=1.0)
SSGD_A1 = run("ssgd", 1, 2.2, 0.92, finished=2, to_target=30.0, recorded=1.0)
SSGD_B0 = run("ssgd", 0, 5.0, 0.90, cond="B", finished=3, recorded=1.0)
COCOD_A0 = run("cocod", 0, 0.8, 0.93, tau=4, finished=4, hidden=0.9, to_target=10.0, recorded=2.5)
COCOD_A1 = run("cocod", 1, 1.1, 0.91, tau=4, finished=5, hidden=0.8, recorded=2.0)
COCOD_B0 = run("cocod", 0, 1.25, 0.92, tau=4, cond="B", finished=6, hidden=1.0, recorded=4.0)
COCOD_A0_TAU8 = run("cocod", 0, 0.5, 0.92, tau=8, finished=7, hidden=1.0, recorded=4.0)
LOCAL_A2 = run("local_sgd", 2, 1.0, 0.90, tau=4, finished=8, hidden=0.0)  # no S-SGD with seed 2
RUNS = [SSGD_A0, SSGD_A1, SSGD_B0, COCOD_A0, COCOD_A1, COCOD_B0, COCOD_A0_TAU8, LOCAL_A2]


def test_speedup_is_over_the_ssgd_run_of_the_same_condition_and_seed():
    assert speedup(COCOD_A0, RUNS) == (pytest.approx(2.0 / 0.8), SSGD_A0["id"])
    assert speedup(COCOD_A1, RUNS) == (pytest.approx(2.2 / 1.1), SSGD_A1["id"])
    assert speedup(COCOD_B0, RUNS) == (pytest.approx(5.0 / 1.25), SSGD_B0["id"])  # its own link's S-SGD
    assert speedup(LOCAL_A2, RUNS) == (None, None)  # not borrowed from another seed
    assert speedup(SSGD_A0, RUNS) == (pytest.approx(1.0), SSGD_A0["id"])
    # A second S-SGD run of a condition and seed is measured against the first to finish.
    again = run("ssgd", 0, 2.5, 0.9, finished=9)
    assert baseline(COCOD_A0, [*RUNS, again]) is SSGD_A0
    assert speedup(again, [*RUNS, again]) == (pytest.approx(2.0 / 2.5), SSGD_A0["id"])
    other_group = {**COCOD_A0, "group": "h"}
    assert speedup(other_group, RUNS) == (None, None)
    legacy = {k: v for k, v in COCOD_A0.items() if k not in ("condition", "condition_id")}
    assert speedup(legacy, RUNS) == (None, None)


def test_a_run_finds_its_baseline_among_the_records_of_its_group_and_the_report_marks_late_ones(tmp_path):
    early = dict(COCOD_A0, speedup_vs_ssgd=None)  # it ended before its S-SGD run: no speedup yet
    later = dict(COCOD_A1, seed=0, id="g/late")
    other_group = dict(SSGD_A1, group="h", seed=0, steady_step_seconds=9.0, id="h/ssgd")
    write_runs(tmp_path / "out", [early, SSGD_A0, other_group])
    skipped = []
    found = [
        r for r in load_runs([tmp_path / "out"], lambda path, why: skipped.append(path)) if r["group"] == "g"
    ]
    assert sorted(r["id"] for r in found) == sorted([early["id"], SSGD_A0["id"]]) and skipped == []
    assert speedup(later, [*found, later]) == (pytest.approx(2.0 / 1.1), SSGD_A0["id"])
    # The run's end gives the rule every record under out_root: it keeps to the group itself.
    assert speedup(later, [*load_runs([tmp_path / "out"]), later]) == (
        pytest.approx(2.0 / 1.1),
        SSGD_A0["id"],
    )
    write_runs(tmp_path / "out", [dict(later, speedup_vs_ssgd=2.0 / 1.1)])

    # The report applies the rule to every record and marks the run whose record said unknown.
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "g.md").read_text()
    assert (
        "| CoCoD-SGD | 4 | 2 | unshaped | 0 | 92.00 ± 1.41 (n=2) | 0.9500 ± 0.2121 (n=2) | 2.159 ± 0.482 (n=2) *"
        in table
    )
    assert "1 run(s) finished before their S-SGD run" in table


def test_a_damaged_or_malformed_record_is_named_and_costs_only_itself(tmp_path, capsys):
    write_runs(tmp_path / "out", RUNS)
    damaged = {
        "truncated/run.json": '{"id": "g/x", "method": "cocod", "test_acc": ',
        "empty/run.json": "",
        "text_acc/run.json": json.dumps(dict(COCOD_A1, id="g/bad-acc", test_acc="0.9")),
        "list_tau/run.json": json.dumps(dict(COCOD_A1, id="g/bad-tau", tau=[4])),
        "method/run.json": json.dumps(dict(COCOD_A1, id="g/bad-method", method="sgd")),
        "true_seed/run.json": json.dumps(
            dict(COCOD_A1, id="g/bad-seed", seed=True)
        ),  # JSON's true: no number
        "word_tau/run.json": json.dumps(
            dict(COCOD_A1, id="g/bad-word", tau="four")
        ),  # "auto" is the one word
        "a_list/run.json": "[1, 2]",
        "judged/run.json": json.dumps(dict(COCOD_A1, id="g/bad-goal", judged_by="perplexity")),
        "text_loss/run.json": json.dumps(
            dict(COCOD_A1, id="g/bad-loss", timeline=[{"seconds": 1.0, "accuracy": 0.5, "loss": "1.3"}])
        ),
    }
    for name, text in damaged.items():
        (tmp_path / "out" / name).parent.mkdir(parents=True)
        (tmp_path / "out" / name).write_text(text)
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sorted(line.removeprefix("cocod-report: skipped ").partition(": ")[0] for line in err) == sorted(
        str(tmp_path / "out" / name) for name in damaged
    )
    assert all(line.startswith("cocod-report: skipped ") for line in err)
    assert any(line.endswith("text_acc/run.json: test_acc '0.9' is not a number") for line in err)
    assert any(line.endswith("true_seed/run.json: seed True is not an integer") for line in err)
    assert any(
        line.endswith(f"method/run.json: method 'sgd' is none of {', '.join(METHODS)}") for line in err
    )
    assert any(
        line.endswith("judged/run.json: judged_by 'perplexity' is none of accuracy, loss") for line in err
    )
    assert any(
        line.endswith("text_loss/run.json: timeline is not a list of {seconds, accuracy[, loss]} points")
        for line in err
    )
    # The good records are all there, as in the table worked out by hand below.
    table = (tmp_path / "rep" / "g.md").read_text()
    assert table.startswith(f"# g: {len(RUNS)} run(s)")
    assert (
        "| CoCoD-SGD | 4 | 2 | unshaped | 0,1 | 92.00 ± 1.41 (n=2) | 0.9500 ± 0.2121 (n=2) | 2.250 ± 0.354 (n=2) |"
        in table
    )
    skipped = []
    found = [
        r for r in load_runs([tmp_path / "out"], lambda path, why: skipped.append(path)) if r["group"] == "g"
    ]
    assert len(found) == len(RUNS)
    assert len(skipped) == len(damaged)


def test_table_rows_by_hand(tmp_path):
    rows = {(r["method"], r["tau"], r["link"]): r for r in report.summarise(RUNS)}
    ssgd_a, ssgd_b = rows[("ssgd", None, "unshaped")], rows[("ssgd", None, "100mbit")]
    cocod_a = rows[("cocod", 4, "unshaped")]
    # S-SGD, unshaped: steps 2.0 and 2.2 (mean 2.1, sample std 0.1414); accuracy 91 ± 1.414
    assert ssgd_a["step"] == pytest.approx(2.1) and ssgd_a["step_std"] == pytest.approx(0.02**0.5)
    assert ssgd_a["acc"] == pytest.approx(91.0) and ssgd_a["acc_std"] == pytest.approx(2**0.5)
    assert ssgd_a["speedup"] == pytest.approx(1.0) and ssgd_b["step"] == pytest.approx(5.0)  # not merged
    # CoCoD tau=4 unshaped: per-seed speedups 2.0/0.8 = 2.5 and 2.2/1.1 = 2.0: mean 2.25, std 0.3536
    assert cocod_a["speedup"] == pytest.approx(2.25) and cocod_a["speedup_std"] == pytest.approx(0.125**0.5)
    assert cocod_a["hidden"] == pytest.approx(0.85) and cocod_a["to_target_n"] == 1
    assert rows[("cocod", 4, "100mbit")]["speedup"] == pytest.approx(4.0)
    assert rows[("cocod", 8, "unshaped")]["speedup"] == pytest.approx(4.0)
    assert rows[("local_sgd", 4, "unshaped")]["speedup"] is None

    write_runs(tmp_path / "runs")
    assert report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "g.md").read_text()
    assert (
        "| S-SGD | – | 2 | unshaped | 0,1 | 91.00 ± 1.41 (n=2) | 2.1000 ± 0.1414 (n=2) | 1.000 ± 0.000 (n=2) |"
        in table
    )
    assert (
        "| CoCoD-SGD | 4 | 2 | unshaped | 0,1 | 92.00 ± 1.41 (n=2) | 0.9500 ± 0.2121 (n=2) | 2.250 ± 0.354 (n=2) | 85.0% | 10.0 (1/2) |"
        in table
    )
    assert (
        "| CoCoD-SGD | 4 | 2 | 100mbit | 0 | 92.00 | 1.2500 | 4.000 | 100.0% | not reached (0/1) |" in table
    )
    assert "| Local-SGD | 4 | 2 | unshaped | 2 | 90.00 | 1.0000 | – | 0.0% |" in table
    assert "| S-SGD | – | 2 | 100mbit | 0 | 90.00 | 5.0000 | 1.000 |" in table
    assert (
        "time to 90.0% (s)" in table
        and "Code: lightning_cocod 0.1.0 (git abc)." in table
        and "condition |" not in table
    )
    assert " * |" not in table and "finished before" not in table  # every record knew its speedup
    for plot in ("accuracy_vs_time", "speedup_vs_tau"):
        assert (tmp_path / "rep" / f"g_{plot}.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "rep" / "g_speedup_vs_workers.png").exists()  # one worker count: no axis


def write_runs(root: Path, runs=RUNS) -> None:
    for record in runs:
        folder = root / record["id"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run.json").write_text(json.dumps(record))


def test_conditions_that_differ_beyond_the_link_get_a_column_naming_the_difference(tmp_path):
    threads2 = {"config": UNSHAPED["config"], "measured": {"link": "unshaped", "threads": 2}}
    runs = [
        SSGD_A0,
        COCOD_A0,
        run("ssgd", 0, 1.5, 0.9, cond="C", finished=10, condition=threads2, link="unshaped", recorded=1.0),
        run(
            "cocod",
            0,
            0.5,
            0.9,
            tau=4,
            cond="C",
            finished=11,
            condition=threads2,
            link="unshaped",
            recorded=3.0,
        ),
    ]
    assert report.main(["--out", str(tmp_path / "rep"), *[str(p) for p in _as_files(tmp_path, runs)]]) == 0
    table = (tmp_path / "rep" / "g.md").read_text()
    assert "| method | tau | workers | link | condition | seeds |" in table
    assert "| CoCoD-SGD | 4 | 2 | unshaped | threads=1 | 0 | 93.00 | 0.8000 | 2.500 |" in table
    assert "| CoCoD-SGD | 4 | 2 | unshaped | threads=2 | 0 | 90.00 | 0.5000 | 3.000 |" in table


def _as_files(root: Path, runs: list) -> list[Path]:
    paths = []
    for i, record in enumerate(runs):
        path = root / f"run{i}" / "run.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
        paths.append(path)
    return paths


def _captured_figures(monkeypatch) -> list:
    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), real_close(fig)))
    return figures


def test_plots_have_an_axis_only_with_two_values_and_name_accuracy_like_the_table(tmp_path, monkeypatch):
    figures = _captured_figures(monkeypatch)
    rows = report.summarise(RUNS)
    assert report.plot(rows, "tau", "speedup", tmp_path / "tau.png")
    (ax,) = figures[-1].axes
    assert list(ax.get_xticks()) == [4, 8]  # the values run, not a continuous 3.8-4.2 range
    one_tau = [r for r in rows if r["tau"] in (None, 4)]
    assert not report.plot(one_tau, "tau", "speedup", tmp_path / "tau1.png")
    assert not (tmp_path / "tau1.png").exists()
    assert report.plot(rows, "seconds", "timeline", tmp_path / "acc.png")
    # The timeline is what each epoch's validation measured; the table's figure is the test split's.
    assert figures[-1].axes[0].get_ylabel() == "validation accuracy (%)"
    assert report.plot(rows, "tau", "acc", tmp_path / "acc_tau.png")
    assert figures[-1].axes[0].get_ylabel() == report.ACCURACY == "test acc (%)"
    assert "test acc (%)" in report.markdown("g", RUNS, rows, [])
    assert not report.plot(one_tau, "tau", "acc", tmp_path / "acc_tau1.png")


def test_cocod_merge_variants_get_rows_and_lines_of_their_own(tmp_path, monkeypatch):
    # Keeping half of the progress (progress 0.5) and the paper's merge (1, the default) at the
    # same tau are different methods to compare; a record written before the option existed ran
    # the paper's merge.
    half = run("cocod", 0, 0.8, 0.88, tau=4, finished=10, progress=0.5)
    legacy = {k: v for k, v in run("cocod", 1, 0.8, 0.89, tau=4, finished=11).items() if k != "progress"}
    runs = [SSGD_A0, COCOD_A0, COCOD_A0_TAU8, half, legacy]
    rows = {(r["label"], r["tau"]): r for r in report.summarise(runs)}
    assert rows[("CoCoD-SGD (progress 0.5)", 4)]["acc"] == pytest.approx(88.0)
    paper = rows[("CoCoD-SGD", 4)]
    assert paper["n"] == 2 and paper["acc"] == pytest.approx(91.0) and paper["seeds"] == [0, 1]
    figures = _captured_figures(monkeypatch)
    assert report.plot(report.summarise(runs), "seconds", "timeline", tmp_path / "acc.png")
    legend = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert legend == ["S-SGD", "CoCoD-SGD tau=4", "CoCoD-SGD tau=8", "CoCoD-SGD (progress 0.5) tau=4"]
    # A line is the mean of its seeds' timelines: seeds 0 and 1 of the paper's merge, 93% and 89%.
    paper_line = figures[-1].axes[0].get_lines()[1]
    assert list(paper_line.get_ydata()) == pytest.approx([45.5, 91.0])
    assert report.plot(report.summarise(runs), "tau", "acc", tmp_path / "acc_tau.png")
    ax = figures[-1].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["CoCoD-SGD w=2", "CoCoD-SGD (progress 0.5) w=2"]
    points = [
        (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if line.get_marker() == "o"
    ]
    assert points == [([4, 8], [pytest.approx(91.0), pytest.approx(92.0)]), ([4], [pytest.approx(88.0)])]


def test_the_records_are_the_run_json_files_each_read_once(tmp_path):
    # A run named twice (its sweep's folder, then its own run.json) counts once; a logger's files
    # hold no record (run.json is the one record of a run).
    write_runs(tmp_path / "out", [SSGD_A0, COCOD_A0])
    logs = tmp_path / "out" / "g" / "csv"
    logs.mkdir()
    (logs / "metrics.csv").write_text("step,final/test_acc,final/steady_step_seconds\n1,0.5,1.0\n")
    (logs / "hparams.yaml").write_text(yaml.safe_dump({"run": dict(LOCAL_A2, test_acc=None)}))
    runs = load_runs([tmp_path / "out", tmp_path / "out" / COCOD_A0["id"] / "run.json"])
    assert sorted(runs, key=lambda r: r["id"]) == sorted([SSGD_A0, COCOD_A0], key=lambda r: r["id"])


def test_no_runs_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cocod-report: error: no finished runs under") and err.count("\n") == 1


def test_compressed_rounds_and_ddp_hooks_get_rows_of_their_own_and_no_hook_is_a_baseline():
    # int8 rounds at the same tau are another row, with their bytes per round; S-SGD with
    # PowerSGD is a method compared, so the plain S-SGD run stays the baseline of every speedup
    # (its own included: 2.0 / 1.0), even though PowerSGD's finished first.
    powersgd = run("ssgd", 0, 1.0, 0.90, finished=-1, comm_hook="powersgd", bytes_sent_per_round=1e5)
    int8 = run("cocod", 0, 0.5, 0.92, tau=4, finished=10, compression="int8", bytes_sent_per_round=2.5e6)
    runs = [SSGD_A0, COCOD_A0, powersgd, int8]
    assert baseline(int8, runs) is SSGD_A0 and baseline(powersgd, runs) is SSGD_A0
    rows = {r["label"]: r for r in report.summarise(runs)}
    assert set(rows) == {"S-SGD", "S-SGD (powersgd)", "CoCoD-SGD", "CoCoD-SGD (int8)"}
    assert rows["CoCoD-SGD (int8)"]["speedup"] == pytest.approx(SSGD_A0["steady_step_seconds"] / 0.5)
    assert rows["S-SGD (powersgd)"]["speedup"] == pytest.approx(SSGD_A0["steady_step_seconds"] / 1.0)
    assert rows["CoCoD-SGD (int8)"]["sent"] == pytest.approx(2.5)  # MB
    table = report.markdown("g", runs, report.summarise(runs), [])
    # The time-to-accuracy columns come last (these runs have timelines).
    assert "| sent per round (MB) | final val acc (%) |" in table.splitlines()[4]
    assert any(
        line.startswith("| CoCoD-SGD (int8) | 4 |") and "| 2.5 | 92.00 |" in line
        for line in table.splitlines()
    )
    # With the codec's seconds recorded (in all, over the run's rounds): a column of its own, per round.
    timed = [
        dict(int8, codec_seconds=0.6, rounds=20),
        dict(int8, id="g/int8-s1", seed=1, codec_seconds=1.0, rounds=20),
    ]
    # fp32 rounds record zero codec seconds: the figure does not apply to them, and says so.
    plain = dict(COCOD_A0, codec_seconds=0.0, rounds=20)
    lines = report.markdown(
        "g", [SSGD_A0, plain, *timed], report.summarise([SSGD_A0, plain, *timed]), []
    ).splitlines()
    assert any(line.startswith("| CoCoD-SGD | 4 |") and "| – | – | 93.00 |" in line for line in lines)
    assert "| sent per round (MB) | codec per round (s) | final val acc (%) |" in lines[4]
    assert any(
        line.startswith("| CoCoD-SGD (int8) | 4 |")
        and "| 0.0400 ± 0.0141 (n=2) | 92.00 ± 0.00 (n=2) |" in line
        for line in lines
    )
    assert any(line.startswith("| S-SGD |") and "| – | – | 90.00 |" in line for line in lines)


def test_time_to_accuracy_by_hand():
    """S-SGD's final validation accuracy, the mean over its seeds, less half a point is the
    target; a row's time to it is the median over its seeds, a seed that misses it counting as
    never (so "never" when half of them or more miss it)."""

    def timed(method, seed, points, **extra):
        timeline = [
            {"seconds": s, "epoch": i, "step": 10 * i, "accuracy": a} for i, (s, a) in enumerate(points)
        ]
        return dict(
            run(method, seed, 1.0, points[-1][1], tau=None if method == "ssgd" else 2, **extra),
            timeline=timeline,
        )

    # S-SGD ends at 0.96 and 0.94: the level is 0.95, the target 0.945 (seed 0 at 20 s, seed 1 at 24 s).
    ssgd = [
        timed("ssgd", 0, [(10, 0.80), (20, 0.95), (30, 0.96)]),
        timed("ssgd", 1, [(12, 0.85), (24, 0.946), (36, 0.94)]),
    ]
    # A hooked S-SGD ending far higher is a method compared: it moves neither the level nor the base.
    hooked = timed("ssgd", 0, [(5, 0.99)], comm_hook="bf16")
    cocod = [
        timed("cocod", 0, [(4, 0.90), (8, 0.95), (12, 0.955)]),
        timed("cocod", 1, [(5, 0.90), (10, 0.944), (15, 0.951)]),
    ]
    local = [timed("local_sgd", 0, [(6, 0.95)]), timed("local_sgd", 1, [(6, 0.90), (12, 0.93)])]
    # Three seeds, one of which misses: the median is the slower of the two that reached it.
    pipe = [timed("pipe_sgd", s, p) for s, p in enumerate([[(7, 0.95)], [(9, 0.96)], [(3, 0.90)]])]
    elsewhere = timed("cocod", 0, [(1, 0.99)], cond="B")  # no S-SGD run of its condition: no target
    runs = [*ssgd, hooked, *cocod, *local, *pipe, elsewhere]
    rows = {(r["label"], r["link"]): r for r in report.summarise(runs)}
    base, row = rows[("S-SGD", "unshaped")], rows[("CoCoD-SGD", "unshaped")]
    assert base["level"] == pytest.approx(0.95) and row["level"] == pytest.approx(0.95)
    assert base["tta"] == pytest.approx(22.0) and base["tt_final"] is None  # seed 1 never got to 0.95
    assert row["tta"] == pytest.approx(11.5) and row["tt_final"] == pytest.approx(11.5)
    assert row["tta_speedup"] == pytest.approx(22.0 / 11.5)
    assert row["final"] == pytest.approx(95.3) and row["final_std"] == pytest.approx(0.2828, abs=1e-4)
    assert (
        rows[("Local-SGD", "unshaped")]["tta"] is None and rows[("Local-SGD", "unshaped")]["tta_reached"] == 1
    )
    assert (
        rows[("Pipe-SGD", "unshaped")]["tta"] == pytest.approx(9.0)
        and rows[("Pipe-SGD", "unshaped")]["tta_reached"] == 2
    )
    assert rows[("S-SGD (bf16)", "unshaped")]["tta"] == pytest.approx(5.0)  # measured against the plain S-SGD
    assert rows[("CoCoD-SGD", "100mbit")]["level"] is None
    lines = report.markdown("g", runs, report.summarise(runs), []).splitlines()
    header = "| final val acc (%) | target (%) | time to target (s) | speedup to target | time to S-SGD's final (s) | tau settled |"
    assert next(line for line in lines if line.startswith("| method |")).endswith(header)
    assert any(
        line.startswith("| CoCoD-SGD | 2 | 2 | unshaped |")
        and line.endswith("| 95.30 ± 0.28 (n=2) | 94.50 | 11.5 (2/2) | 1.91x | 11.5 | – |")
        for line in lines
    )
    assert any(
        line.startswith("| Local-SGD | 2 |") and "| never (1/2) | – | never |" in line for line in lines
    )
    assert any(line.startswith("| Pipe-SGD |") and "| 9.0 (2/3) | 2.44x |" in line for line in lines)
    assert any(
        line.startswith("| CoCoD-SGD | 2 | 2 | 100mbit |") and line.endswith("| 99.00 | – | – | – | – | – |")
        for line in lines
    )


def test_time_to_loss_by_hand(tmp_path, monkeypatch):
    """A language model's runs (judged_by=loss): the target is S-SGD's final validation loss, the
    mean over its seeds, plus 0.01 nats; a run gets there at its first validation at or below it,
    and a run whose loss diverged (recorded as null) never does."""

    def timed(method, seed, points, **extra):
        timeline = [
            {"seconds": s, "epoch": i, "step": 10 * i, "accuracy": 0.4, "loss": loss}
            for i, (s, loss) in enumerate(points)
        ]
        tau = None if method == "ssgd" else 2
        return dict(run(method, seed, 1.0, 0.4, tau=tau, judged_by="loss", **extra), timeline=timeline)

    # S-SGD ends at 1.30 and 1.32: the level 1.31, the target 1.32 (seed 0 at 30 s, seed 1 at 36 s).
    ssgd = [
        timed("ssgd", 0, [(10, 2.0), (20, 1.5), (30, 1.30)]),
        timed("ssgd", 1, [(12, 2.0), (24, 1.4), (36, 1.32)]),
    ]
    # CoCoD: 1.319 at 8 s, 1.321 then 1.315 at 15 s (1.321 is short of 1.32): median 11.5 s.
    cocod = [
        timed("cocod", 0, [(4, 1.5), (8, 1.319), (12, 1.318)]),
        timed("cocod", 1, [(5, 1.5), (10, 1.321), (15, 1.315)]),
    ]
    # Local-SGD: one seed diverged after reaching 1.4; the other ends above the target.
    local = [timed("local_sgd", 0, [(6, 1.4), (12, None)]), timed("local_sgd", 1, [(6, 1.5), (12, 1.33)])]
    runs = [*ssgd, *cocod, *local]
    rows = {r["label"]: r for r in report.summarise(runs)}
    assert rows["S-SGD"]["level"] == pytest.approx(1.31) and rows["S-SGD"]["goal_target"] == pytest.approx(
        1.32
    )
    assert rows["S-SGD"]["tta"] == pytest.approx(33.0)
    assert rows["CoCoD-SGD"]["tta"] == pytest.approx(11.5) and rows["CoCoD-SGD"][
        "tta_speedup"
    ] == pytest.approx(33.0 / 11.5)
    assert rows["CoCoD-SGD"]["final"] == pytest.approx(1.3165)  # losses are shown as they are, not in percent
    assert rows["CoCoD-SGD"]["tt_final"] is None  # S-SGD's own 1.31: neither seed got below 1.315
    local_row = rows["Local-SGD"]
    assert local_row["tta"] is None and local_row["tta_reached"] == 0
    assert (
        local_row["final"] == pytest.approx(1.33) and local_row["final_n"] == 1
    )  # the diverged seed has none
    lines = report.markdown("g", runs, report.summarise(runs), []).splitlines()
    header = "| final val loss (nats) | target (nats) | time to target (s) | speedup to target |"
    assert header in next(line for line in lines if line.startswith("| method |"))
    assert any(
        line.startswith("| CoCoD-SGD |") and "| 1.317 ± 0.002 (n=2) | 1.320 | 11.5 (2/2) | 2.87x |" in line
        for line in lines
    )
    assert any("validation loss plus 0.01 nats" in line for line in lines)
    # The plot is the loss against wall time, lower better: the line of the diverged seed's row
    # ends where its seeds' validations stop being all finite.
    figures = _captured_figures(monkeypatch)
    assert report.plot(report.summarise(runs), "seconds", "timeline", tmp_path / "loss.png")
    ax = figures[-1].axes[0]
    assert ax.get_ylabel() == "validation loss (nats)" and "loss against wall time" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    local_line = ax.get_lines()[legend.index("Local-SGD tau=2")]
    assert list(local_line.get_ydata()) == pytest.approx([1.45])
    assert report.write_report("g", runs, tmp_path / "out").exists()
    assert (tmp_path / "out" / "g_loss_vs_time.png").exists()


@pytest.mark.timeout(60)
def test_hostile_records_are_each_skipped_and_named_and_no_link_is_written_through(tmp_path, capsys):
    import os

    write_runs(tmp_path / "out", RUNS)
    bad = {
        "nan/run.json": (
            json.dumps(dict(COCOD_A1, id="g/nan", test_acc=float("nan"))),
            "test_acc nan is not a number",
        ),
        "inf/run.json": (
            json.dumps(dict(COCOD_A1, id="g/inf", steady_step_seconds=float("inf"))),
            "steady_step_seconds inf is not a number",
        ),
        "nul/run.json": (
            json.dumps(dict(COCOD_A1, id="g/nul", group="a\0b")),
            "group 'a\\x00b' is not a name",
        ),
        "long/run.json": (json.dumps(dict(COCOD_A1, id="g/long", group="x" * 300)), "group 'xxxxxxxx"),
        "overlap/run.json": (
            json.dumps(dict(COCOD_A1, id="g/overlap", overlap="1")),
            "overlap '1' is not a period",
        ),
        "negative/run.json": (
            json.dumps(dict(COCOD_A1, id="g/negative", overlap=-1)),
            "overlap -1 is not a count",
        ),
        "outer/run.json": (
            json.dumps(dict(COCOD_A1, id="g/outer", outer_optimizer=[1])),
            "outer_optimizer [1] is not",
        ),
        "deep/run.json": (
            "[" * 100_000 + "]" * 100_000,
            "its JSON is nested deeper than Python's parser goes",
        ),
    }
    for name, (text, _) in bad.items():
        (tmp_path / "out" / name).parent.mkdir(parents=True)
        (tmp_path / "out" / name).write_text(text)
    (tmp_path / "out" / "fifo").mkdir()
    os.mkfifo(tmp_path / "out" / "fifo" / "run.json")  # a read would wait for a writer for ever
    (tmp_path / "out" / "zero").mkdir()
    (tmp_path / "out" / "zero" / "run.json").symlink_to("/dev/zero")  # a read would fill the memory
    # A report's names planted as links to a file of someone else's: it must stay as it was.
    victim = tmp_path / "victim.txt"
    victim.write_text("not the report's")
    (tmp_path / "rep").mkdir()
    for name in ("g.md", "g_speedup_vs_tau.png", "g_accuracy_vs_time.png"):
        (tmp_path / "rep" / name).symlink_to(victim)
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert all(line.startswith("cocod-report: skipped ") for line in err), err
    named = {line.removeprefix("cocod-report: skipped ").partition(": ")[0]: line for line in err}
    expected = [*bad, "fifo/run.json", "zero/run.json"]
    assert sorted(named) == sorted(str(tmp_path / "out" / name) for name in expected)
    for name, (_, why) in bad.items():
        assert why in named[str(tmp_path / "out" / name)]
    assert "is not a regular file" in named[str(tmp_path / "out" / "fifo" / "run.json")]
    assert "is not a regular file" in named[str(tmp_path / "out" / "zero" / "run.json")]
    assert victim.read_text() == "not the report's"
    for name in ("g.md", "g_speedup_vs_tau.png", "g_accuracy_vs_time.png"):
        assert not (tmp_path / "rep" / name).is_symlink()
    table = (tmp_path / "rep" / "g.md").read_text()
    assert table.startswith(f"# g: {len(RUNS)} run(s)")
    assert (tmp_path / "rep" / "g_speedup_vs_tau.png").read_bytes().startswith(b"\x89PNG")


def test_runs_judged_by_different_goals_share_no_row_target_or_speedup(tmp_path, monkeypatch):
    """One condition, one group, two goals: the accuracy-judged runs and the loss-judged ones each
    get their own rows, S-SGD level and target, and no speedup crosses from one goal to the other."""

    def judged(method, seed, step, goal, finals):
        tau = None if method == "ssgd" else 4
        timeline = [
            {"seconds": 10.0 * (i + 1), "accuracy": a, "loss": loss} for i, (a, loss) in enumerate(finals)
        ]
        return dict(run(method, seed, step, finals[-1][0], tau=tau, judged_by=goal), timeline=timeline)

    accuracy = [
        judged("ssgd", 0, 2.0, "accuracy", [(0.5, 2.0), (0.9, 1.0)]),
        judged("cocod", 0, 1.0, "accuracy", [(0.6, 2.0), (0.91, 1.1)]),
    ]
    loss = [
        judged("ssgd", 0, 4.0, "loss", [(0.3, 3.0), (0.4, 2.5)]),
        judged("cocod", 0, 0.5, "loss", [(0.3, 3.0), (0.35, 2.4)]),
    ]
    runs = [*accuracy, *loss]
    rows = {(r["label"], r["goal"]): r for r in report.summarise(runs)}
    assert sorted(rows) == sorted(
        (m, g) for m in ("S-SGD", "CoCoD-SGD") for g in ("accuracy", "loss")
    )  # four rows, not two
    assert all(r["n"] == 1 for r in rows.values())
    # Each goal's target is its own S-SGD's final figure, within that goal's margin.
    assert rows["CoCoD-SGD", "accuracy"]["goal_target"] == pytest.approx(0.9 - 0.005)
    assert rows["CoCoD-SGD", "loss"]["goal_target"] == pytest.approx(2.5 + 0.01)
    assert rows["CoCoD-SGD", "accuracy"]["final"] == pytest.approx(91.0)  # in percent
    assert rows["CoCoD-SGD", "loss"]["final"] == pytest.approx(2.4)  # in nats
    # Speedups: over the S-SGD run judged alike (2.0 / 1.0 and 4.0 / 0.5), never across goals.
    assert speedup(accuracy[1], runs) == (pytest.approx(2.0), accuracy[0]["id"])
    assert speedup(loss[1], runs) == (pytest.approx(8.0), loss[0]["id"])
    assert rows["CoCoD-SGD", "accuracy"]["speedup"] == pytest.approx(2.0)
    assert rows["CoCoD-SGD", "loss"]["speedup"] == pytest.approx(8.0)
    assert rows["CoCoD-SGD", "loss"]["tta_speedup"] == pytest.approx(20.0 / 20.0)
    # The table names each row's goal, and shows each figure in its own unit.
    table = report.markdown("g", runs, report.summarise(runs), [])
    lines = [line for line in table.splitlines() if line.startswith("| CoCoD-SGD |")]
    assert len(lines) == 2
    assert any("judged_by=accuracy" in line and "| 91.00 |" in line and "| 89.50 |" in line for line in lines)
    assert any("judged_by=loss" in line and "| 2.400 |" in line and "| 2.510 |" in line for line in lines)
    # The speedup plot has a line per goal, not one averaging both.
    figures = _captured_figures(monkeypatch)
    extra = [
        judged("cocod", 0, 0.25, g, [(0.6, 2.0), (0.95, 2.3)]) | {"tau": 8} for g in ("accuracy", "loss")
    ]
    assert report.plot(report.summarise(runs + extra), "tau", "speedup", tmp_path / "tau.png")
    legend = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert sorted(legend) == ["CoCoD-SGD w=2 judged_by=accuracy", "CoCoD-SGD w=2 judged_by=loss"]


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("accuracy", -1e308, "timeline point 1: accuracy -1e+308 is not a fraction in [0, 1]"),
        ("loss", -1e308, "timeline point 1: loss -1e+308 is not a number in [0, 1e+100]"),
        ("accuracy", 1.5, "timeline point 1: accuracy 1.5 is not a fraction in [0, 1]"),
        ("loss", 1e300, "timeline point 1: loss 1e+300 is not a number in [0, 1e+100]"),
        ("seconds", -1e308, "timeline point 1: seconds -1e+308 is not a number in [0, 1e+100]"),
        ("test_acc", -1e308, "test_acc -1e+308 is not a fraction in [0, 1]"),
        ("steady_step_seconds", -1e308, "steady_step_seconds -1e+308 is not a number in [0, 1e+100]"),
        ("tau", 0, "tau 0 is not a count in [1, 1e+09]"),  # no place on the plots' log axis
        (
            "workers",
            10**400,
            f"workers {str(10**400)[:40]}... is not a count in [1, 1e+09]",
        ),  # past a float's range
    ],
)
def test_a_record_with_an_absurd_figure_costs_only_itself_and_the_group_is_reported(
    tmp_path, capsys, field, value, why
):
    """A figure the type check lets through but no run writes (a -1e308 loss broke matplotlib's
    axes, and the whole group went without its table and plots): the record is passed over and
    named with the field and what is accepted; the other records are reported and plotted."""
    good = [dict(r, judged_by="loss") for r in RUNS]
    for r in good:
        r["timeline"] = [dict(p, loss=2.0 - p["accuracy"]) for p in r["timeline"]]
    absurd = dict(good[4], id="g/absurd", timeline=[dict(p) for p in good[4]["timeline"]])
    if field in ("accuracy", "loss", "seconds"):
        absurd["timeline"][1][field] = value
    else:
        absurd[field] = value
    write_runs(tmp_path / "out", [*good, absurd])
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"cocod-report: skipped {tmp_path / 'out' / 'g' / 'absurd' / 'run.json'}: {why}"]
    table = (tmp_path / "rep" / "g.md").read_text()
    assert table.startswith(f"# g: {len(RUNS)} run(s)")  # the others, all of them
    for name in ("g_loss_vs_time.png", "g_speedup_vs_tau.png", "g_accuracy_vs_tau.png"):
        assert (tmp_path / "rep" / name).read_bytes().startswith(b"\x89PNG")


def test_a_report_that_fails_half_way_leaves_the_last_one_whole_and_costs_only_its_group(
    tmp_path, monkeypatch, capsys
):
    """A plot that breaks after another was drawn: nothing of that group's new report is put in
    place (its last table and plots stay as they were), and the other group is reported."""
    write_runs(tmp_path / "out", [*RUNS, *(dict(r, id="h/" + r["id"], group="h") for r in RUNS)])
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "rep").iterdir() if p.name.startswith("g")}
    assert "g_accuracy_vs_time.png" in before and "g_speedup_vs_tau.png" in before
    real_plot = report.plot

    def broken(rows, x, y, path):
        if path.name.startswith("g_") and y == "speedup":
            raise ValueError("Axis limits cannot be NaN or Inf")
        return real_plot(rows, x, y, path)

    monkeypatch.setattr(report, "plot", broken)
    (tmp_path / "rep" / "h.md").unlink()
    capsys.readouterr()
    assert report.main([str(tmp_path / "out"), "--out", str(tmp_path / "rep")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "cocod-report: error: group 'g': its report failed, its earlier files are as they were "
        "(ValueError: Axis limits cannot be NaN or Inf)"
    ]
    assert {p.name: p.read_bytes() for p in (tmp_path / "rep").iterdir() if p.name.startswith("g")} == before
    assert (tmp_path / "rep" / "h.md").read_text().startswith(f"# h: {len(RUNS)} run(s)")


def test_each_method_at_its_tuned_settings_is_measured_against_ssgd_at_its_best():
    """A tuned study: S-SGD at two learning rates, a local method at a third and for more epochs,
    one group, one link. Learning rate and length set no step time, so the local method's speedup
    is over S-SGD of its seed, and its target is S-SGD's at the better learning rate; a run over
    another link still has no S-SGD."""

    def tuned(method, seed, step, lr, epochs, points, link="25mbit", finished=0.0):
        config = {"data": {"batch_size": 32}, "model": {"lr": lr}, "max_epochs": epochs}
        cond = {"config": config, "measured": {"link": link, "threads": 1}}
        timeline = [
            {"seconds": s, "epoch": i, "step": 10 * i, "accuracy": 0.4, "loss": loss}
            for i, (s, loss) in enumerate(points)
        ]
        record = run(method, seed, step, 0.4, tau=None if method == "ssgd" else 16, judged_by="loss")
        cid = f"{link}-{lr}-{epochs}"
        return dict(
            record,
            id=f"g/{method}-{cid}-{seed}",
            condition=cond,
            condition_id=cid,
            link=link,
            timeline=timeline,
            finished_at=finished,
        )

    # S-SGD at lr 2e-3 ends at 1.40 and 1.42; at 3e-3 at 1.30 and 1.32: the level is 1.31, the
    # target 1.32, which its seeds reach at 30 s and 36 s (median 33 s).
    coarse = [
        tuned("ssgd", s, 2.0, 2e-3, 4, [(10, 2.0), (20, 1.6), (30, f)], finished=1)
        for s, f in ((0, 1.40), (1, 1.42))
    ]
    best = [
        tuned("ssgd", 0, 2.2, 3e-3, 4, [(10, 2.0), (20, 1.5), (30, 1.30)], finished=2),
        tuned("ssgd", 1, 2.4, 3e-3, 4, [(12, 2.0), (24, 1.4), (36, 1.32)], finished=2),
    ]
    # DiLoCo at lr 4e-3 for 6 epochs: at 1.319 after 8 s and 1.318 after 16 s; 0.5 s a step.
    outer = [
        tuned("diloco", 0, 0.5, 4e-3, 6, [(4, 1.5), (8, 1.319), (12, 1.30)]),
        tuned("diloco", 1, 0.5, 4e-3, 6, [(4, 1.5), (8, 1.4), (16, 1.318)]),
    ]
    elsewhere = tuned("diloco", 0, 0.5, 4e-3, 6, [(1, 1.0)], link="10mbit")
    runs = [*coarse, *best, *outer, elsewhere]

    # The step-time baseline: S-SGD of the same seed, the first to finish (lr 2e-3's, 2.0 s).
    assert speedup(outer[0], runs) == (pytest.approx(4.0), coarse[0]["id"])
    assert speedup(best[1], runs) == (pytest.approx(1.0), best[1]["id"])  # its own settings first
    assert speedup(elsewhere, runs) == (None, None)
    rows = {(r["label"], r["link"], r["condition"]): r for r in report.summarise(runs)}
    row = next(r for (name, link, _), r in rows.items() if name.startswith("DiLoCo") and link == "25mbit")
    assert row["level"] == pytest.approx(1.31) and row["goal_target"] == pytest.approx(1.32)
    assert row["tta"] == pytest.approx(12.0) and row["tta_speedup"] == pytest.approx(33.0 / 12.0)
    assert row["speedup"] == pytest.approx(4.0)  # both seeds over lr 2e-3's runs, the first to finish
    coarse_row = next(r for r in rows.values() if r["method"] == "ssgd" and r["final"] == pytest.approx(1.41))
    assert coarse_row["level"] == pytest.approx(1.31) and coarse_row["tta"] is None  # it never gets there
    other = next(r for (name, link, _), r in rows.items() if link == "10mbit")
    assert other["level"] is None and other["speedup"] is None
