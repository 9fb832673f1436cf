"""Where a benchmark worker trains: the GPU layouts by hand, and the shared-device layout (every
rank a "node" of one device) run for real on the CPU, where it must give a 2-rank run."""

import json

import pytest

from lightning_cocod.launch import launch_workers
from lightning_cocod.tools.worker import describe_placement, placement


def test_a_gpu_per_rank_trains_on_its_own_gpu_over_nccl():
    where = placement("gpu", "cocod", world_size=2, rank=1, gpus=4)
    assert where["trainer"] == {"accelerator": "gpu", "devices": 2, "num_nodes": 1}  # LOCAL_RANK picks cuda:1
    assert where["env"] == {}
    assert where["record"] == {
        "accelerator": "gpu",
        "devices": ["cuda:0", "cuda:1"],
        "backend": "nccl",
        "ranks_per_device": 1,
    }
    assert describe_placement(where["record"]) == "one GPU per rank (cuda:0, cuda:1, NCCL)"


@pytest.mark.parametrize("gpus, one_device", [(1, False), (2, True)])
def test_ranks_sharing_a_gpu_are_nodes_of_one_device_over_gloo(gpus, one_device):
    where = placement("gpu", "ssgd", world_size=2, rank=1, gpus=gpus, one_device=one_device)
    assert where["trainer"] == {"accelerator": "gpu", "devices": 1, "num_nodes": 2}
    assert where["env"] == {"LOCAL_RANK": "0", "NODE_RANK": "1"}  # global rank 1 * 1 + 0, device 0
    assert where["record"]["backend"] == "gloo" and where["record"]["devices"] == ["cuda:0"]
    assert describe_placement(where["record"]).startswith("2 ranks share cuda:0 (gloo on CUDA tensors")


def test_the_bound_runs_alone_on_the_device_its_rank_would_use():
    assert placement("gpu", "bound", 2, 1, gpus=2)["trainer"]["devices"] == [1]
    assert placement("gpu", "bound", 2, 1, gpus=1)["trainer"]["devices"] == [0]
    bound = placement("gpu", "bound", 2, 1, gpus=1)
    assert bound["record"]["backend"] is None and bound["env"] == {}
    assert placement("cpu", "bound", 2, 1, gpus=0)["trainer"] == {
        "accelerator": "cpu",
        "devices": 1,
        "num_nodes": 1,
    }


def test_the_cpu_layout_is_unchanged():
    where = placement("cpu", "cocod", 2, 0, gpus=0)
    assert where["trainer"] == {"accelerator": "cpu", "devices": 2, "num_nodes": 1} and where["env"] == {}
    assert describe_placement(where["record"]) == "CPU workers (gloo)"


@pytest.mark.parametrize(
    "args, message",
    [
        (("tpu", "cocod", 2, 0, 0), "accelerator='tpu' is not understood; accepted: 'cpu', 'gpu'"),
        (("gpu", "cocod", 2, 0, 0), "accelerator='gpu' but torch sees no CUDA device"),
    ],
)
def test_bad_placements_are_one_line_errors(args, message):
    with pytest.raises(ValueError, match=message) as info:
        placement(*args)
    assert "\n" not in str(info.value)


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_ranks_as_nodes_of_one_device_make_a_two_rank_cocod_run(tmp_path):
    spec = {
        "method": "cocod",
        "model": "small_cnn",
        "data": "synthetic",
        "batch_size": 4,
        "lr": 0.05,
        "seed": 0,
        "steps": 4,
        "tau": 2,
        "one_device": True,
    }
    results = launch_workers(
        "lightning_cocod.tools.worker", 2, None, [json.dumps(spec)], timeout_s=170, output_dir=tmp_path
    )
    assert [r["rank"] for r in results] == [0, 1] and all(r["world_size"] == 2 for r in results)
    assert all(r["placement"]["ranks_per_device"] == 2 for r in results)
    # Two rounds of tau=2, each averaging the model over a process group of the two ranks.
    assert [r["comm"]["rounds"] for r in results] == [2, 2]
    assert (
        results[0]["comm"]["bytes_sent"] == results[1]["comm"]["bytes_sent"] >= 2 * results[0]["model_bytes"]
    )


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_every_method_follows_its_rule_with_both_ranks_on_one_device(tmp_path):
    # The layout of tests/gpu/test_cuda_trainer.py (2 ranks sharing one GPU), on the CPU.
    from tests.gpu.test_cuda_trainer import run_and_check

    run_and_check(tmp_path, "cpu")
