"""ecrl.runtime.checkpoint.jit, watchdog and endings, in one process (the real-process tests are in
tests/integration/test_jit*.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import MAX_LINE_BYTES, RunPaths
from ecrl.runtime.checkpoint import registry
from ecrl.runtime.checkpoint.jit import JitCheckpoints, _KillHook, logged_through
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


def test_kill_hook_parses_and_targets_one_rank_and_attempt() -> None:
    hook = _KillHook("5:forward:1:0,9:post-optimizer:1:2", rank=1, attempt=2)
    assert (hook.step, hook.phase) == (9, "post-optimizer")
    assert _KillHook("5:forward", rank=0, attempt=0).step is None  # default rank 1
    with pytest.raises(ValueError, match="ECRL_JIT_KILL"):
        _KillHook("5:update", rank=1, attempt=0)


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


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    def copy(value: object) -> object:
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [copy(v) for v in value]
        return value

    return {"model": copy(model.state_dict()), "optimizer": copy(opt.state_dict())}


def _attached(tmp_path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, *,
              logged: list[int] | None = None) -> JitCheckpoints:
    """A one-rank jit strategy over ``model`` and ``opt``, attached at step 0 (``logged``: the
    steps this rank logged, checked before each update)."""
    from ecrl.contract.semantics import Geometry
    from ecrl.runtime.checkpoint.strategies import CheckpointContext

    ctx = CheckpointContext(
        paths=RunPaths.of(tmp_path), attempt=0, rank=0, world_size=1,
        geometry=Geometry(dataset_size=64, global_batch=8), target_steps=100, every=0, keep=2,
        max_inflight=1, capture=lambda rngs: {"model": model.state_dict(),
                                              "optimizer": opt.state_dict(), "sampler": None},
        meta=lambda step: {}, optimizers=(opt,))
    jit = JitCheckpoints(ctx)
    jit.attach(start=0, optimizers=[opt], modules=[model],
               position=lambda step: {"sampler": {"next": step + 1}},
               logged=None if logged is None else (lambda: logged[-1] if logged else None))
    return jit


def test_the_rescue_saves_the_live_state_with_the_step_it_belongs_to(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    logged: list[int] = []
    jit = _attached(tmp_path, model, opt, logged=logged)
    log = RunPaths.of(tmp_path).rank_log(0, 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    assert jit._choose()[3] == "no step completed in this attempt"
    after: dict[int, object] = {}
    for step in range(3):
        loss = model(torch.randn(16, 4)).square().mean()  # moves BatchNorm's statistics
        logged.append(step)
        _lines(log, logged)
        if step:
            # In step's backward or all-reduce: no update yet, the state is the one after the
            # step before, with the buffers as this step's forward found them.
            tree, saved, source, _ = jit._choose()
            assert (saved, source) == (step - 1, "live")
            assert _same(tree, {**after[step - 1], "sampler": {"next": step}})
        loss.backward()
        opt.step()
        assert jit._choose()[3] == "this rank was inside its optimizer step"
        opt.zero_grad()
        jit.step_completed(step)
        jit.boundary_done()
        after[step] = _snapshot(model, opt)
        tree, saved, _, _ = jit._choose()  # the update ran: the live state after step
        assert saved == step and _same(tree, {**after[step], "sampler": {"next": step + 1}})
    # A rank's log that lacks the step: nothing is saved rather than an unproven step.
    _lines(log, [0, 1])
    assert jit._choose()[3] == "step 2 is missing from a rank's log"
    jit.close()


def test_an_update_before_the_step_is_logged_is_refused_under_jit(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    jit = _attached(tmp_path, model, opt, logged=[])
    model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(ConfigError, match=r"before loss.backward\(\)"):
        opt.step()
    jit.close()


class _CopyCounter(TorchDispatchMode):
    """Counts the operations that copy a watched tensor's bytes into another tensor."""

    COPIES: ClassVar[dict[Any, int]] = {  # operation: position of its source argument
        torch.ops.aten.copy_.default: 1, torch.ops.aten.clone.default: 0,
        torch.ops.aten._to_copy.default: 0, torch.ops.aten._foreach_copy_.default: 1}

    def __init__(self) -> None:
        super().__init__()
        self.watched: set[int] = set()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        at = self.COPIES.get(func)
        if at is not None and self.watched:
            sources = args[at] if isinstance(args[at], list | tuple) else [args[at]]
            for t in sources:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.watched:
                    self.copies.append(str(func))
        return func(*args, **(kwargs or {}))


def test_jit_takes_no_per_step_copy_of_parameters_or_optimizer_state(tmp_path: Path) -> None:
    """The whole library path (Checkpointer, StepLog, sampler) under jit, every aten operation
    of every step watched: nothing copies a parameter or an optimizer state tensor, and no other
    thread (where a copy would escape the watch) runs."""
    import ecrl
    from ecrl.runtime import _attempt

    _attempt._CACHE.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=12)
    log = ecrl.StepLog(tmp_path, sampler=sampler, steps=12)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler}, log=log,
                             strategy="jit", every=0)
    start = ckpt.restore()
    threads = threading.active_count()
    counter = _CopyCounter()
    with counter:
        for step, ids in zip(range(start, 12), sampler, strict=True):
            x = torch.randn(8, 4)
            loss = model(x).square().mean()
            log.step(step, sample_ids=ids, loss=loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ckpt.after_step(step)
            counter.watched = {t.untyped_storage().data_ptr() for t in
                               [*model.parameters(), *(v for s in opt.state.values()
                                                       for v in s.values()
                                                       if isinstance(v, torch.Tensor))]}
            assert threading.active_count() == threads
        assert not counter.copies, counter.copies
        next(model.parameters()).detach().clone()  # the watch sees a copy when there is one
    assert counter.copies == ["aten.clone.default"]
    ckpt.close()
    log.close()
    _attempt._CACHE.clear()


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
