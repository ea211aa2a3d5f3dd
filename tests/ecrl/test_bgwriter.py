"""The background writer process: order, durability before publication, back-pressure, death."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ckpt_images import make_image

from ecrl.contract.ckptfile import CheckpointError, read_verified
from ecrl.contract.runformat import CheckpointEvent, JsonlReader, RunPaths
from ecrl.runtime.checkpoint.bgwriter import WriterClient, WriterCrashed
from ecrl.runtime.checkpoint.persist import CRASH_ENV, checkpoint_name, read_latest


def _submit(client: WriterClient, step: int) -> int:
    image, size = make_image(step)
    slot, waited = client.acquire(size)
    slot.view()[: size] = image[:size]
    job = client.submit(slot, size=size, global_step=step, epoch=0, cursor_step=step,
                        world_size=1, snapshot_s=0.001, backpressure_s=waited)
    client.send_timing(job, enqueue_s=0.0001, stall_s=0.002)
    return job


def _start(root: Path, *, max_inflight: int) -> WriterClient:
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    return WriterClient.start(run_dir=str(root), attempt=0, keep=2, max_inflight=max_inflight,
                              strategy="overlapped")


def test_jobs_are_written_in_order_and_recorded(tmp_path: Path) -> None:
    client = _start(tmp_path, max_inflight=2)
    client.prepare(2000)
    for step in (3, 7, 11):
        _submit(client, step)
    client.close()
    assert client.process.returncode == 0
    paths = RunPaths.of(tmp_path)
    assert [m["global_step"] for m in client.completed] == [3, 7, 11]
    latest = read_latest(paths)
    assert latest is not None and latest.global_step == 11
    read_verified(paths.checkpoints / latest.path, expected_checksum=latest.checksum)
    events = [e for _, e in JsonlReader(paths.checkpoint_log(0), CheckpointEvent,
                                        torn_tail_ok=False)]
    assert [e.global_step for e in events] == [3, 7, 11]
    assert all(e.strategy == "overlapped" and e.stall_s == 0.002 for e in events)
    assert sorted(p.name for p in paths.checkpoints.glob("*.ckpt")) == [
        checkpoint_name(7), checkpoint_name(11)]


def test_back_pressure_waits_for_a_durable_slot(tmp_path: Path) -> None:
    client = _start(tmp_path, max_inflight=1)
    _submit(client, 3)
    assert client.inflight == 1
    _, size = make_image(7)
    slot, _ = client.acquire(size)  # may only return once job 0 is durable and its slot free
    assert client.inflight == 0 and slot.job is None
    assert [m["global_step"] for m in client.completed] == [3]
    assert read_latest(RunPaths.of(tmp_path)).global_step == 3  # type: ignore[union-attr]
    client.close()


def test_a_writer_killed_mid_commit_publishes_nothing(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_ENV, "latest:before-rename:1")
    client = _start(tmp_path, max_inflight=2)
    _submit(client, 3)
    with pytest.raises(WriterCrashed, match="exited unexpectedly"):
        client.flush()
    paths = RunPaths.of(tmp_path)
    assert read_latest(paths) is None  # the file is durable, but was never named
    assert (paths.checkpoints / checkpoint_name(3)).exists()


def test_write_errors_are_reported_not_swallowed(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    client = WriterClient.start(run_dir=str(tmp_path), attempt=0, keep=2, max_inflight=1,
                                strategy="overlapped")
    _submit(client, 3)
    with pytest.raises(CheckpointError, match="writing the checkpoint of step 3 failed"):
        client.flush()


_PARENT = """
import os, sys
from ecrl.runtime.checkpoint.bgwriter import WriterClient
client = WriterClient.start(run_dir={root!r}, attempt=0, keep=2, max_inflight=1,
                            strategy="overlapped")
print(client.process.pid, flush=True)
os._exit(137)
"""


def test_the_writer_dies_with_its_trainer(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _PARENT.format(root=str(tmp_path))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 137
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:  # a zombie has exited too; only its parent has not collected it yet
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"writer {pid} outlived its trainer")


def test_latest_waits_for_the_event_which_waits_for_the_stall_figure(tmp_path: Path) -> None:
    client = _start(tmp_path, max_inflight=2)
    client.prepare(2000)
    paths = RunPaths.of(tmp_path)
    image, size = make_image(5)
    slot, waited = client.acquire(size)
    slot.view()[:size] = image[:size]
    job = client.submit(slot, size=size, global_step=5, epoch=0, cursor_step=5, world_size=1,
                        snapshot_s=0.001, backpressure_s=waited)
    deadline = time.monotonic() + 30
    while not (paths.checkpoints / checkpoint_name(5)).exists():
        assert time.monotonic() < deadline, "the writer never wrote the file"
        time.sleep(0.01)
    time.sleep(0.2)
    # durable, but without its event (no stall figure yet) latest.json must not name it
    assert read_latest(paths) is None
    client.send_timing(job, enqueue_s=0.0001, stall_s=0.003)
    client.close()
    latest = read_latest(paths)
    assert latest is not None and latest.global_step == 5
    events = [e for _, e in JsonlReader(paths.checkpoint_log(0), CheckpointEvent,
                                        torn_tail_ok=False)]
    assert [(e.global_step, e.stall_s) for e in events] == [(5, 0.003)]


_DIES_BEFORE_TIMING = """
import os, sys, time
sys.path.insert(0, {here!r})
from ckpt_images import make_image
from ecrl.runtime.checkpoint.bgwriter import WriterClient
from pathlib import Path
root = Path({root!r}); (root / "checkpoints").mkdir(parents=True, exist_ok=True)
client = WriterClient.start(run_dir=str(root), attempt=0, keep=2, max_inflight=1,
                            strategy="overlapped")
client.prepare(2000)
image, size = make_image(9)
slot, waited = client.acquire(size)
slot.view()[:size] = image[:size]
client.submit(slot, size=size, global_step=9, epoch=0, cursor_step=9, world_size=1,
              snapshot_s=0.001, backpressure_s=waited)
while not (root / "checkpoints" / "step-00000009.ckpt").exists():
    time.sleep(0.005)
os._exit(137)
"""


def test_a_trainer_dying_before_its_stall_figure_publishes_nothing(tmp_path: Path) -> None:
    code = _DIES_BEFORE_TIMING.format(here=str(Path(__file__).parent), root=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 137, proc.stderr
    time.sleep(0.3)  # let a (wrongly) surviving writer finish what it would do
    paths = RunPaths.of(tmp_path)
    assert read_latest(paths) is None
    log = paths.checkpoint_log(0)
    assert not log.exists() or log.read_bytes() == b""
