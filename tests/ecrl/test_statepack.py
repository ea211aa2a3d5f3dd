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
    # the path through lists, tuples and non-string keys, however deep
    deep = {"ok": torch.ones(2), "a": [1, {"b": (2.0, {3: [None, {1, 2}]})}]}
    with pytest.raises(CheckpointError, match=r"^cannot checkpoint "
                       r"state\.a\[1\]\.b\[1\]\[3\]\[1\]: values of type set "):
        statepack.encode(deep, meta={})
    with pytest.raises(CheckpointError, match=r"^cannot checkpoint state\['k'\]: .* type bytes"):
        statepack.encode({("t",): 1, "k": b"x"}, meta={})


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


def _mixed_tensors() -> list[torch.Tensor]:
    """Small tensors of the kinds a checkpoint holds: counters (0-dim int64), flags, half
    precision, a transposed (non-contiguous) matrix, BatchNorm-sized vectors."""
    g = torch.Generator().manual_seed(3)
    return [torch.tensor(7, dtype=torch.int64), torch.tensor([True, False, True]),
            torch.randn(5, generator=g).half(), torch.randn(4, 3, generator=g).t(),
            torch.randn(64, generator=g), torch.randint(0, 9, (2, 2, 2), generator=g)]


def test_small_tensors_copied_in_one_transfer_land_byte_for_byte() -> None:
    # The batching is for device tensors (one device-to-host transfer instead of hundreds);
    # its arithmetic of offsets and views is the same for any device, so it is checked here on
    # the CPU against the one-by-one copy.
    tensors = _mixed_tensors()
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets = [sum(sizes[:i]) + 8 * i for i in range(len(sizes))]  # gaps between them
    batched, one_by_one = bytearray(offsets[-1] + sizes[-1] + 8), None
    statepack.copy_in_one_transfer(memoryview(batched),
                                   [(o, n, t) for o, n, t in zip(offsets, sizes, tensors,
                                                                 strict=True)])
    one_by_one = bytearray(len(batched))
    for o, t in zip(offsets, tensors, strict=True):
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        one_by_one[o:o + len(data)] = data
    assert batched == one_by_one


@pytest.mark.gpu
def test_a_cuda_state_snapshots_to_the_bytes_of_its_cpu_copy() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10).cuda()
    state = {"model": model.state_dict(), "small": _mixed_tensors()}
    on_cpu = {"model": {k: v.cpu() for k, v in state["model"].items()},
              "small": state["small"]}
    state["small"] = [t.cuda() for t in state["small"]]
    images = []
    for s in (state, on_cpu):
        encoded = statepack.encode(s, meta={"global_step": 0})
        image = bytearray(encoded.layout.size)
        statepack.snapshot_into(encoded, memoryview(image))
        images.append(bytes(image))
    assert images[0] == images[1]


def _rebuild_pieces_of(source: torch.Tensor, like: torch.Tensor,
                       boxes: list[tuple[list[int], list[int]]], *,
                       dtype: str = "float32") -> torch.Tensor:
    """Rebuild a ``$sharded`` node of ``like``'s shape whose pieces are ``source``'s 2-D boxes
    (offsets, sizes)."""
    pieces = [source[a:a + n, b:b + m].contiguous() for (a, b), (n, m) in boxes]
    entries = [{"dtype": "float32", "shape": list(p.shape), "nbytes": p.numel() * 4}
               for p in pieces]
    tree = {"w": {statepack.SHARDED: {"dtype": dtype, "shape": list(like.shape),
                                      "pieces": [[i, offsets] for i, (offsets, _)
                                                 in enumerate(boxes)]}}}
    return statepack.rebuild_from_bytes(
        tree, entries, lambda i: pieces[i].reshape(-1).view(torch.uint8), where="ckpt")["w"]


def test_a_sharded_tensor_is_tiled_back_whole_from_uneven_pieces() -> None:
    whole = torch.arange(35, dtype=torch.float32).reshape(5, 7)
    # FSDP2's dim-0 shards of 5 rows over 2 ranks (3 + 2), the second cut again by columns
    boxes = [([0, 0], [3, 7]), ([3, 0], [2, 4]), ([3, 4], [2, 3])]
    assert torch.equal(_rebuild_pieces_of(whole, whole, boxes), whole)


@pytest.mark.parametrize(("boxes", "why"), [
    ([([0, 0], [3, 7]), ([2, 0], [3, 7])], "overlap"),
    ([([0, 0], [3, 7]), ([3, 0], [1, 7])], "cover 28 of its 35"),
    ([([0, 0], [3, 7]), ([3, 1], [2, 7])], "do not fit"),
])
def test_pieces_that_overlap_leave_a_gap_or_run_outside_are_refused(
        boxes: list[tuple[list[int], list[int]]], why: str) -> None:
    whole = torch.zeros(5, 8, dtype=torch.float32)  # wide enough to cut every box out of
    node_shape = torch.zeros(5, 7)
    with pytest.raises(CheckpointError, match=why):
        _rebuild_pieces_of(whole, node_shape, boxes)


def test_a_piece_of_another_dtype_is_refused() -> None:
    whole = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with pytest.raises(CheckpointError, match="do not fit"):
        _rebuild_pieces_of(whole, whole, [([0, 0], [2, 3])], dtype="float64")


def test_a_forged_whole_shape_is_refused_before_anything_that_size_is_allocated() -> None:
    """A manifest naming a whole of 10^15 elements over one real piece of 35: refused from the
    pieces' count, never allocated (that would be 4 PB)."""
    whole = torch.arange(35, dtype=torch.float32).reshape(5, 7)
    with pytest.raises(CheckpointError, match="cover 35 of its"):
        _rebuild_pieces_of(whole, torch.empty((10**14, 10), device="meta"),
                           [([0, 0], [5, 7])])


def test_tensor_references_are_read_in_the_encoders_order_and_renumbered_in_place() -> None:
    """A subtree encoded on its own (RNG states gathered after the boundary) is put where an
    earlier encoding's stand-in was: its i-th tensor takes the stand-in's i-th index."""
    rngs = {"world_size": 2, "ranks": [statepack.rng_state(), statepack.rng_state()]}
    state = {"model": {"w": torch.ones(2), "b": torch.zeros(1)}, "rng": rngs,
             "odd": {1: np.arange(3), "t": (torch.ones(1), 2.5)}}
    tree, values, _entries = statepack.encode_tree(state)
    assert statepack.tensor_refs(tree) == list(range(len(values)))
    where = statepack.tensor_refs(tree["rng"])
    assert where == list(range(2, 8))  # after the model's two tensors, in walk order
    alone, alone_values, _ = statepack.encode_tree(rngs)
    assert statepack.tensor_refs(alone) == list(range(len(alone_values))) == list(range(6))
    placed = statepack.renumber_refs(alone, where)
    assert placed == tree["rng"]
    assert statepack.tensor_refs(statepack.renumber_refs(tree["odd"], [40, 41])) == [40, 41]
    with pytest.raises(ValueError, match="more indices"):
        statepack.renumber_refs(alone, [*where, 99])
