"""Sharded checkpoints (``ecrl.runtime.checkpoint.sharded``, ``ecrl.contract.shardfile``) in one
process: the format, its verification, the restricted loader, crash points and switching strategy.
Real files, real DCP; the multi-rank runs are in tests/integration/test_sharded_runs.py."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import ecrl
from ecrl.apps.faults import forge_checksums
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.runformat import RunPaths
from ecrl.contract.shardfile import MANIFEST, RECYCLED, file_checksum, read_verified_shards
from ecrl.runtime import _attempt
from ecrl.runtime.checkpoint.persist import (
    apply_retention,
    checkpoint_step,
    clean_temporaries,
    read_latest,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ECRL_")]:
        monkeypatch.delenv(key)
    _attempt._CACHE.clear()


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((4,), float(i)), torch.tensor(i % 2)


class _Table:
    """A Stateful object of 20 kB, checkpointed before the RNG states: with it, sharded
    checkpoints at 2 ranks place both ranks' RNG states in chunk 1 (written by rank 1)."""

    def __init__(self) -> None:
        self.table = torch.zeros(5000)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"table": self.table}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.table.copy_(state["table"])


def _train(run: Path, *, strategy: str, steps: int = 12, every: int = 4,
           stop_after: int | None = None, between: Callable[[int], None] | None = None,
           table: bool = False, more: dict[str, Any] | None = None
           ) -> tuple[list[float], dict[str, torch.Tensor]]:
    _attempt._CACHE.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=steps)
    loader = DataLoader(ecrl.WithSampleIds(Squares()), batch_sampler=sampler)
    log = ecrl.StepLog(run, sampler=sampler, steps=steps)
    objects: dict[str, Any] = {"model": model, "optimizer": opt, "scheduler": sched,
                               "sampler": sampler}
    if table:
        objects["table"] = _Table()
    objects.update(more or {})
    ckpt = ecrl.Checkpointer(objects, log=log, every=every, strategy=strategy)
    losses = []
    start = ckpt.restore()
    for step, (ids, (x, y)) in zip(range(start, steps), loader, strict=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        log.step(step, sample_ids=ids, loss=loss)
        ckpt.after_step(step)
        losses.append(float(loss.detach()))
        if between is not None:
            between(step)
        if step == stop_after:
            break
    ckpt.close()
    log.close()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, torch.Tensor]]:
    return _train(tmp_path_factory.mktemp("whole"), strategy="blocking")


@pytest.mark.parametrize(("first", "then"), [("sharded", "sharded"),
                                             ("sharded-async", "sharded-async"),
                                             ("blocking", "sharded"), ("sharded", "overlapped")])
def test_resume_is_bit_identical_whatever_strategy_wrote_the_checkpoint(
        tmp_path: Path, whole: tuple[list[float], dict[str, torch.Tensor]], first: str,
        then: str) -> None:
    losses, final = whole
    cut, _ = _train(tmp_path, strategy=first, stop_after=9)
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None and latest.global_step == 7
    suffix = ".ckpt" if first == "blocking" else ".dcp"
    assert latest.path == f"step-00000007{suffix}"
    rest, resumed = _train(tmp_path, strategy=then)
    assert cut[:8] + rest == losses  # RNG (dropout), optimizer, scheduler and data all restored
    assert all(torch.equal(final[k], resumed[k]) for k in final)


def _sharded_run(tmp_path: Path) -> Path:
    _train(tmp_path, strategy="sharded", stop_after=9)
    return tmp_path / "checkpoints" / "step-00000007.dcp"


def test_layout_and_checksums(tmp_path: Path) -> None:
    directory = _sharded_run(tmp_path)
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    manifest = json.loads((directory / MANIFEST).read_text())
    assert set(manifest["parts"]) == {"__0_0.distcp", ".metadata"}
    # one writer, one chunk: every tensor packed into c000 at an aligned offset of its own
    assert manifest["version"] == 3 and [c["key"] for c in manifest["chunks"]] == ["c000"]
    # the part is the chunk's raw bytes (a DCP byte entry), nothing pickled around them
    assert manifest["parts"]["__0_0.distcp"]["size"] == manifest["chunks"][0]["nbytes"]
    spans = sorted((e["offset"], e["offset"] + e["nbytes"]) for e in manifest["tensors"])
    assert all(e["chunk"] == 0 and e["offset"] % 64 == 0 for e in manifest["tensors"])
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= manifest["chunks"][0]["nbytes"]
    for name, info in manifest["parts"].items():
        assert file_checksum(directory / name) == (info["checksum"], info["size"])
    checked = read_verified_shards(directory, expected_checksum=latest["checksum"])
    assert checked.meta["global_step"] == 7 and checked.checksum == latest["checksum"]


