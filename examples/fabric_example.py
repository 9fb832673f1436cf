"""CoCoD-SGD under Lightning Fabric, on 2 CPU worker processes:

    python examples/fabric_example.py    # about 15 s on a 2-core machine

``import lightning_cocod`` registers "cocod", "local_sgd" and "pipe_sgd" in Fabric's strategy
registry, at the recommended ``tau="auto"`` (or pass ``lightning_cocod.fabric.CoCoDFabricStrategy(...)``
for other options: ``compression="int8"`` on a slow link). Fabric starts the
second worker by running this script again, hence the ``__main__`` guard.
"""

import torch
from lightning_fabric import Fabric
from sklearn.datasets import load_digits
from torch import nn

import lightning_cocod  # noqa: F401 - registers strategy="cocod" in Fabric


def main() -> None:
    fabric = Fabric(strategy="cocod", accelerator="cpu", devices=2)
    fabric.launch()
    digits = load_digits()
    x, y = torch.tensor(digits.data, dtype=torch.float32) / 16, torch.tensor(digits.target)
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    shard = torch.arange(fabric.global_rank, len(train_x), fabric.world_size)
    fabric.seed_everything(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    order = torch.Generator().manual_seed(fabric.global_rank)
    for epoch in range(5):
        for batch in shard[torch.randperm(len(shard), generator=order)].split(32):
            fabric.backward(nn.functional.cross_entropy(model(train_x[batch]), train_y[batch]))
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad(), fabric.strategy.loop.averaged():  # the workers' average
            accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean()
        fabric.print(f"epoch {epoch}: test accuracy {accuracy:.3f}")
    fabric.strategy.loop.close()  # the last round merged: every worker holds the same weights


if __name__ == "__main__":
    main()
