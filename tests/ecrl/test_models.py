"""Models: the tiny CNN and torchvision's ResNets, freshly initialised, never downloaded."""

from __future__ import annotations

import pytest
import torch

from ecrl.contract.errors import ConfigError
from ecrl.runtime.trainer.models import MODELS, build_model


@pytest.mark.parametrize("name", MODELS)
def test_models_classify_32px_images(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)
    torch.manual_seed(0)
    again = build_model(name, num_classes=7)
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # initialisation follows torch's seed


def test_tiny_cnn_dropout_uses_the_rng() -> None:
    model = build_model("tiny-cnn", num_classes=10).train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(1)
    first = model(x)
    torch.manual_seed(2)
    assert not torch.equal(first, model(x))


def test_unknown_model() -> None:
    with pytest.raises(ConfigError, match="resnet34"):
        build_model("resnet34", num_classes=10)


def test_params_digest_covers_every_tensor() -> None:
    from ecrl.runtime.trainer.trainer import params_digest

    torch.manual_seed(0)
    state = build_model("resnet18", num_classes=10).state_dict()  # has 0-dim int64 buffers
    digest = params_digest(state)
    assert digest.startswith("sha256:") and digest == params_digest(dict(state))
    state["layer1.0.bn1.num_batches_tracked"] += 1
    assert params_digest(state) != digest


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("classes", "side"), [(10, 32), (100, 64), (7, 17)])
def test_the_torch_free_parameter_count_is_the_models_own(name: str, classes: int,
                                                          side: int) -> None:
    # ecrl run refuses a run that cannot fit in memory from this count, before any rank starts.
    from ecrl.runtime.settings import TrainerSettings

    with torch.device("meta"):
        model = build_model(name, num_classes=classes, side=side)
    count = sum(p.numel() for p in model.parameters())
    assert TrainerSettings(model=name, image_size=side).model_parameters(classes) == count