def test_a_chunk_is_written_from_its_pieces_padded_to_their_offsets(tmp_path: Path) -> None:
    import hashlib

    from ecrl.runtime.checkpoint.sharded import _storage as storage

    a = torch.arange(5, dtype=torch.float32)
    b = torch.arange(6, dtype=torch.int64).reshape(2, 3).t()  # not contiguous: copied, in order
    chunk = storage.ChunkBytes([(64, b), (0, a)], 192)
    fs = storage.HashingFileSystem()
    with fs.create_stream(tmp_path / "part", "wb") as stream:
        assert stream.write(chunk.getbuffer()) == 192
    data = (tmp_path / "part").read_bytes()
    expected = (a.numpy().tobytes() + bytes(64 - 20) + b.contiguous().numpy().tobytes()
                + bytes(192 - 64 - 48))
    assert data == expected
    assert fs.digest("part") == (f"sha256:{hashlib.sha256(data).hexdigest()}", 192)
    with pytest.raises(ValueError, match="overlap"):
        list(storage.ChunkBytes([(0, a), (16, a)], 192).views())
    with pytest.raises(ValueError, match="past the chunk"):
        list(storage.ChunkBytes([(0, a)], 16).views())


def _forge(directory: Path, *, files: dict[str, bytes], version: int | None = None) -> None:
    """What an attacker with write access does: replace files of a sharded checkpoint, then
    recompute every checksum ECRL keeps (the manifest's and latest.json's) so that they match."""
    for name, data in files.items():
        (directory / name).write_bytes(data)
    latest_path = directory.parent / "latest.json"
    forge_checksums(directory, latest_path, list(files), version)
    latest = json.loads(latest_path.read_text())
    latest["global_step"] = json.loads((directory / MANIFEST).read_text())["meta"]["global_step"]
    latest_path.write_text(json.dumps(latest))


def _metadata_placing(directory: Path, relative_path: str, length: int | None = None) -> bytes:
    """The checkpoint's own DCP metadata with chunk c000 placed at ``relative_path``."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    metadata = pickle.loads((directory / ".metadata").read_bytes())  # the test's own file
    (index, info), = metadata.storage_data.items()
    metadata.storage_data = {index: _StorageInfo(
        relative_path=relative_path, offset=0,
        length=info.length if length is None else length)}
    return pickle.dumps(metadata)


def _payload(marker: Path) -> bytes:
    """A ``torch.save`` file whose pickle creates ``marker`` when it is loaded."""
    import io

    buffer = io.BytesIO()
    torch.save(_Marker(marker), buffer)
    return buffer.getvalue()


class _Marker:
    """A pickle that creates ``path`` when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("strategy", ["sharded", "blocking"])
def test_a_forged_format_2_checkpoint_with_a_pickle_payload_is_refused_and_never_run(
        tmp_path: Path, strategy: str) -> None:
    # Format 2 kept chunks as torch.save'd entries, which DCP's default planner hands to
    # torch.load(weights_only=False). A forged one, checksums recomputed, planted in a sharded
    # run, or in a blocking run whose latest.json is pointed at it:
    marker = tmp_path / "MARKER"
    source = _sharded_run(tmp_path / "source")
    run = tmp_path / "run"
    _train(run, strategy=strategy, stop_after=9)
    planted = run / "checkpoints" / source.name
    if strategy == "blocking":
        import shutil

        shutil.copytree(source, planted)
    payload = _payload(marker)
    _forge(planted, files={"__0_0.distcp": payload,
                           ".metadata": _metadata_placing(planted, "__0_0.distcp", len(payload))},
           version=2)
    with pytest.raises(CheckpointError, match=r"ecrl-manifest\.json: sharded checkpoint format 2 "
                                              r"\(written by ECRL .*never loads; continue the run "
                                              r"once with --strategy blocking") as info:
        _train(run, strategy=strategy)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_a_forged_chunk_holding_a_pickle_is_only_bytes(tmp_path: Path) -> None:
    # Format 3 with the same payload: the chunk is copied as bytes, never unpickled; the bytes
    # are not a state, so the resume is refused (their size is not the chunk's), not run.
    marker = tmp_path / "MARKER"
    directory = _sharded_run(tmp_path)
    payload = _payload(marker)
    _forge(directory, files={"__0_0.distcp": payload,
                             ".metadata": _metadata_placing(directory, "__0_0.distcp",
                                                            len(payload))})
    with pytest.raises(CheckpointError, match=r"storage_data of chunk 'c000': offset 0, length"):
        _train(tmp_path, strategy="sharded")
    assert not marker.exists()


@pytest.mark.parametrize("where", ["up", "absolute", "unlisted"])
def test_a_relative_path_the_checksums_do_not_cover_is_refused(tmp_path: Path, where: str
                                                               ) -> None:
    directory = _sharded_run(tmp_path)  # checkpoints after steps 3 and 7; latest names 7
    older = directory.parent / "step-00000003.dcp" / "__0_0.distcp"
    target = {"up": "../step-00000003.dcp/__0_0.distcp", "absolute": str(older),
              "unlisted": "__9_0.distcp"}[where]
    if where == "unlisted":
        import shutil

        shutil.copy(older, directory / "__9_0.distcp")
    # The older part has the same size: DCP read its state and resumed from it, exit 0.
    assert older.stat().st_size == (directory / "__0_0.distcp").stat().st_size
    _forge(directory, files={".metadata": _metadata_placing(directory, target)})
    message = {"up": r"relative_path: '\.\./step-00000003\.dcp/__0_0\.distcp' leads out of "
                     r"its directory",
               "absolute": r"relative_path: '/.*' is an absolute path",
               "unlisted": r"relative_path '__9_0\.distcp' is not a part the manifest's checksums "
                           r"cover"}[where]
    with pytest.raises(CheckpointError, match=r"\.metadata: storage_data of chunk 'c000': "
                                              + message) as info:
        _train(tmp_path, strategy="sharded")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("what", ["directory", "part"])
