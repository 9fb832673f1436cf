"""A small CNN for CPU demos and tests: trains on 8x8 digits in seconds, also accepts 32x32 images."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class SmallCNN(nn.Module):
    """Four 3x3 conv-BN-ReLU blocks (width, width, 2*width, 2*width) with one 2x2 max-pool in the middle.

    About 148k parameters at the default width of 48. The global average pool before the linear layer
    makes the network independent of the input resolution (8x8 digits, 32x32 CIFAR).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 48) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"SmallCNN width must be a positive int, got {width!r}")
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, width),
            *_conv_bn_relu(width, width),
            nn.MaxPool2d(2),
            *_conv_bn_relu(width, 2 * width),
            *_conv_bn_relu(2 * width, 2 * width),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
