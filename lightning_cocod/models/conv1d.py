"""The MNIST-1D paper's convolutional network (Greydanus 2020, ``ConvBase``), for 1-D signals."""

from __future__ import annotations

import torch
from torch import Tensor, nn

# (kernel, stride, padding) of the three convolutions, as in the paper's CNN.
_LAYERS = ((5, 2, 1), (3, 2, 1), (3, 2, 1))


class MNIST1DCNN(nn.Module):
    """Three stride-2 1-D convolutions with ReLU, then one linear layer on the flattened features.

    The paper uses 25 channels (about 5 k parameters, ~94% test accuracy on its 4,000-signal split);
    the default 32 gives about 8 k. ``length`` is the signal length (40 for MNIST-1D): the linear
    layer's input size follows from it, so the network holds no lazily shaped parameters (the
    strategies' flat buffers need every shape before the first step).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, channels: int = 32, length: int = 40) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes), ("channels", channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MNIST1DCNN: {name}={value!r} is invalid; accepted: a positive integer")
        out = length
        for kernel, stride, padding in _LAYERS:
            out = (out + 2 * padding - kernel) // stride + 1
        if isinstance(length, bool) or not isinstance(length, int) or out < 1:
            raise ValueError(f"MNIST1DCNN: length={length!r} is invalid; accepted: an integer >= 3 (the signal length)")
        layers: list[nn.Module] = []
        cin = in_channels
        for kernel, stride, padding in _LAYERS:
            layers += [nn.Conv1d(cin, channels, kernel, stride, padding), nn.ReLU(inplace=True)]
            cin = channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels * out, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))
