"""VGG16 with BatchNorm in the CIFAR form of kuangliu/pytorch-cifar (``features`` + ``classifier``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

# "M" is a 2x2 max-pool; five of them take 32x32 down to 1x1, which is why the classifier is 512 wide.
VGG16_CONFIG: list[int | str] = [
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
]


class VGG16(nn.Module):
    """Expects 32x32 inputs: the single Linear(512, num_classes) assumes a 1x1 final feature map."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for v in VGG16_CONFIG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                # The conv keeps its bias, as in kuangliu's code: it is what the published
                # parameter count (14,728,266 for 10 classes) includes.
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                channels = v
        # A no-op on the 1x1 map; kept so state-dict keys and module indices match kuangliu's.
        layers.append(nn.AvgPool2d(kernel_size=1, stride=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
