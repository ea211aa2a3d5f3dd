"""Models: the tiny CNN, torchvision's ResNets and tiny-gpt, freshly initialised, never
downloaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ecrl.contract.errors import ConfigError
from ecrl.runtime.trainer.models import MODELS, build_model

IMAGE_MODELS = [m for m in MODELS if m != "tiny-gpt"]


@pytest.mark.parametrize("name", IMAGE_MODELS)
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


def test_tiny_gpt_predicts_every_next_token_causally() -> None:
    from ecrl.runtime.settings import TINY_GPT
    from ecrl.runtime.trainer.datasets import GeneratedTokens

    torch.manual_seed(0)
    model = build_model("tiny-gpt", num_classes=TINY_GPT["vocab"]).eval()
    x, y = GeneratedTokens(size=10).batch(np.arange(3))
    assert x.shape == y.shape == (3, TINY_GPT["seq_len"]) and torch.equal(x[:, 1:], y[:, :-1])
    with torch.no_grad():
        out = model(x)
        changed = x.clone()
        changed[:, -1] = (changed[:, -1] + 1) % TINY_GPT["vocab"]
        later = model(changed)
    assert out.shape == (3, TINY_GPT["seq_len"], TINY_GPT["vocab"])
    # causal: a change to the last token leaves every earlier position's prediction alone
    assert torch.equal(out[:, :-1], later[:, :-1]) and not torch.equal(out[:, -1], later[:, -1])


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


# Modules whose CUDA backward has no deterministic kernel: under the deterministic algorithms
# every run sets, the first backward on a GPU raises (torch.use_deterministic_algorithms' list).
_NO_DETERMINISTIC_CUDA_BACKWARD = (
    torch.nn.AdaptiveAvgPool2d, torch.nn.AdaptiveAvgPool3d, torch.nn.AdaptiveMaxPool2d,
    torch.nn.AvgPool3d, torch.nn.MaxPool3d, torch.nn.FractionalMaxPool2d,
    torch.nn.FractionalMaxPool3d, torch.nn.ReflectionPad1d, torch.nn.ReflectionPad2d,
    torch.nn.ReflectionPad3d)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_can_train_deterministically_on_a_gpu(name: str) -> None:
    model = build_model(name, num_classes=10)
    assert not [m for m in model.modules() if isinstance(m, _NO_DETERMINISTIC_CUDA_BACKWARD)]


def test_resnet_global_pooling_computes_torchvisions_average() -> None:
    from torchvision import models

    torch.manual_seed(0)
    ours = build_model("resnet18", num_classes=10).eval()
    torch.manual_seed(0)
    theirs = models.resnet18(weights=None, num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_every_model_trains_a_step_on_cuda_under_deterministic_algorithms(name: str) -> None:
    import torch.nn.functional as F

    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            torch.manual_seed(0)
            model = build_model(name, num_classes=10).cuda().train()
            x = torch.randn(4, 3, 32, 32, device="cuda")
            F.cross_entropy(model(x), torch.arange(4, device="cuda")).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        assert torch.equal(grads[0], grads[1])  # bit-identical: the algorithms are deterministic
    finally:
        torch.use_deterministic_algorithms(False)
