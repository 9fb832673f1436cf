"""Classifiers (ResNet18, VGG16-BN, SmallCNN, the MNIST-1D CNN) and the LightningModule that trains them;
a small GPT and its LightningModule."""

from __future__ import annotations

from typing import Any

from torch import nn

from lightning_cocod.models.classifier import ClassifierModule
from lightning_cocod.models.gpt import GPT, GPTModule
from lightning_cocod.models.nets import MNIST1DCNN, VGG16, ResNet18, SmallCNN

_MODELS = {"resnet18": ResNet18, "vgg16": VGG16, "small_cnn": SmallCNN, "mnist1d_cnn": MNIST1DCNN}
MODEL_NAMES = tuple(_MODELS)


def build_model(name: str, num_classes: int, in_channels: int = 3, **kw: Any) -> nn.Module:
    """Builds a network by name; extra keyword arguments go to the constructor (e.g. ``width``)."""
    if name not in _MODELS:
        raise ValueError(f"unknown model name {name!r}; accepted names: {', '.join(MODEL_NAMES)}")
    return _MODELS[name](num_classes=num_classes, in_channels=in_channels, **kw)


__all__ = [
    "GPT", "MODEL_NAMES", "MNIST1DCNN", "VGG16", "ClassifierModule", "GPTModule", "ResNet18", "SmallCNN", "build_model",
]
