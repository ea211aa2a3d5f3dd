"""Pipelined ``overlapped`` snapshots: exact images, in-place writes caught, updates that wait.

Real pieces throughout: the ``overlapped`` strategy with its background writer process, real
files and fsyncs, a real model and optimizer. The only stand-in is a gate in front of the real
background copy, which holds it back so that the tests can act while it is still pending.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ecrl.contract.ckptfile import read_verified
from ecrl.contract.runformat import CheckpointEvent, JsonlReader, RunPaths
from ecrl.contract.semantics import Geometry
from ecrl.runtime.checkpoint import pipeline, statepack
from ecrl.runtime.checkpoint.persist import read_latest
from ecrl.runtime.checkpoint.strategies import CheckpointContext, OverlappedCheckpoints


class _Job:
    def __init__(self) -> None:
        torch.manual_seed(0)
        # BatchNorm: its running statistics change in the forward pass (copied at the boundary).
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                                         torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.user = {"ema": torch.ones(8)}  # a user object's tensor: never deferred

    def forward_backward(self) -> None:
        self.opt.zero_grad()
        x = torch.randn(16, 32)
        torch.nn.functional.cross_entropy(self.model(x), torch.randint(0, 4, (16,))).backward()

    def step(self) -> None:
        self.forward_backward()
        self.opt.step()

    def capture(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "user": dict(self.user), "rng": {"world_size": 1, "ranks": rngs}}

    def boundary_copy(self) -> dict[str, Any]:
        """The state at this moment, cloned: what a checkpoint taken now must hold."""
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()},
                "optimizer": {i: s["momentum_buffer"].clone()
                              for i, s in self.opt.state_dict()["state"].items()},
                "user": self.user["ema"].clone()}


def _strategy(root: Path, job: _Job, *, optimizers: bool = True) -> OverlappedCheckpoints:
    paths = RunPaths.of(root)
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    ctx = CheckpointContext(
        paths=paths, attempt=0, rank=0, world_size=1,
        geometry=Geometry(dataset_size=1000, global_batch=10), target_steps=100, every=1,
        keep=5, max_inflight=2, capture=job.capture, meta=lambda step: {"global_step": step},
        optimizers=(job.opt,) if optimizers else ())
    return OverlappedCheckpoints(ctx)


def _after_two_steps(root: Path, *, optimizers: bool = True
                     ) -> tuple[_Job, OverlappedCheckpoints, dict[str, Any]]:
    """A job two steps in, its strategy prepared, and a copy of its state at that boundary."""
    job = _Job()
    strategy = _strategy(root, job, optimizers=optimizers)
    job.step()
    strategy.prepare()
    job.step()
    return job, strategy, job.boundary_copy()


def _saved(root: Path, step: int) -> dict[str, Any]:
    ckpt = read_verified(RunPaths.of(root).checkpoints / f"step-{step:08d}.ckpt")
    tree = statepack.decode(ckpt)
    assert isinstance(tree, dict)
    return tree


def _assert_holds(saved: dict[str, Any], expected: dict[str, Any]) -> None:
    assert saved["model"].keys() == expected["model"].keys()
    for key, value in expected["model"].items():
        assert torch.equal(saved["model"][key], value), key
    for index, value in expected["optimizer"].items():
        assert torch.equal(saved["optimizer"]["state"][index]["momentum_buffer"], value), index
    assert torch.equal(saved["user"]["ema"], expected["user"])


def _events(root: Path) -> list[CheckpointEvent]:
    return [e for _, e in JsonlReader(RunPaths.of(root).checkpoint_log(0), CheckpointEvent,
                                      torn_tail_ok=False)]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Holds the real background copy until the event is set; records when it finished."""
    release = threading.Event()
    order: list[str] = []
    real: Callable[..., float] = pipeline._copy_deferred

    def held(*args: Any) -> float:
        release.wait(timeout=60)
        seconds = real(*args)
        order.append("copied")
        return seconds

    monkeypatch.setattr(pipeline, "_copy_deferred", held)
    yield release, order
    release.set()


