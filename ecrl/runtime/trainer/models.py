"""The models a run can train: a tiny CNN (tests, demo), with or without BatchNorm, and
torchvision's ResNet-18/50."""

from __future__ import annotations

import torch
from torch import nn

from ecrl.contract.errors import ConfigError
from ecrl.runtime.runconfig import MODELS

__all__ = ["MODELS", "GlobalMeanPool", "TinyCNN", "build_model"]


class GlobalMeanPool(nn.Module):
    """The mean over the spatial dimensions: what torchvision's ``AdaptiveAvgPool2d((1, 1))``
    computes, through an op with a deterministic backward on CUDA (adaptive pooling's raises
    under ``torch.use_deterministic_algorithms(True)``, which every run sets)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


class TinyCNN(nn.Module):
    """Two conv blocks and a linear head (about 30k parameters for 32x32 inputs).

    Its dropout draws from torch's RNG every step, so a resume that failed to restore the RNG
    state would change the trajectory: the bit-identity tests depend on that. ``batchnorm``
    (``--model tiny-cnn-bn``) adds a BatchNorm after each convolution: buffers that the forward
    pass changes, which a checkpoint taken mid-step (``jit``) must save as the step before left
    them.
    """

    def __init__(self, num_classes: int, *, channels: int = 3, side: int = 32,
                 batchnorm: bool = False) -> None:
        super().__init__()

        def norm(width: int) -> list[nn.Module]:
            return [nn.BatchNorm2d(width)] if batchnorm else []

        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), *norm(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), *norm(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1),
                                  nn.Linear(32 * (side // 4) ** 2, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_model(name: str, *, num_classes: int, side: int = 32) -> nn.Module:
    """A freshly initialised model (from torch's current RNG state; weights are never fetched)."""
    if name in ("tiny-cnn", "tiny-cnn-bn"):
        return TinyCNN(num_classes, side=side, batchnorm=name == "tiny-cnn-bn")
    if name in ("resnet18", "resnet50"):
        from torchvision import models

        factory = models.resnet18 if name == "resnet18" else models.resnet50
        model = factory(weights=None, num_classes=num_classes)
        model.avgpool = GlobalMeanPool()
        return model
    raise ConfigError(f"unknown --model {name!r}: choose one of {', '.join(MODELS)}")
