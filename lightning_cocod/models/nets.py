"""The networks: ResNet18 and VGG16-BN in the CIFAR forms of kuangliu/pytorch-cifar, a small CNN for
CPU demos and tests, and the MNIST-1D paper's 1-D CNN.

The kuangliu networks keep that repository's attribute names (conv1, bn1, layer1..layer4, linear,
shortcut; features + classifier), so its checkpoints load with ``load_state_dict`` and parameter
counts can be compared one to one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_cocod._options import is_int, positive_int, require


class _FeaturesThenLinear(nn.Module):
    """``classifier(flatten(features(x)))``: subclasses set both."""

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        # No conv bias: the BatchNorm right after it has its own shift, a bias would be redundant.
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """3x3 stem without max-pool (32x32 inputs are too small to downsample early), [2, 2, 2, 2] blocks."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_planes = 64
        for index, (planes, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
            blocks = nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes))
            setattr(self, f"layer{index}", blocks)
            in_planes = planes
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        # kuangliu uses avg_pool2d(out, 4); on 32x32 inputs the map is 4x4 so the adaptive pool is
        # the same operation, and it keeps other input sizes from failing at the linear layer.
        out = F.adaptive_avg_pool2d(out, 1)
        return self.linear(torch.flatten(out, 1))


def _conv_bn_relu(cin: int, cout: int, bias: bool) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=bias), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


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


class VGG16(_FeaturesThenLinear):
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
                layers += _conv_bn_relu(channels, v, bias=True)
                channels = v
        # A no-op on the 1x1 map; kept so state-dict keys and module indices match kuangliu's.
        layers.append(nn.AvgPool2d(kernel_size=1, stride=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)


class SmallCNN(_FeaturesThenLinear):
    """Four 3x3 conv-BN-ReLU blocks (width, width, 2*width, 2*width) with one 2x2 max-pool in the middle.

    For CPU demos and tests: trains on 8x8 digits in seconds. About 148k parameters at the default
    width of 48. The global average pool before the linear layer makes the network independent of
    the input resolution (8x8 digits, 32x32 CIFAR).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 48) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"SmallCNN width must be a positive int, got {width!r}")
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, width, bias=False),
            *_conv_bn_relu(width, width, bias=False),
            nn.MaxPool2d(2),
            *_conv_bn_relu(width, 2 * width, bias=False),
            *_conv_bn_relu(2 * width, 2 * width, bias=False),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * width, num_classes)


# (kernel, stride, padding) of the three convolutions, as in the paper's CNN.
_MNIST1D_LAYERS = ((5, 2, 1), (3, 2, 1), (3, 2, 1))


class MNIST1DCNN(_FeaturesThenLinear):
    """The MNIST-1D paper's ``ConvBase`` (Greydanus 2020): three stride-2 1-D convolutions with
    ReLU, then one linear layer on the flattened features.

    The paper uses 25 channels (about 5 k parameters, ~94% test accuracy on its 4,000-signal split);
    the default 32 gives about 8 k. ``length`` is the signal length (40 for MNIST-1D): the linear
    layer's input size follows from it, so the network holds no lazily shaped parameters (the
    strategies' flat buffers need every shape before the first step).
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, channels: int = 32, length: int = 40
    ) -> None:
        super().__init__()
        sizes = {"in_channels": in_channels, "num_classes": num_classes, "channels": channels}
        for name, value in sizes.items():
            positive_int("MNIST1DCNN", name, value)
        out = length
        for kernel, stride, padding in _MNIST1D_LAYERS:
            out = (out + 2 * padding - kernel) // stride + 1
        require(
            is_int(length) and out >= 1, "MNIST1DCNN", "length", length, "an integer >= 3 (the signal length)"
        )
        layers: list[nn.Module] = []
        for cin, (kernel, stride, padding) in zip((in_channels, channels, channels), _MNIST1D_LAYERS):
            layers += [nn.Conv1d(cin, channels, kernel, stride, padding), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels * out, num_classes)


_MODELS = {"resnet18": ResNet18, "vgg16": VGG16, "small_cnn": SmallCNN, "mnist1d_cnn": MNIST1DCNN}
MODEL_NAMES = tuple(_MODELS)


def build_model(name: str, num_classes: int, in_channels: int = 3, **kw: Any) -> nn.Module:
    """Builds a network by name; extra keyword arguments go to the constructor (e.g. ``width``)."""
    if name not in _MODELS:
        raise ValueError(f"unknown model name {name!r}; accepted names: {', '.join(MODEL_NAMES)}")
    return _MODELS[name](num_classes=num_classes, in_channels=in_channels, **kw)
