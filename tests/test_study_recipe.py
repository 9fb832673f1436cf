"""The accuracy study's recipe end to end, in miniature: every sweep runs through the app with 2
workers per job, and cocod-report writes the table and both accuracy plots from its records."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# 400 training signals, 32 per rank x 2 ranks: 6 optimizer steps per epoch, 2 epochs.
MINIATURE = [
    "data.num_samples=600",
    "max_epochs=2",
    "model.warmup_epochs=0",
    "model.milestones=[1,1.5]",
    "step_time_warmup=2",
    "checkpoint.every_n_epochs=0",
    "progress_every_s=0",
]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_the_study_recipe_runs_every_sweep_and_reports_them(tmp_path):
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # cocod-train, cocod-report
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the MNIST-1D cache
        "OUT_ROOT": str(tmp_path / "out"),
        "RUN_ID": "mini",
        "WORKERS": "2",
        "SEEDS": "0",
        "TAUS": "2",  # with the half-progress run at 4: two periods, so the accuracy-against-tau plot
        "PYTHONWARNINGS": "ignore",
    }
    done = subprocess.run(
        ["bash", str(REPO / "recipes" / "mnist1d_study.sh"), *MINIATURE],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report_dir = tmp_path / "out" / "mnist1d" / "mini-report"
    table = (report_dir / "mnist1d-mini.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    # S-SGD and Pipe-SGD once; Local-SGD and CoCoD at tau 2; CoCoD auto; half progress at 4.
    expected = [
        ("S-SGD", "–"), ("Pipe-SGD", "–"), ("Local-SGD", "2"),
        ("CoCoD-SGD", "2"), ("CoCoD-SGD", "auto"), ("CoCoD-SGD (progress 0.5)", "4"),
    ]
    assert [tuple(cell.strip() for cell in row.split("|")[1:3]) for row in rows] == expected
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")]
        accuracy, speedup = cells[6], cells[8]
        assert 0 <= float(accuracy) <= 100 and float(speedup) > 0  # every run has its S-SGD baseline
    for plot in ("accuracy_vs_time", "accuracy_vs_tau"):
        assert (report_dir / f"mnist1d-mini_{plot}.png").read_bytes().startswith(b"\x89PNG")
    assert list((tmp_path / "cache" / "lightning_cocod" / "mnist1d").glob("*.npz"))  # generated once, cached