def test_split_defers_only_optimizer_driven_tensors() -> None:
    job = _Job()
    job.step()
    state = statepack.encode(job.capture([statepack.rng_state()]), meta={})
    now, later = pipeline.split_deferred(state, pipeline.optimizer_storages([job.opt]))
    deferred = {pipeline.tensor_path(state.tree, i) for i in later}
    params = {f"model.{name}" for name, _ in job.model.named_parameters()}
    momenta = {f"optimizer.state[{i}].momentum_buffer" for i in range(len(params))}
    assert deferred == params | momenta
    kept = {pipeline.tensor_path(state.tree, i) for i in now}
    assert {"model.1.running_mean", "model.1.running_var", "model.1.num_batches_tracked",
            "user.ema", "rng.ranks[0].torch"} <= kept


def test_the_pipeline_sees_an_optimizers_new_state_tensors() -> None:
    job = _Job()
    job.step()
    piped = pipeline.SnapshotPipeline([job.opt], on_ready=lambda *_: None,
                                      on_torn=lambda *_: None)
    try:
        first = piped.storages()
        assert first == pipeline.optimizer_storages([job.opt])
        # a resume's load_state_dict gives the optimizer new momentum tensors
        job.opt.load_state_dict(copy.deepcopy(job.opt.state_dict()))
        assert piped.storages() == pipeline.optimizer_storages([job.opt]) != first
    finally:
        piped.close()


def test_pipelined_checkpoint_is_the_boundary_state_exactly(tmp_path: Path) -> None:
    job, strategy, expected = _after_two_steps(tmp_path)
    strategy.checkpoint(1)
    assert strategy._pipeline is not None and strategy._pipeline.pending is not None
    # The next step: its forward pass changes BatchNorm's statistics, its update every
    # parameter and momentum buffer; none of it may reach the checkpoint of step 1.
    job.step()
    strategy.close()
    _assert_holds(_saved(tmp_path, 1), expected)
    assert not torch.equal(job.model.state_dict()["1.running_mean"],
                           expected["model"]["1.running_mean"])
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None and latest.global_step == 1
    event, = _events(tmp_path)
    assert event.extra["pipelined"] is True and event.extra["deferred_bytes"] > 0
    assert event.stall_s >= event.extra["boundary_s"] + event.extra["wait_s"]


def test_the_update_waits_for_the_copy(tmp_path: Path,
                                       gate: tuple[threading.Event, list[str]]) -> None:
    release, order = gate
    job, strategy, expected = _after_two_steps(tmp_path)
    job.opt.register_step_post_hook(lambda *_: order.append("step"))
    strategy.checkpoint(1)
    job.forward_backward()  # does not wait: the copy is still held back
    assert order == []
    threading.Timer(0.2, release.set).start()
    job.opt.step()  # must not update a parameter before the copy is complete
    assert order == ["copied", "step"]
    strategy.close()
    _assert_holds(_saved(tmp_path, 1), expected)


def test_an_in_place_write_during_the_copy_drops_the_checkpoint(
        tmp_path: Path, gate: tuple[threading.Event, list[str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    release, _ = gate
    job, strategy, _ = _after_two_steps(tmp_path)
    strategy.checkpoint(1)
    with torch.no_grad():  # a user's clamp before the next update, while the copy is pending
        job.model[0].weight.clamp_(-0.01, 0.01)
    release.set()
    job.step()
    err = capsys.readouterr().err
    assert "checkpoint of step 1 dropped: model.0.weight was modified in place" in err
    assert len(err.strip().splitlines()) == 1
    # Never committed, not even partly: no file, no event, no pointer.
    paths = RunPaths.of(tmp_path)
    assert read_latest(paths) is None and not (paths.checkpoints / "step-00000001.ckpt").exists()
    # The next checkpoint is copied synchronously, and holds its boundary exactly.
    expected = job.boundary_copy()
    strategy.checkpoint(2)
    assert strategy._pipeline is not None and strategy._pipeline.pending is None
    with torch.no_grad():
        job.model[0].weight.clamp_(-0.001, 0.001)
    job.step()
    strategy.close()
    _assert_holds(_saved(tmp_path, 2), expected)
    event, = _events(tmp_path)
    assert event.global_step == 2 and "pipelined" not in event.extra


def test_a_state_without_an_optimizer_is_copied_at_the_boundary(tmp_path: Path) -> None:
    job, strategy, expected = _after_two_steps(tmp_path, optimizers=False)
    strategy.checkpoint(1)
    assert strategy._pipeline is None
    job.step()
    strategy.close()
    _assert_holds(_saved(tmp_path, 1), expected)
    event, = _events(tmp_path)
    assert "pipelined" not in event.extra
