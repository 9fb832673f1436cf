"""One rank of tests/gpu/test_cuda_trainer.py: fits the toy regression with each method in turn,
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


def main(out_dir: str, accelerator: str, layout: str = "shared") -> None:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if accelerator == "gpu" else 0
    where = placement(accelerator, "cocod", world_size, rank, gpus, one_device=layout == "shared")
    os.environ.update(where["env"])
    devices = {}
    for name, (method, tau) in RUNS.items():
        module = toy.ToyRegression(STEPS, str(Path(out_dir) / name))
        trainer = pl.Trainer(
            **where["trainer"],
            strategy=make_strategy(method, tau, where["record"]["backend"]),
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
    write_result({"rank": rank, "devices": devices, "placement": where["record"]})


if __name__ == "__main__":
    main(*sys.argv[1:])
