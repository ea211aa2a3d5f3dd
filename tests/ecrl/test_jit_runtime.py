"""ecrl.runtime.checkpoint.jit, watchdog and endings, in one process (the real-process tests are in
tests/integration/test_jit*.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from ecrl.contract.runformat import MAX_LINE_BYTES, RunPaths
from ecrl.runtime.checkpoint import registry
from ecrl.runtime.checkpoint.jit import JitCheckpoints, _copy_into, _KillHook, logged_through
from ecrl.runtime.checkpoint.watchdog import Watchdog, WatchdogConfig
from ecrl.runtime.endings import read_ending


def _lines(path: Path, steps: list[int], *, pad: int = 0, torn: bool = False) -> None:
    body = "".join(json.dumps({"global_step": s, "pad": "x" * pad}) + "\n" for s in steps)
    path.write_text(body + ('{"global_step": 99, "pa' if torn else ""))


def test_logged_through_reads_the_last_complete_line(tmp_path: Path) -> None:
    log = tmp_path / "rank-001.jsonl"
    assert logged_through(log) is None
    _lines(log, [0, 1, 2], torn=True)
    assert logged_through(log) == 2  # the torn 99 does not count
    _lines(log, list(range(50)), pad=40_000)  # lines longer than the first chunk read
    assert logged_through(log) == 49
    log.write_text('{"global_step": 3, "x')
    assert logged_through(log) is None


def test_logged_through_trusts_only_a_regular_log_and_reads_a_bounded_tail(
        tmp_path: Path) -> None:
    # A peer's log planted as a FIFO (no writer: opening it to read would wait for good) or a
    # link elsewhere is not read: the rescue saves nothing rather than hang or trust it.
    fifo = tmp_path / "rank-001.jsonl"
    os.mkfifo(fifo)
    seen: list[int | None] = []
    reader = threading.Thread(target=lambda: seen.append(logged_through(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)  # the test's timeout: a reader blocked on the FIFO fails here
    assert seen == [None]
    outside = tmp_path / "outside.jsonl"
    _lines(outside, [0, 1, 2])
    link = tmp_path / "rank-002.jsonl"
    link.symlink_to(outside)
    assert logged_through(link) is None and logged_through(outside) == 2
    # A tail without a newline for longer than the format's line limit holds no step.
    huge = tmp_path / "rank-003.jsonl"
    _lines(huge, [7])
    with huge.open("ab") as handle:
        handle.write(b"x" * (3 * MAX_LINE_BYTES))
    assert logged_through(huge) is None


def test_copy_into_reuses_buffers_and_is_independent() -> None:
    src = {"w": torch.arange(4.0), "groups": [{"lr": 0.1, "params": [0]}], "m": None}
    first = _copy_into(src, None)
    buffer = first["w"]
    src["w"] += 1
    assert torch.equal(first["w"], torch.arange(4.0))  # a copy, not a view
    second = _copy_into(src, first)
    assert second["w"] is buffer and torch.equal(buffer, torch.arange(4.0) + 1)
    assert second["groups"] == [{"lr": 0.1, "params": [0]}] and second["m"] is None


def test_kill_hook_parses_and_targets_one_rank_and_attempt() -> None:
    hook = _KillHook("5:forward:1:0,9:post-optimizer:1:2", rank=1, attempt=2)
    assert (hook.step, hook.phase) == (9, "post-optimizer")
    assert _KillHook("5:forward", rank=0, attempt=0).step is None  # default rank 1
    with pytest.raises(ValueError, match="ECRL_JIT_KILL"):
        _KillHook("5:backward", rank=1, attempt=0)


def test_jit_is_registered_and_built() -> None:
    assert "jit" in registry.built_strategies()
    assert registry.strategy_class("jit") is JitCheckpoints


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_watchdog_bound_and_firing() -> None:
    fired: list[tuple[float, float, int | None]] = []
    clock = _Clock()
    dog = Watchdog(WatchdogConfig(multiple=10, floor_s=2.0),
                   lambda w, b, s: fired.append((w, b, s)), clock=clock)
    assert not dog.check()  # not armed before the first beat
    for step in range(100):
        dog.beat(step)
        clock.now += 0.1
    assert dog.bound() == pytest.approx(2.0)  # 10 x 0.1 s is under the floor
    dog.boundary(5.0)
    assert dog.bound() == pytest.approx(7.0)
    clock.now += 6.0
    assert not dog.check()
    clock.now += 1.5
    assert dog.check() and fired[0][2] == 99 and fired[0][0] > fired[0][1]
    assert not dog.check()  # once
    fixed = Watchdog(WatchdogConfig(bound_s=3.0), lambda *a: None, clock=clock)
    assert fixed.bound() == 3.0 and not WatchdogConfig(bound_s=0).enabled
    with pytest.raises(ValueError):
        WatchdogConfig(bound_s=-1)


def test_endings_name_the_stopped_rank(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    directory = paths.attempt_dir(3)
    directory.mkdir(parents=True)
    assert read_ending(paths, 3, 4) is None
    (directory / "jit.json").write_text(json.dumps({"rank": 0, "saved": True,
                                                    "global_step": 7}))
    assert read_ending(paths, 3, 4).status == "jit"  # type: ignore[union-attr]
    for rank in (0, 2, 3):
        (directory / f"hung-rank-{rank:03d}.json").write_text(json.dumps({"bound_s": 3.0}))
    ending = read_ending(paths, 3, 4)
    assert ending is not None and ending.status == "hung" and ending.stopped_ranks == (1,)
    assert ending.jit is not None and ending.to_dict()["stopped_ranks"] == [1]
    (directory / "deadline.json").write_text(json.dumps({"global_step": 7}))
    assert read_ending(paths, 3, 4).status == "deadline"  # type: ignore[union-attr]


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _attached(tmp_path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer
              ) -> JitCheckpoints:
    """A one-rank jit strategy over ``model`` and ``opt``, attached at step 0."""
    from ecrl.contract.semantics import Geometry
    from ecrl.runtime.checkpoint.strategies import CheckpointContext

    ctx = CheckpointContext(
        paths=RunPaths.of(tmp_path), attempt=0, rank=0, world_size=1,
        geometry=Geometry(dataset_size=64, global_batch=8), target_steps=100, every=0, keep=2,
        max_inflight=1, capture=lambda rngs: {"model": model.state_dict(),
                                              "optimizer": opt.state_dict()},
        meta=lambda step: {}, optimizers=(opt,))
    jit = JitCheckpoints(ctx)
    jit.attach(start=0, optimizers=[opt], modules=[model], reseed=lambda step: None)
    return jit


@pytest.mark.parametrize("pipelined", [True, False])
def test_the_copy_before_each_update_is_the_state_after_the_step_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipelined: bool) -> None:
    from ecrl.runtime.checkpoint import jit as jit_module

    # This model is tiny: below the threshold its copy is taken in the pre-hook; at 0, by the
    # background pipeline from each boundary on.
    monkeypatch.setattr(jit_module, "_PIPELINE_MIN_BYTES", 0 if pipelined else 1 << 40)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    jit = _attached(tmp_path, model, opt)
    assert (jit._pipeline is not None) == pipelined
    after: dict[int, object] = {}
    held: list[torch.Tensor] = []  # every weight copy the shadow held (kept alive: no id reuse)
    for step in range(6):
        model(torch.randn(16, 4)).square().mean().backward()  # moves BatchNorm's statistics
        opt.step()  # the pre-hook copies the state as it was after the step before
        opt.zero_grad()
        assert jit._shadow_step == step - 1
        if step:
            # Parameters, momentum and the running statistics the forward started from.
            assert _same(jit._shadow, after[step - 1])
            assert jit._shadow["model"]["0.weight"].data_ptr() != model[0].weight.data_ptr()
            if not any(jit._shadow["model"]["0.weight"] is t for t in held):
                held.append(jit._shadow["model"]["0.weight"])
        jit.step_completed(step)
        jit.boundary_done()
        after[step] = _copy_into({"model": model.state_dict(), "optimizer": opt.state_dict()},
                                 None)
    # two sets of copies, allocated once, taking turns (the one in force is never written to)
    assert len(held) == 2
    jit.close()


def test_a_tensor_written_after_the_boundary_is_copied_as_the_update_found_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The copy of parameters and optimizer state runs in the background from the boundary on; a
    # write in place before the update (a user's clamp) must not leave a mix of two states.
    from ecrl.runtime.checkpoint import jit as jit_module

    monkeypatch.setattr(jit_module, "_PIPELINE_MIN_BYTES", 0)

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    jit = _attached(tmp_path, model, opt)
    assert jit._pipeline is not None

    def state() -> object:
        return _copy_into({"model": model.state_dict(), "optimizer": opt.state_dict()}, None)

    for step in range(3):
        model(torch.randn(16, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        jit.step_completed(step)
        jit.boundary_done()
    # Step 3: clamped in place before its update; the copy is the state the update started from.
    model(torch.randn(16, 4)).square().mean().backward()
    with torch.no_grad():
        model[0].weight.clamp_(-0.01, 0.01)
    before_update = state()
    opt.step()
    opt.zero_grad()
    assert jit._shadow_step == 2 and _same(jit._shadow, before_update)
    jit.step_completed(3)
    jit.boundary_done()
    # Step 4 has no update (a skipped optimizer step): its boundary settles the copy of 3 (in
    # force). A write in place after that boundary tears the copy of 4, which the boundary of 5
    # drops (3 stays in force); step 6's update then takes the copy of 5.
    after_3 = state()
    model(torch.randn(16, 4)).square().mean().backward()
    opt.zero_grad()
    jit.step_completed(4)  # settles the copy of 3 (untouched): in force
    assert jit._shadow_step == 3 and _same(jit._shadow, after_3)
    with torch.no_grad():
        model[1].bias.add_(1.0)
    jit.boundary_done()
    jit.step_completed(5)  # the copy of 4 was written to: dropped, 3 stays in force
    assert jit._shadow_step == 3 and _same(jit._shadow, after_3)
    jit.boundary_done()
    before_update = state()
    model(torch.randn(16, 4)).square().mean().backward()
    opt.step()  # step 6's update: the background copy of 5 is in force
    assert jit._shadow_step == 5 and _same(jit._shadow, before_update)
    jit.close()


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3, 2**63 - 1])
def test_seed_all_sets_the_generators_as_their_own_seeding_does(seed: int) -> None:
    import random

    import numpy as np

    from ecrl.runtime.checkpoint.checkpointer import seed_all

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    expected = (random.random(), np.random.random(), torch.rand(4))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    seed_all(seed)
    got = (random.random(), np.random.random(), torch.rand(4))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_a_rescue_after_torchrun_stopped_the_loaders_workers_names_the_peer() -> None:
    """torchrun's SIGTERM (a peer exited) can reach a rank's DataLoader workers before the rank:
    the loader then raises "DataLoader worker (pid N) is killed by signal: Terminated", and the
    rescue said only that (issue 25, item 8)."""
    from ecrl.runtime.checkpoint.jit import rescue_reason

    worker = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")
    assert rescue_reason(worker) == ("torchrun's termination signal (a peer exited), which "
                                     "stopped this rank's DataLoader workers first")
    gloo = RuntimeError("Connection closed by peer [127.0.0.1]:123. Check the other rank. 😱")
    assert rescue_reason(gloo) == "RuntimeError: Connection closed by peer [127.0.0.1]:123"
