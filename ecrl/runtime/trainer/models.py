"""The models a run can train: a tiny CNN (tests, demo), with or without BatchNorm,
torchvision's ResNet-18/50, and a tiny transformer language model (``tiny-gpt``, the model of the
mesh runs: FSDP2, HSDP and tensor parallelism)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ecrl.contract.errors import ConfigError
from ecrl.runtime.runconfig import MODELS
from ecrl.runtime.settings import TINY_GPT

__all__ = ["MODELS", "GlobalMeanPool", "TinyCNN", "TinyGPT", "build_model", "parallelize"]


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


class _Attention(nn.Module):
    """Causal self-attention. The head count is read from the projections' local width, so that
    the same code runs whole and split column-wise over tensor-parallel ranks (each then holds
    ``heads / TP`` of the heads; torchtitan's layout)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, -1))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = _Attention(width, heads)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """A small decoder-only transformer language model (``--model tiny-gpt``): token and
    position embeddings, pre-norm blocks of causal attention and an MLP, a linear head over the
    vocabulary; its sizes are :data:`ecrl.runtime.settings.TINY_GPT`'s.

    No dropout: under tensor parallelism the residual stream is replicated over the
    tensor-parallel peers, and a mask drawn from each rank's own stream (the run's per-rank RNG
    policy) would make the replicas disagree."""

    def __init__(self, *, vocab: int, width: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def parallelize(model: nn.Module, *, dp_mesh: Any, tp_mesh: Any = None) -> nn.Module:
    """Shard ``model`` in place for a mesh run: tensor parallelism over ``tp_mesh`` (tiny-gpt
    only: attention's q, k, v and the MLP's first layer column-wise, their output projections
    row-wise), then FSDP2 over ``dp_mesh`` (a 2-D one is HSDP: replicate x shard), per block
    and at the root."""
    from torch.distributed.fsdp import fully_shard

    if tp_mesh is not None:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        if not isinstance(model, TinyGPT):
            raise ConfigError("--tp needs --model tiny-gpt (the model with a tensor-parallel "
                              "plan)")
        for block in model.blocks:
            parallelize_module(block, tp_mesh, {
                "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def build_model(name: str, *, num_classes: int, side: int = 32) -> nn.Module:
    """A freshly initialised model (from torch's current RNG state; weights are never fetched).
    For ``tiny-gpt`` ``num_classes`` is the vocabulary."""
    if name == "tiny-gpt":
        return TinyGPT(vocab=num_classes, width=TINY_GPT["width"], layers=TINY_GPT["layers"],
                       heads=TINY_GPT["heads"], seq_len=TINY_GPT["seq_len"])
    if name in ("tiny-cnn", "tiny-cnn-bn"):
        return TinyCNN(num_classes, side=side, batchnorm=name == "tiny-cnn-bn")
    if name in ("resnet18", "resnet50"):
        from torchvision import models

        factory = models.resnet18 if name == "resnet18" else models.resnet50
        model = factory(weights=None, num_classes=num_classes)
        model.avgpool = GlobalMeanPool()
        return model
    raise ConfigError(f"unknown --model {name!r}: choose one of {', '.join(MODELS)}")
