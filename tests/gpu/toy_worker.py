"""One rank of tests/gpu/test_cuda_trainer.py: fits the toy regression with each method in turn
(DiLoCo's outer round at three overlaps among them),
placed as the benchmark places them: every rank on the same device (gloo on CUDA tensors), or
with LAYOUT "per-rank" one GPU per rank (NCCL).

    python tests/gpu/toy_worker.py OUT_DIR ACCELERATOR [LAYOUT]     (started by launch_workers)
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `tests.helpers`

import pytorch_lightning as pl
import torch

from lightning_cocod import DiLoCoStrategy
from lightning_cocod.launch import write_result
from lightning_cocod.tools.worker import make_strategy, placement
from tests.helpers import toy

STEPS = 10
RUNS = {
    "cocod_tau3": ("cocod", 3),
    "cocod_tau1": ("cocod", 1),
    "local_sgd": ("local_sgd", 4),
    "pipe_sgd": ("pipe_sgd", None),
    "ssgd": ("ssgd", None),
}
# DiLoCo's outer round (Nesterov outer SGD): tau, overlap (none, one step, the whole period).
OUTER_RUNS = {f"diloco_overlap{d}": (4, d) for d in (0, 1, 4)}


def main(out_dir: str, accelerator: str, layout: str = "shared") -> None:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if accelerator == "gpu" else 0
    where = placement(accelerator, "cocod", world_size, rank, gpus, one_device=layout == "shared")
    os.environ.update(where["env"])
    backend = where["record"]["backend"]
    strategies = {
        name: lambda m=method, t=tau: make_strategy(m, t, backend) for name, (method, tau) in RUNS.items()
    }
    for name, (tau, overlap) in OUTER_RUNS.items():
        strategies[name] = lambda t=tau, d=overlap: DiLoCoStrategy(
            tau=t, overlap=d, process_group_backend=backend
        )
    devices, outer_devices = {}, {}
    for name, make in strategies.items():
        module = toy.ToyRegression(STEPS, str(Path(out_dir) / name))
        trainer = pl.Trainer(
            **where["trainer"],
            strategy=make(),
            max_steps=STEPS,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
        )
        trainer.fit(module)
        devices[name] = str(trainer.strategy.root_device)
        if name in OUTER_RUNS:  # where theta and the outer momentum lived
            outer = trainer.strategy.rounds.round
            momentum = [outer.optimizer.state[b]["momentum_buffer"] for b in outer.theta.buckets]
            outer_devices[name] = sorted({str(t.device) for t in [*outer.theta.buckets, *momentum]})
    write_result(
        {"rank": rank, "devices": devices, "outer_devices": outer_devices, "placement": where["record"]}
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
