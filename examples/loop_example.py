"""CoCoD-SGD in a plain PyTorch loop, on 2 CPU worker processes started by torchrun:

    torchrun --nproc-per-node=2 examples/loop_example.py    # about 10 s on a 2-core machine

The three lines marked ``# lightning_cocod`` are all it adds to the same script training each
worker on its own shard (without them, it is that script: tests/loop/test_examples.py runs both).
scikit-learn's handwritten digits need no download. CoCoD's options are the recommended ones for
SGD: ``tau="auto"``, the shortest period that hides each round, at most 2 (longer ones cost
accuracy: README, "What tau="auto"'s bound rests on").
"""

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn

from lightning_cocod.loop import CoCoD  # lightning_cocod


def main() -> None:
    dist.init_process_group("gloo")  # torchrun says where the other workers are
    rank, world = dist.get_rank(), dist.get_world_size()
    digits = load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float32) / 16, torch.tensor(digits.target)
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    shard = torch.arange(rank, len(train_x), world)  # the same number of steps on every worker
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = torch.Generator().manual_seed(rank)
    cocod = CoCoD(model, optimizer).start()  # lightning_cocod
    for epoch in range(5):
        for batch in shard[torch.randperm(len(shard), generator=order)].split(32):
            loss = nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean()
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {accuracy:.3f} (worker 0's model)")
    cocod.close()  # lightning_cocod: the pending round merged, every worker's model the average
    with torch.no_grad():
        accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean()
    if rank == 0:
        print(f"final: test accuracy {accuracy:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
