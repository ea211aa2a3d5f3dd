"""StatePack: the state of training survives a checkpoint bit for bit, RNG streams included."""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ecrl.contract.ckptfile import FOOTER_SIZE, CheckpointError, read_verified, seal
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.trainer.models import build_model


def _round_trip(tree: object, tmp_path: Path) -> object:
    encoded = statepack.encode(tree, meta={"global_step": 1})
    image = mmap.mmap(-1, encoded.layout.size + FOOTER_SIZE)
    statepack.snapshot_into(encoded, memoryview(image))
    seal(memoryview(image), encoded.layout.size)
    path = tmp_path / "s.ckpt"
    path.write_bytes(image[: encoded.layout.size + FOOTER_SIZE])
    return statepack.decode(read_verified(path))


def _trained(name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)),
                                          torch.tensor([1, 2])).backward()
        opt.step()
        sched.step()
    return model, opt, sched


@pytest.mark.parametrize("name", ["tiny-cnn", "resnet18"])
def test_training_state_round_trips_exactly(name: str, tmp_path: Path) -> None:
    model, opt, sched = _trained(name)
    tree = {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict()}  # type: ignore[attr-defined]
    back = _round_trip(tree, tmp_path)
    assert isinstance(back, dict)
    fresh, fresh_opt, fresh_sched = _trained(name)
    fresh.load_state_dict(back["model"])
    fresh_opt.load_state_dict(back["optimizer"])
    fresh_sched.load_state_dict(back["scheduler"])  # type: ignore[attr-defined]
    for key, value in model.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key]), key
    assert back["scheduler"] == sched.state_dict()  # type: ignore[attr-defined]
    # the optimizer's momentum buffers (int-keyed state) came back too
    for i, state in opt.state_dict()["state"].items():
        assert torch.equal(state["momentum_buffer"], back["optimizer"]["state"][i][
            "momentum_buffer"])


def test_special_values_keep_their_types(tmp_path: Path) -> None:
    tree = {"t": (1, 2.5, None, "s", True), "inf": float("inf"), "nan": float("nan"),
            3: "int key", "nested": [{"$tensor": "user key that looks like a tag"}],
            "empty": torch.empty(0, 3), "half": torch.arange(4, dtype=torch.bfloat16),
            "scalar": torch.tensor(7), "np": np.arange(5, dtype=np.uint32)}
    back = _round_trip(tree, tmp_path)
    assert isinstance(back, dict)
    assert back["t"] == (1, 2.5, None, "s", True) and isinstance(back["t"], tuple)
    assert back["inf"] == float("inf") and back["nan"] != back["nan"]
    assert back[3] == "int key"
    assert back["nested"] == [{"$tensor": "user key that looks like a tag"}]
    assert back["empty"].shape == (0, 3)
    assert torch.equal(back["half"], tree["half"]) and back["half"].dtype == torch.bfloat16
    assert torch.equal(back["scalar"], tree["scalar"]) and back["scalar"].dim() == 0
    assert back["np"].dtype == np.uint32 and back["np"].tolist() == [0, 1, 2, 3, 4]


def test_unsupported_values_are_named() -> None:
    with pytest.raises(CheckpointError, match=r"state\.bad: values of type object"):
        statepack.encode({"bad": object()}, meta={})


def test_rng_state_restores_every_stream(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = _round_trip(statepack.rng_state(), tmp_path)
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    statepack.set_rng_state(saved)  # type: ignore[arg-type]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws
