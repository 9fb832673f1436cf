"""cocod-report and the group ledger on hand-made runs, with the expected figures worked out by hand."""

import json
import multiprocessing
from pathlib import Path

import pytest
import yaml

from lightning_cocod import report
from lightning_cocod.app import ledger
from lightning_cocod.app.runs import load_runs


def run(method, seed, step, acc, tau=None, workers=2, hidden=None, to_target=None, **extra):
    return {
        "id": f"g/{method}-{tau}-{workers}-{seed}",
        "name": f"{method}-{seed}",
        "group": "g",
        "method": method,
        "tau": tau,
        "workers": workers,
        "seed": seed,
        "test_acc": acc,
        "steady_step_seconds": step,
        "hidden_fraction": hidden,
        "time_to_target_seconds": to_target,
        "target_accuracy": 0.9,
        "git_commit": "abc",
        "git_dirty": False,
        "timeline": [
            {"seconds": step * 10, "epoch": 0, "step": 10, "accuracy": acc / 2},
            {"seconds": step * 20, "epoch": 1, "step": 20, "accuracy": acc},
        ],
        **extra,
    }


RUNS = [
    run("ssgd", 0, 2.0, 0.90),
    run("ssgd", 1, 2.2, 0.92, to_target=30.0),
    run("cocod", 0, 0.7, 0.93, tau=4, hidden=0.9, to_target=10.0),
    run("cocod", 1, 0.7, 0.91, tau=4, hidden=0.8),
    run("local_sgd", 0, 1.05, 0.90, tau=4, hidden=0.0),
    run("cocod", 0, 0.6, 0.92, tau=8, hidden=1.0),
    run("cocod", 0, 0.5, 0.90, tau=4, workers=4, hidden=1.0),  # no S-SGD at 4 workers
]


def write_runs(root: Path, runs=RUNS) -> None:
    for record in runs:
        folder = root / record["id"]
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(record))


def test_table_rows_by_hand(tmp_path):
    rows = {(r["method"], r["tau"], r["workers"]): r for r in report.summarise(RUNS)}
    ssgd, cocod4 = rows[("ssgd", None, 2)], rows[("cocod", 4, 2)]
    # S-SGD: mean step (2.0 + 2.2) / 2 = 2.1; accuracy 91 ± sqrt(((90-91)^2 + (92-91)^2) / 1) = 1.414
    assert ssgd["step"] == pytest.approx(2.1) and ssgd["speedup"] == pytest.approx(1.0)
    assert ssgd["acc_mean"] == pytest.approx(91.0) and ssgd["acc_std"] == pytest.approx(2**0.5)
    assert cocod4["speedup"] == pytest.approx(2.1 / 0.7) and cocod4["hidden"] == pytest.approx(0.85)
    assert cocod4["to_target"] == pytest.approx(10.0) and cocod4["reached"] == 1
    assert rows[("local_sgd", 4, 2)]["speedup"] == pytest.approx(2.0)
    assert rows[("cocod", 8, 2)]["speedup"] == pytest.approx(3.5)
    assert rows[("cocod", 4, 4)]["speedup"] is None

    write_runs(tmp_path / "runs")
    assert report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "g.md").read_text()
    assert "| S-SGD | – | 2 | 0,1 | 91.00 ± 1.41 (n=2) | 2.1000 | 1.00 | – | 30.0 (1/2) |" in table
    assert "| CoCoD-SGD | 4 | 2 | 0,1 | 92.00 ± 1.41 (n=2) | 0.7000 | 3.00 | 85.0% | 10.0 (1/2) |" in table
    assert (
        "| Local-SGD | 4 | 2 | 0 | 90.00 ± 0.00 (n=1) | 1.0500 | 2.00 | 0.0% | not reached (0/1) |" in table
    )
    assert "| CoCoD-SGD | 4 | 4 | 0 | 90.00 ± 0.00 (n=1) | 0.5000 | – | 100.0% |" in table
    assert "time to 90.0% (s)" in table and "Code: abc." in table
    for plot in ("accuracy_vs_time", "speedup_vs_tau", "speedup_vs_workers"):
        assert (tmp_path / "rep" / f"g_{plot}.png").read_bytes().startswith(b"\x89PNG")


