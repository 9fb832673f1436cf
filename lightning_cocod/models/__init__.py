"""Classifiers (ResNet18, VGG16-BN, SmallCNN, the MNIST-1D CNN) and the LightningModule that trains them."""

from __future__ import annotations

from typing import Any

from torch import nn

from lightning_cocod.models.classifier import ClassifierModule
from lightning_cocod.models.conv1d import MNIST1DCNN
from lightning_cocod.models.resnet import ResNet18
from lightning_cocod.models.small import SmallCNN
from lightning_cocod.models.vgg import VGG16

MODEL_NAMES = ("resnet18", "vgg16", "small_cnn", "mnist1d_cnn")


def build_model(name: str, num_classes: int, in_channels: int = 3, **kw: Any) -> nn.Module:
    """Builds a network by name; extra keyword arguments go to the constructor (e.g. ``width``)."""
    if name == "resnet18":
        return ResNet18(num_classes=num_classes, in_channels=in_channels, **kw)
    if name == "vgg16":
        return VGG16(num_classes=num_classes, in_channels=in_channels, **kw)
    if name == "small_cnn":
        return SmallCNN(in_channels=in_channels, num_classes=num_classes, **kw)
    if name == "mnist1d_cnn":
        return MNIST1DCNN(in_channels=in_channels, num_classes=num_classes, **kw)
    raise ValueError(f"unknown model name {name!r}; accepted names: {', '.join(MODEL_NAMES)}")


__all__ = ["MODEL_NAMES", "MNIST1DCNN", "VGG16", "ClassifierModule", "ResNet18", "SmallCNN", "build_model"]
