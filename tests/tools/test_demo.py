"""The main job and the benchmark as a user runs them: a small demo end to end, bad options."""

import json
import math
import re
import subprocess
import sys

import pytest

from lightning_cocod.models import SmallCNN
from lightning_cocod.tools import bench, demo


@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_small_demo_prints_the_table_and_writes_the_plot(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        # tau=2: rounds of every length the epoch allows (22 steps), and more of them to count.
        [
            sys.executable,
            "-m",
            "lightning_cocod.tools.demo",
            "--epochs",
            "1",
            "--methods",
            "ssgd,cocod:int8",
            "--tau",
            "2",
            "--width",
            "16",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^\| S-SGD +\|", proc.stdout, re.MULTILINE) and "| CoCoD-SGD tau=2 int8 " in proc.stdout
    assert "parameters" in proc.stdout and "link:" in proc.stdout  # model size and link are printed
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 4 and table[0].startswith("| method") and "| MB sent/round" in table[0]
    assert (out / "accuracy_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    for method in ("ssgd", "cocod:int8"):
        ranks = results[method]
        assert len(ranks) == 2 and all(r["test_acc"] is not None for r in ranks)
        assert ranks[0]["timeline"], "accuracy against wall time was recorded"
    assert results["cocod:int8"][0]["comm"]["rounds"] >= 10  # 22 steps, tau=2
    # What a rank sent per round, from the rounds the workers recorded. The model's floating-point
    # tensors (parameters and BatchNorm statistics) travel: fp32 over a ring of 2 is 4 bytes an
    # element (the first compressed round is exact fp32); int8 is one byte an element and a 4-byte
    # scale per 2,048, of this rank's chunk (padded to whole blocks) out in the all-to-all and the
    # other's in the all-gather.
    net = SmallCNN(in_channels=1, num_classes=10, width=16)
    elements = sum(t.numel() for t in [*net.parameters(), *net.buffers()] if t.is_floating_point())
    fp32_bytes = 4 * elements
    chunk = math.ceil(elements / 2 / 2048) * 2048
    int8_bytes = 2 * (chunk + 4 * chunk // 2048)
    int8_rounds = results["cocod:int8"][0]["rounds"]
    assert [r[4] for r in int8_rounds] == [fp32_bytes] + [int8_bytes] * (len(int8_rounds) - 1)
    # The table's last two columns: MB sent per round, codec seconds per round (and their share).
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[-3:-1]] for row in table[2:]}
    assert cells["S-SGD"] == ["-", "-"]
    assert cells["CoCoD-SGD tau=2 int8"][0] == f"{int8_bytes / 1e6:.3f}"
    assert float(cells["CoCoD-SGD tau=2 int8"][1].split()[0]) > 0 and "%)" in cells["CoCoD-SGD tau=2 int8"][1]


def test_the_table_shows_a_dash_where_a_figure_does_not_apply():
    specs = demo.parse_args(["--methods", "ssgd,pipe_sgd,local_sgd,cocod,cocod:int8", "--tau", "2"]).specs

    def ranks(sent: float, codec: float, recorded: bool = True) -> list[dict]:
        # What a worker records: 8 steps of 0.5 s, and each collective as [launch step, finish
        # step, seconds, exposed seconds, bytes sent, bytes received, codec seconds].
        rounds = [[k, k + 2, 0.1, 0.0, sent, sent, codec] for k in range(0, 8, 2)] if recorded else []
        rank = {
            "test_acc": 0.9,
            "timeline": [{"seconds": 4.0, "accuracy": 0.9}],
            "train_seconds": 4.0,
            "step_ends": [0.5 * k for k in range(1, 9)],
            "tau": 2,
            "rounds": rounds,
            "comm": {"comm_seconds": 0.4, "exposed_seconds": 0.1} if recorded else None,
        }
        return [rank, rank]

    results = {
        "ssgd": ranks(0, 0.0, recorded=False),  # Lightning's DDP: nothing recorded
        "pipe_sgd": ranks(4e6, 0.0),  # a gradient all-reduce every step, recorded, but no rounds
        "local_sgd": ranks(4e6, 0.0),
        "cocod": ranks(4e6, 0.0),
        "cocod:int8": ranks(1e6, 0.02),
    }
    table = demo.results_table(specs, results).splitlines()
    assert "| MB sent/round | codec s/round (of its steps) |" in table[0]
    cells = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[-3:-1]] for row in table[2:]}
    assert cells["S-SGD"] == cells["Pipe-SGD"] == ["-", "-"]
    assert cells["Local-SGD tau=2"] == cells["CoCoD-SGD tau=2"] == ["4.000", "-"]
    # A round: 2 steps of the run's 0.5 s; the codec took 0.02 s of it.
    assert cells["CoCoD-SGD tau=2 int8"] == ["1.000", "0.0200 (2.0%)"]


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (demo, ["--rate", "3 mbps"], "rate '3 mbps'"),
        (
            demo,
            ["--methods", "cocod,fast"],
            "--methods: method 'fast' not understood; accepted: ssgd, pipe_sgd, local_sgd",
        ),
        (
            demo,
            ["--methods", "cocod:int4"],
            "option 'int4' of method 'cocod:int4' not understood; accepted: ",
        ),
        (demo, ["--methods", "cocod:auto"], "the demo runs fixed periods without proportional sampling"),
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
