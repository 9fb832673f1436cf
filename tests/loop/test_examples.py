"""The loop API's examples run as their docstrings say, on 2 CPU workers, and learn."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]


def run(*command: str, env: dict[str, str] | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=280, check=False, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def final_accuracy(output: str) -> float:
    epochs = re.findall(r"epoch (\d+): test accuracy ([0-9.]+)", output)
    assert [int(e) for e, _ in epochs] == list(range(5)), output  # printed once, by rank 0
    final = re.findall(r"final: test accuracy ([0-9.]+)", output)
    return float(final[0] if final else epochs[-1][1])


def test_the_plain_pytorch_example_runs_under_torchrun():
    output = run(
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "examples/loop_example.py"
    )
    assert final_accuracy(output) > 0.85  # ten classes: chance is 0.1


def test_the_example_is_three_lines_added_to_a_script_that_runs_without_the_package(tmp_path):
    lines = (ROOT / "examples" / "loop_example.py").read_text().splitlines(keepends=True)
    ours = [line for line in lines if "  # lightning_cocod" in line]  # a code line's own comment
    assert len(ours) == 3
    without = tmp_path / "without.py"
    without.write_text("".join(line for line in lines if line not in ours))
    assert "lightning_cocod" not in without.read_text().replace("# lightning_cocod", "")
    # One worker is enough to show it runs alone: torchrun's variables, set by hand.
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    one = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port.getsockname()[1]),
    }
    port.close()
    output = run(sys.executable, str(without), env=one)
    assert final_accuracy(output) > 0.5  # the worker alone still learns


def test_the_fabric_example_runs():
    assert final_accuracy(run(sys.executable, "examples/fabric_example.py")) > 0.85


def final_val_loss(output: str) -> tuple[float, float, float]:
    steps = re.findall(r"step (\d+): train loss", output)
    assert [int(s) for s in steps] == [50, 100, 150, 200], output  # printed by rank 0 alone
    (final,) = re.findall(r"final: val loss ([0-9.]+) \(unigram ([0-9.]+), optimum ([0-9.]+)\)", output)
    return tuple(float(v) for v in final)


def test_the_gpt_example_runs_under_torchrun_and_learns_the_text():
    example = "examples/gpt_loop_example.py"
    output = run(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", example)
    loss, unigram, optimum = final_val_loss(output)
    assert optimum < loss < unigram - 0.2  # context used: well below the best context-free loss


def test_the_gpt_example_is_three_lines_added_to_a_script_that_runs_without_them(tmp_path):
    lines = (ROOT / "examples" / "gpt_loop_example.py").read_text().splitlines(keepends=True)
    ours = [line for line in lines if "  # lightning_cocod" in line]
    assert len(ours) == 3
    without = tmp_path / "without.py"
    without.write_text("".join(line for line in lines if line not in ours))
    # What is left uses the package's network and text source, none of its training machinery.
    text = without.read_text()
    assert "CoCoD(" not in text and "cocod.close" not in text
    for allowed in ("# lightning_cocod", "lightning_cocod.models.gpt", "lightning_cocod.data.markov"):
        text = text.replace(allowed, "")
    assert "lightning_cocod" not in text
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    one = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port.getsockname()[1]),
    }
    port.close()
    loss, unigram, optimum = final_val_loss(run(sys.executable, str(without), env=one))
    assert optimum < loss < unigram - 0.2  # the worker alone still learns
