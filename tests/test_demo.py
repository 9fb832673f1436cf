"""The main job and the benchmark as a user runs them: a small demo end to end, bad options."""

import json
import re
import subprocess
import sys

import pytest

from lightning_cocod.tools import bench, demo


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_small_demo_prints_the_table_and_writes_the_plot(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_cocod.tools.demo", "--epochs", "1", "--methods", "ssgd,cocod",
         "--width", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=230, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^\| S-SGD +\|", proc.stdout, re.MULTILINE) and "| CoCoD-SGD tau=4" in proc.stdout
    assert "parameters" in proc.stdout and "link:" in proc.stdout  # model size and link are printed
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 4 and table[0].startswith("| method")
    assert (out / "accuracy_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    for method in ("ssgd", "cocod"):
        ranks = results[method]
        assert len(ranks) == 2 and all(r["test_acc"] is not None for r in ranks)
        assert ranks[0]["timeline"], "accuracy against wall time was recorded"
    assert results["cocod"][0]["comm"]["rounds"] >= 5  # 22 steps, tau=4


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (demo, ["--rate", "3 mbps"], "rate '3 mbps'"),
        (demo, ["--methods", "cocod,fast"], "--methods fast not understood; accepted: ssgd, pipe_sgd, local_sgd"),
        (demo, ["--workers", "1"], "--workers must be at least 2, got 1"),
        (bench, ["--rates", "100mbit,lots"], "rate 'lots'"),
        (bench, ["--steps", "5"], "--steps 5 is too few"),
    ],
)
def test_bad_options_get_one_clear_line(module, argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--out", str(tmp_path / "never")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()  # nothing written
