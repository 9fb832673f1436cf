"""Two ranks through real Trainers, each method against the reference simulation of its rule in
tests/helpers/toy.py and, for DiLoCo's outer round, tests/rounds/test_outer_round.py (computed on the CPU): sharing one GPU (gloo on CUDA tensors), and with a GPU
each over NCCL where the machine has two."""

from pathlib import Path

import pytest
import torch

from lightning_cocod.launch import launch_workers
from tests.gpu.toy_worker import OUTER_RUNS, STEPS
from tests.helpers import toy
from tests.rounds.test_outer_round import reference_outer

pytestmark = pytest.mark.timeout(240)  # under the GPU check's cap on its test stage

WORLD = 2


def references():
    return {
        "cocod_tau3": toy.reference_cocod(WORLD, STEPS, 3),
        "cocod_tau1": toy.reference_cocod(WORLD, STEPS, 1),
        "local_sgd": toy.reference_local_sgd(WORLD, STEPS, 4),
        "pipe_sgd": toy.reference_pipe_sgd(WORLD, STEPS),
        "ssgd": toy.reference_ssgd(WORLD, STEPS),
        **{name: reference_outer(WORLD, STEPS, tau, overlap) for name, (tau, overlap) in OUTER_RUNS.items()},
    }


def run_and_check(out_dir: Path, accelerator: str, layout: str = "shared") -> None:
    """Both ranks on one device of ``accelerator`` (the CPU run of this is in
    test_worker_placement), or with ``layout="per-rank"`` one GPU each over NCCL."""
    script = str(Path(__file__).with_name("toy_worker.py"))
    results = launch_workers(
        script, WORLD, None, [out_dir, accelerator, layout], timeout_s=220, output_dir=out_dir / "logs"
    )
    for result in results:
        if layout == "shared":
            assert (
                result["placement"]["backend"] == "gloo" and result["placement"]["ranks_per_device"] == WORLD
            )
            assert set(result["devices"].values()) == {"cuda:0" if accelerator == "gpu" else "cpu"}
        else:
            assert result["placement"]["backend"] == "nccl" and result["placement"]["ranks_per_device"] == 1
            assert set(result["devices"].values()) == {f"cuda:{result['rank']}"}
        # The outer step's state stays on the device of its model (no host round trip).
        assert result["outer_devices"] == {name: list(set(result["devices"].values())) for name in OUTER_RUNS}
    for name, (trajectory, final) in references().items():
        ranks = toy.read_ranks(out_dir / name, WORLD)
        for r, record in enumerate(ranks):
            got = torch.tensor(record["trajectory"], dtype=torch.float64)
            want = torch.tensor([step[r] for step in trajectory], dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-8, msg=f"{name}, rank {r}")
            torch.testing.assert_close(
                torch.tensor(record["final"]),
                torch.tensor(final[r]),
                rtol=0,
                atol=1e-8,
                msg=f"{name}, rank {r}",
            )


def test_two_ranks_on_one_gpu_follow_each_rule(tmp_path):
    run_and_check(tmp_path, "gpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between ranks needs a GPU per rank (2)")
def test_two_ranks_with_a_gpu_each_follow_each_rule_over_nccl(tmp_path):
    run_and_check(tmp_path, "gpu", layout="per-rank")