def test_recycled_parts_replaced_by_a_link_never_lead_writes_or_deletes_outside_the_run(
        tmp_path: Path, what: str, whole: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__0_0.distcp").write_bytes(b"must survive")
    (outside / "notes.txt").write_bytes(b"must survive too")
    run = tmp_path / "run"
    recycled = run / "checkpoints" / RECYCLED

    def plant(step: int) -> None:
        if step == 6:  # after checkpoint 5, whose retention retired 1: its parts are recycled
            assert recycled.is_dir() and not recycled.is_symlink()
            if what == "directory":
                import shutil

                shutil.rmtree(recycled)
                recycled.symlink_to(outside, target_is_directory=True)
            else:
                (recycled / "__0_0.distcp").unlink()
                (recycled / "__0_0.distcp").symlink_to(outside / "__0_0.distcp")

    _train(run, strategy="sharded", every=2, between=plant)
    assert sorted(p.name for p in outside.iterdir()) == ["__0_0.distcp", "notes.txt"]
    assert (outside / "__0_0.distcp").read_bytes() == b"must survive"
    assert (outside / "notes.txt").read_bytes() == b"must survive too"
    checkpoints = [p for p in (run / "checkpoints").iterdir() if checkpoint_step(p.name)]
    assert checkpoints and not any(p.is_symlink() for p in checkpoints)
    for checkpoint in checkpoints:
        assert not any(p.is_symlink() for p in checkpoint.iterdir())
    _, final = whole
    _, resumed = _train(run, strategy="sharded", every=2)  # nothing left to do: loads step 11
    assert all(torch.equal(final[k], resumed[k]) for k in final)


def test_the_hashing_stream_hashes_what_reached_the_file_whatever_the_caller_reuses(
        tmp_path: Path) -> None:
    import hashlib

    from ecrl.runtime.checkpoint.sharded import _storage as storage

    fs = storage.HashingFileSystem()
    chunk = torch.arange(3 << 20, dtype=torch.int64).to(torch.uint8)  # 3 MiB, hashed in place
    reused = bytearray(b"h" * (2 << 20))  # 2 MiB, not a chunk: changed after each write
    path = tmp_path / "part"
    with fs.create_stream(path, "wb") as stream:
        for _ in range(3):
            stream.write(memoryview(b"header"))
            stream.write(memoryview(reused))
            reused[:] = b"x" * len(reused)
            stream.write(storage.ChunkBytes([(0, chunk)], chunk.numel()))
    data = path.read_bytes()
    assert fs.digest("part") == (f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
    assert data.count(b"h" * 1024) > 0 and len(data) == 3 * (6 + (2 << 20) + (3 << 20))


def test_a_write_that_fails_records_no_digest_and_leaves_no_hashing_thread(
        tmp_path: Path) -> None:
    import threading

    from ecrl.runtime.checkpoint.sharded import _storage as storage

    fs = storage.HashingFileSystem()
    with pytest.raises(RuntimeError, match="disk went away"), \
            fs.create_stream(tmp_path / "part", "wb") as stream:
        stream.write(memoryview(b"some bytes"))
        raise RuntimeError("disk went away")
    with pytest.raises(KeyError):
        fs.digest("part")
    assert not [t for t in threading.enumerate() if t.name == "ecrl-part-hash"]


@pytest.mark.parametrize(("damage", "message"), [
    ("flip", r"__0_0\.distcp: checksum mismatch .* the part is corrupt"),
    ("truncate", r"__0_0\.distcp: \d+ bytes, the manifest says \d+: the part is truncated"),
    ("metadata", r"\.metadata: part of the checkpoint is missing"),
    ("manifest", r"ecrl-manifest\.json: checksum .* differs from the .* recorded in latest\.json"),
    ("no-manifest", r"manifest is missing \(the checkpoint was never completed\)"),
])
def test_damage_is_one_line_naming_the_file(tmp_path: Path, damage: str, message: str) -> None:
    directory = _sharded_run(tmp_path)
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    part = directory / "__0_0.distcp"
    if damage == "flip":
        data = bytearray(part.read_bytes())
        data[len(data) // 3] ^= 1
        part.write_bytes(bytes(data))
    elif damage == "truncate":
        part.write_bytes(part.read_bytes()[:-7])
    elif damage == "metadata":
        (directory / ".metadata").unlink()
    elif damage == "manifest":
        manifest = json.loads((directory / MANIFEST).read_text())
        manifest["meta"]["global_step"] = 3
        (directory / MANIFEST).write_text(json.dumps(manifest))
    else:
        (directory / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=message) as info:
        read_verified_shards(directory, expected_checksum=latest["checksum"])
    assert "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match=message):  # the Checkpointer refuses it too
        _train(tmp_path, strategy="sharded")


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_crafted_metadata_is_refused_without_running_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _sharded_run(tmp_path)
    (directory / ".metadata").write_bytes(pickle.dumps(_Payload()))
    # An attacker who also rewrites the checksums (manifest and latest.json) gets past them...
    manifest = json.loads((directory / MANIFEST).read_text())
    checksum, size = file_checksum(directory / ".metadata")
    manifest["parts"][".metadata"] = {"checksum": checksum, "size": size}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    latest_path = tmp_path / "checkpoints" / "latest.json"
    latest = json.loads(latest_path.read_text())
    latest["checksum"] = file_checksum(directory / MANIFEST)[0]
    latest_path.write_text(json.dumps(latest))
    monkeypatch.chdir(tmp_path)
    # ... and still runs no code: the metadata unpickler only builds DCP's classes.
    with pytest.raises(CheckpointError, match=r"\.metadata: refused DCP metadata \(it names "
                                              r"posix\.system"):
        _train(tmp_path, strategy="sharded")
    assert not (tmp_path / "PWNED").exists()


def test_retention_and_temporaries_handle_directories(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    for step in (3, 7, 11, 15):
        (directory / f"step-{step:08d}.dcp").mkdir(parents=True)
        (directory / f"step-{step:08d}.dcp" / "__0_0.distcp").write_bytes(b"x")
    (directory / "step-00000005.ckpt").write_bytes(b"y")
    (directory / ".step-00000019.dcp.a1.tmp").mkdir()
    assert checkpoint_step("step-00000015.dcp") == 15
    removed = apply_retention(directory, latest_step=11, keep=2)
    assert sorted(removed) == ["step-00000003.dcp", "step-00000005.ckpt"]
    assert sorted(p.name for p in directory.iterdir()) == [
        ".step-00000019.dcp.a1.tmp", "step-00000007.dcp", "step-00000011.dcp",
        "step-00000015.dcp"]
    (directory / RECYCLED).mkdir()
    assert sorted(clean_temporaries(directory)) == [".recycled.dcp", ".step-00000019.dcp.a1.tmp"]


def test_a_retired_checkpoint_s_parts_are_written_over_and_resume_exactly(
        tmp_path: Path, whole: tuple[list[float], dict[str, torch.Tensor]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ecrl.runtime.checkpoint.sharded import _commit as commit
    from ecrl.runtime.checkpoint.sharded import _storage as storage

    taken: list[bool] = []
    take = storage.take_recycled
    monkeypatch.setattr(commit, "take_recycled",
                        lambda *args: taken.append(take(*args)) or taken[-1])
    cut, _ = _train(tmp_path, strategy="sharded", every=2, stop_after=9)
    # checkpoints after 1, 3, 5, 7, 9; two kept: from the fourth on each wrote over a retired one
    assert taken == [False, False, False, True, True]
    checkpoints = tmp_path / "checkpoints"
    assert not (checkpoints / RECYCLED).exists()  # close() removes the last retired parts
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None and latest.path == "step-00000009.dcp"
    read_verified_shards(checkpoints / latest.path, expected_checksum=latest.checksum)
    losses, final = whole
    rest, resumed = _train(tmp_path, strategy="sharded", every=2)
    assert cut[:10] + rest == losses
    assert all(torch.equal(final[k], resumed[k]) for k in final)


def test_sharded_async_stages_ahead_and_its_first_checkpoint_reuses_that_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ecrl.runtime.checkpoint import sharded

    seen: list[tuple[list[int], int]] = []
    chunks: list[Any] = []
    stage = sharded.AsyncShardedCheckpoints._stage

    def recording(self: Any, job: Any, later: frozenset[str] = frozenset()) -> None:
        seen.append((list(self._free), len(self._staging)))
        stage(self, job, later)
        chunks.append(self._staging[job.staging][1])

    monkeypatch.setattr(sharded.AsyncShardedCheckpoints, "_stage", recording)
    _train(tmp_path, strategy="sharded-async", stop_after=4)
    # prepare() (after the first step) allocates and writes a set; the first checkpoint (after
    # step 3) finds it free, with the layout of the real state: no second allocation
    assert seen == [([], 0), ([0], 1)]  # once ahead, once for the one checkpoint (step 3)
    assert chunks[1] is chunks[0]


class _Changing:
    """A Stateful whose tensor is replaced every step by ``change(tensor, step)``."""

    def __init__(self, first: torch.Tensor,
                 change: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
        self.value, self.change = first, change
        self.loaded: torch.Tensor | None = None

    def step(self, step: int) -> None:
        self.value = self.change(self.value, step)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.loaded = state["value"].clone()


def _growing() -> _Changing:
    """16 elements more every step (128 bytes, more than a chunk's alignment): every
    checkpoint lays out anew."""
    return _Changing(torch.zeros(0, dtype=torch.int64),
                     lambda seen, step: torch.cat([seen, torch.full((16,), step)]))


@pytest.mark.parametrize("strategy", ["sharded", "sharded-async"])
def test_a_state_whose_sizes_change_between_checkpoints_resumes_exactly(
        tmp_path: Path, whole: tuple[list[float], dict[str, torch.Tensor]],
        strategy: str) -> None:
    growing = _growing()
    cut, _ = _train(tmp_path, strategy=strategy, stop_after=9, between=growing.step,
                    more={"growing": growing})
    resumed = _growing()
    rest, final = _train(tmp_path, strategy=strategy, more={"growing": resumed})
    # saved after step 7, before the step's own growth: steps 0 to 6
    assert resumed.loaded is not None
    assert resumed.loaded.tolist() == [step for step in range(7) for _ in range(16)]
    assert cut[:8] + rest == whole[0]
    assert all(torch.equal(whole[1][k], final[k]) for k in final)


def _replaced() -> _Changing:
    """A new tensor of the same shape every step."""
    return _Changing(torch.zeros(8), lambda _value, step: torch.full((8,), float(step)))


@pytest.mark.parametrize("strategy", ["sharded", "sharded-async"])
def test_the_encoding_is_made_once_and_reused_with_each_checkpoints_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        whole: tuple[list[float], dict[str, torch.Tensor]], strategy: str) -> None:
    """The state's tensors stay the same objects (or, replaced, the same dtypes and shapes):
    the first checkpoint's encoding serves every later one, each with its own values."""
    from ecrl.runtime.checkpoint import sharded

    encoded: list[int] = []
    encode = sharded.ShardedCheckpoints._encode_leaves

    def counting(self: Any, leaves: Any) -> Any:
        encoded.append(len(leaves))
        return encode(self, leaves)

    monkeypatch.setattr(sharded.ShardedCheckpoints, "_encode_leaves", counting)
    replaced = _replaced()
    cut, _ = _train(tmp_path, strategy=strategy, stop_after=9, between=replaced.step,
                    more={"replaced": replaced})
    # sharded-async encodes once ahead of its first checkpoint (its staging set), sharded at it
    assert len(encoded) == 1
    resumed = _replaced()
    rest, final = _train(tmp_path, strategy=strategy, more={"replaced": resumed})
    # saved after step 7, before that step's replacement: step 6's tensor
    assert resumed.loaded is not None and resumed.loaded.tolist() == [6.0] * 8
    assert cut[:8] + rest == whole[0]
    assert all(torch.equal(whole[1][k], final[k]) for k in final)


def test_retirement_keeps_only_the_parts_and_a_recycled_file_is_cut_to_its_new_content(
        tmp_path: Path) -> None:
    from ecrl.runtime.checkpoint.sharded import _storage as storage

    old = tmp_path / "step-00000003.dcp"
    old.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata", MANIFEST):
        (old / name).write_bytes(b"o" * 100)
    storage.retire(old)
    recycled = tmp_path / RECYCLED
    assert not old.exists() and sorted(p.name for p in recycled.iterdir()) == [
        "__0_0.distcp", "__1_0.distcp"]  # no manifest: never mistaken for a checkpoint
    tmp = tmp_path / ".step-00000011.dcp.a0.tmp"
    assert storage.take_recycled(tmp_path, tmp) and not recycled.exists()
    assert not storage.take_recycled(tmp_path, tmp_path / "other")
    fs = storage.HashingFileSystem()
    with fs.create_stream(tmp / "__0_0.distcp", "wb") as stream:
        stream.write(memoryview(b"new"))
    assert (tmp / "__0_0.distcp").read_bytes() == b"new"
    assert fs.digest("__0_0.distcp")[1] == 3
    storage.retire(tmp_path / "step-00000005.ckpt")  # a file: deleted as before (missing: fine)


_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_sharded import _train
    _train(Path(sys.argv[1]), strategy=sys.argv[2], stop_after=9,
           every=int(sys.argv[3]) if len(sys.argv) > 3 else 4)
""")


@pytest.mark.parametrize(("strategy", "point"), [
    ("sharded", "before-parts"), ("sharded", "during-metadata"), ("sharded", "before-rename"),
    ("sharded", "before-pointer"), ("sharded-async", "during-persist"),
    ("sharded-async", "after-metadata")])
def test_a_crash_at_any_point_leaves_latest_on_the_previous_whole_checkpoint(
        tmp_path: Path, strategy: str, point: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "ECRL_CRASH_AT": f"sharded:{point}:2"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), strategy],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 137, proc.stderr
    latest = read_latest(RunPaths.of(tmp_path / "run"))
    assert latest is not None and latest.global_step == 3  # the 2nd checkpoint (7) never landed
    read_verified_shards(tmp_path / "run" / "checkpoints" / latest.path,
                         expected_checksum=latest.checksum)


def test_a_crash_while_writing_over_recycled_parts_keeps_both_kept_checkpoints(
        tmp_path: Path, whole: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    # every 2 steps: checkpoints after 1, 3, 5, 7; the 4th (7) writes over the parts of the 1st
    # (retired when 5 was committed) and dies once they are written, before anything is committed
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "ECRL_CRASH_AT": "sharded:after-parts:4"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), "sharded", "2"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 137, proc.stderr
    checkpoints = tmp_path / "checkpoints"
    assert not (checkpoints / RECYCLED).exists()  # taken by the 4th, whose temporary is left
    assert [p.name for p in checkpoints.glob(".step-00000007.dcp.*.tmp")]
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None and latest.global_step == 5
    for step in (3, 5):  # the newest and its fallback, both whole
        read_verified_shards(checkpoints / f"step-{step:08d}.dcp")
    losses, final = whole
    rest, resumed = _train(tmp_path, strategy="sharded", every=2)
    assert rest == losses[6:]
    assert all(torch.equal(final[k], resumed[k]) for k in final)


def test_disk_full_is_one_clear_error_and_keeps_the_earlier_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECRL_CRASH_AT", "sharded:enospc:2")
    with pytest.raises(CheckpointError, match=r"sharded checkpoint of step 7 failed: No space "
                                              r"left on device \(.*__0_0\)"):
        _train(tmp_path, strategy="sharded")
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None and latest.global_step == 3


def _two_rank_worker(rank: int, port: int, run: str, unlike: bool) -> None:
    """Rank ``rank`` of a 2-rank sharded-async run with a :class:`_Table`; at step 7 (a
    checkpoint) each rank writes down its RNG states (as the step boundary seeded them, from the
    rank: they differ). ``unlike``: rank 1 has one more RNG stream, as a rank that sees a CUDA
    device beside one that sees none would."""
    import torch.distributed as dist

    from ecrl.runtime.checkpoint import statepack

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if unlike and rank == 1:
            plain = statepack.rng_state

            def with_a_device() -> dict[str, Any]:
                return {**plain(), "cuda": [torch.arange(16, dtype=torch.uint8)]}

            statepack.rng_state = with_a_device

        def note(step: int) -> None:
            if step == 7:
                (Path(run) / f"rng-{rank}.pickle").write_bytes(pickle.dumps(statepack.rng_state()))

        _train(Path(run), strategy="sharded-async", steps=12, every=4, between=note, table=True)
    finally:
        dist.destroy_process_group()


def _two_ranks(run: Path, *, unlike: bool) -> tuple[Any, list[Any]]:
    """The checkpoint of step 7 of :func:`_two_rank_worker`'s run, and the ranks' states then."""
    import socket

    import torch.multiprocessing as mp

    from ecrl.runtime.checkpoint import sharded

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_two_rank_worker, args=(port, str(run), unlike), nprocs=2,
                       start_method="spawn")
    latest = read_latest(RunPaths.of(run))
    assert latest is not None and latest.global_step == 7
    saved = sharded.load(read_verified_shards(run / "checkpoints" / latest.path,
                                              expected_checksum=latest.checksum))
    states = [pickle.loads((run / f"rng-{rank}.pickle").read_bytes()) for rank in range(2)]
    return saved, states


def test_sharded_async_saves_each_ranks_rng_states_gathered_after_the_boundary(
        tmp_path: Path) -> None:
    """sharded-async gathers the ranks' RNG states with the commit, each rank's own standing in
    for all at the boundary: the checkpoint holds every rank's own states in its place, also
    where another rank writes them (rank 1 writes both here; the table fills chunk 0)."""
    import numpy as np

    saved, states = _two_ranks(tmp_path, unlike=False)
    latest = read_latest(RunPaths.of(tmp_path))
    assert latest is not None
    manifest = json.loads((tmp_path / "checkpoints" / latest.path / MANIFEST).read_text())
    torch_ref = manifest["tree"]["rng"]["ranks"][0]["torch"]["$tensor"]
    assert manifest["tensors"][torch_ref]["chunk"] == 1  # rank 0's states, written by rank 1
    ranks = saved["rng"]["ranks"]
    assert not torch.equal(states[0]["torch"], states[1]["torch"])  # the ranks do differ
    for rank, (got, want) in enumerate(zip(ranks, states, strict=True)):
        assert torch.equal(got["torch"], want["torch"]), rank
        assert np.array_equal(got["python"]["words"], want["python"]["words"]), rank
        assert np.array_equal(got["numpy"][1], want["numpy"][1]), rank
        assert got["numpy"][2:] == tuple(want["numpy"][2:]), rank


def test_sharded_async_gathers_unlike_rng_states_at_the_boundary(tmp_path: Path) -> None:
    """sharded-async gathers the ranks' RNG states with the commit, each rank's own standing in
    for all until then — which only works when they have the same shapes. Ranks whose states
    differ (different CUDA device counts) are found at the first checkpoint and gathered at the
    boundary instead: the run completes and each rank's states are saved in its place."""
    saved, states = _two_ranks(tmp_path, unlike=True)
    ranks = saved["rng"]["ranks"]
    assert ranks[0]["cuda"] is None
    assert [t.tolist() for t in ranks[1]["cuda"]] == [list(range(16))]
    assert all(torch.equal(got["torch"], want["torch"])
               for got, want in zip(ranks, states, strict=True))
