"""The step timer on the CPU with a tiny model (the GPU check runs it on ResNet18)."""

import json
import socket
import time
import types

import pytest
import torch
import torch.distributed as dist
from torch import nn

from lightning_cocod.callbacks import metrics
from lightning_cocod.tools import steptime, worker


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def linear(name, classes, **_):
    return nn.Sequential(nn.Flatten(), nn.Linear(3072, classes))


def test_bare_and_product_timed_side_by_side(tmp_path, capsys, monkeypatch):
    # The timing, not the model, is under test: the bare loop's and the product's (the worker's).
    monkeypatch.setattr(steptime, "build_model", linear)
    monkeypatch.setattr(worker, "build_model", linear)
    out = tmp_path / "steptime.json"
    args = ["--model", "small_cnn", "--batch-size", "8", "--steps", "3", "--warmup", "2", "--json", str(out)]
    assert steptime.main(args) == 0
    figures = json.loads(out.read_text())
    assert figures["bare_seconds"] > 0 and figures["product_seconds"] > 0
    assert figures["ratio"] == pytest.approx(figures["product_seconds"] / figures["bare_seconds"])
    assert figures["sync_report"] == {}  # only on CUDA
    printed = capsys.readouterr().out
    assert "bare PyTorch loop" in printed and f"{figures['ratio']:.2f}x the bare loop" in printed


def test_the_product_window_counts_exactly_the_timed_steps(monkeypatch):
    # The window's clock is a counter that step k (0-based) advances by 2**k: the measured figure
    # names exactly which steps the window held (a warm-up step in it, or a timed one missing,
    # gives another sum), whatever the machine's speed.
    from lightning_cocod.models import ClassifierModule

    monkeypatch.setattr(worker, "build_model", linear)
    clock = [0.0]  # the step timer's clock
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock[0], monotonic=time.monotonic)
    monkeypatch.setattr(metrics, "time", fake_time)

    original = ClassifierModule.training_step

    def counted(self, batch, batch_idx):
        clock[0] += 2.0**self.trainer.global_step
        return original(self, batch, batch_idx)

    monkeypatch.setattr(ClassifierModule, "training_step", counted)
    seconds, _ = steptime.product_seconds("small_cnn", 4, steps=3, warmup=2, device=torch.device("cpu"))
    assert clock[0] == 2.0**5 - 1  # all five steps ran
    assert seconds == (2.0**2 + 2.0**3 + 2.0**4) / 3  # steps 2, 3 and 4: the timed ones


def test_allreduce_worker_times_the_models_collective(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    spec = {"model": "small_cnn", "accelerator": "cpu", "warmup": 1, "repeats": 3}
    result = steptime.allreduce_worker(json.dumps(spec))
    numel = sum(p.numel() for p in steptime.build_model("small_cnn", 10).parameters())
    assert result["bytes"] == 4 * numel and len(result["seconds"]) == 3 and min(result["seconds"]) > 0
    assert result["placement"]["accelerator"] == "cpu"
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--allreduce", "1"], "--allreduce needs at least 2 ranks, got 1"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--accelerator", "tpu"], "invalid choice: 'tpu'"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        steptime.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_gpu_without_cuda_says_so(capsys):
    with pytest.raises(SystemExit):
        steptime.main(["--accelerator", "gpu"])
    assert "torch sees no CUDA device" in capsys.readouterr().err