def test_wandb_folders_csv_logs_and_ledgers_are_read_and_merged(tmp_path):
    cocod, ssgd, local = RUNS[2], RUNS[0], RUNS[4]
    identity_keys = ("id", "name", "group", "method", "tau", "workers", "seed", "target_accuracy")
    files = tmp_path / "job1" / "wandb" / "run-20260101_000000-abc" / "files"
    files.mkdir(parents=True)
    (files / "config.yaml").write_text(
        yaml.safe_dump(
            {"_wandb": {"value": {}}, "run": {"desc": None, "value": {k: cocod[k] for k in identity_keys}}}
        )
    )
    (files / "wandb-summary.json").write_text(
        json.dumps(
            {
                "final/test_acc": 0.93,
                "final/steady_step_seconds": 0.7,
                "final/hidden_fraction": 0.9,
                "final/timeline": [[7.0, 0.5], [14.0, 0.93]],
                "train/loss": 0.1,
            }
        )
    )
    csv_dir = tmp_path / "job2" / "csv"
    csv_dir.mkdir(parents=True)
    (csv_dir / "hparams.yaml").write_text(
        yaml.safe_dump({"lr": 0.1, "run": {k: ssgd[k] for k in identity_keys}})
    )
    (csv_dir / "metrics.csv").write_text(
        "step,train/loss,final/test_acc,final/steady_step_seconds,curve/seconds,curve/accuracy\n"
        "1,2.3,,,,\n20,,0.9,2.0,,\n10,,,,20.0,0.45\n20,,,,40.0,0.9\n"
    )
    ledger.add_run(tmp_path / "groups" / "g.json", dict(local))
    # The same local_sgd run again, as a run.json missing the speedup the ledger knows.
    (tmp_path / "job3").mkdir()
    (tmp_path / "job3" / "run.json").write_text(
        json.dumps({**local, "speedup_vs_ssgd": None, "steady_step_seconds": None})
    )

    runs = {r["method"]: r for r in load_runs([tmp_path])}
    assert set(runs) == {"cocod", "ssgd", "local_sgd"}
    assert runs["cocod"]["test_acc"] == 0.93 and runs["cocod"]["timeline"][1] == {
        "seconds": 14.0,
        "accuracy": 0.93,
    }
    assert runs["ssgd"]["steady_step_seconds"] == 2.0 and [
        p["seconds"] for p in runs["ssgd"]["timeline"]
    ] == [20.0, 40.0]
    assert runs["local_sgd"]["steady_step_seconds"] == 1.05  # filled in from the ledger


def test_ledger_speedup_now_or_when_ssgd_arrives(tmp_path):
    path = tmp_path / "groups" / "g.json"
    cocod, _ = ledger.add_run(path, dict(RUNS[2]))
    assert cocod["speedup_vs_ssgd"] is None  # no S-SGD yet
    _, filled = ledger.add_run(path, dict(RUNS[0]))
    assert filled == [RUNS[2]["id"]]
    assert ledger.read(path)[RUNS[2]["id"]]["speedup_vs_ssgd"] == pytest.approx(2.0 / 0.7)
    local, _ = ledger.add_run(path, dict(RUNS[4]))
    assert local["speedup_vs_ssgd"] == pytest.approx(2.0 / 1.05)
    other_size, _ = ledger.add_run(path, dict(RUNS[6]))
    assert other_size["speedup_vs_ssgd"] is None  # S-SGD ran with 2 workers, not 4


def _add_many(path: str, worker: int) -> None:
    for i in range(10):
        ledger.add_run(Path(path), run("cocod", seed=100 * worker + i, step=1.0, acc=0.5, tau=4))


@pytest.mark.timeout(60)
def test_ledger_keeps_every_run_of_concurrent_writers(tmp_path):
    path = tmp_path / "groups" / "g.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_add_many, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(ledger.read(path)) == 40


def test_no_runs_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cocod-report: error: no finished runs under") and err.count("\n") == 1
