"""Classifiers (ResNet18, VGG16-BN, SmallCNN, the MNIST-1D CNN) and the LightningModule that trains them;
a small GPT and its LightningModule."""

from lightning_cocod.models.classifier import ClassifierModule
from lightning_cocod.models.gpt import GPT, GPTModule
from lightning_cocod.models.nets import MNIST1DCNN, MODEL_NAMES, VGG16, ResNet18, SmallCNN, build_model

__all__ = [
    "GPT",
    "MNIST1DCNN",
    "MODEL_NAMES",
    "VGG16",
    "ClassifierModule",
    "GPTModule",
    "ResNet18",
    "SmallCNN",
    "build_model",
]
