"""DCP's storage for ECRL's sharded checkpoints: a rank's chunk as one byte entry written
straight from the state, each part hashed while it is written, recycled parts of a retired
checkpoint written over, crash points for tests, and DCP's errors turned into one line."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemWriter,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from ecrl.contract import safepath
from ecrl.contract.ckptfile import CHECKSUM_ALGORITHM, CheckpointError
from ecrl.contract.shardfile import (
    ALIGN,
    METADATA_FILE,
    RECYCLED,
    SUFFIX,
)
from ecrl.runtime.checkpoint.persist import (
    CRASH_EXIT_CODE,
    DISK_FULL_POINT,
    CrashHook,
    remove_checkpoint,
)
from ecrl.runtime.checkpoint.pipeline import warn

CRASH_RANK_ENV = "ECRL_CRASH_RANK"


def shard_name(global_step: int) -> str:
    """Directory name (inside ``checkpoints/``) of the sharded checkpoint after ``global_step``."""
    return f"step-{global_step:08d}{SUFFIX}"


class Crash:
    """The ``sharded`` crash point of one checkpoint on this rank (tests and ``ecrl faults``)."""

    def __init__(self, hook: CrashHook, rank: int) -> None:
        only = os.environ.get(CRASH_RANK_ENV)
        self._hook = hook.for_write("sharded")
        if only not in (None, "") and int(only) != rank:
            self._hook = None
        self.point = hook.point if self._hook is not None else None

    def at(self, point: str) -> None:
        if self._hook is not None:
            self._hook(point)

    def armed(self, point: str) -> bool:
        return self.point == point


class ChunkBytes(io.BytesIO):
    """A chunk handed to DCP as a byte entry, without its bytes ever being gathered in one buffer:
    the pieces (offset in the chunk, tensor) are written one after the other, zero-padded to their
    offsets, straight from where they lie (the live state under ``sharded``, whose training waits
    for the commit; the staged chunk under ``sharded-async``). DCP writes a byte entry as
    ``stream.write(entry.getbuffer())``, and :class:`_HashingStream` knows this object; nothing is
    copied into a chunk first and nothing goes through ``torch.save`` (its zip framing and CRC-32
    cost about as much as the write itself). ``io.BytesIO`` only because DCP requires that type of
    a byte entry; the base object stays empty."""

    def __init__(self, pieces: list[tuple[int, torch.Tensor]], nbytes: int) -> None:
        super().__init__()
        self.pieces = sorted(pieces, key=lambda piece: piece[0])
        self.nbytes = nbytes

    def getbuffer(self) -> Any:
        return self

    def views(self) -> Iterator[memoryview]:
        """The chunk's bytes in order, as views of the pieces and of zero padding."""
        at = 0
        for offset, tensor in self.pieces:
            if offset < at:
                raise ValueError(f"chunk pieces overlap at byte {offset}")
            yield from _zeros(offset - at)
            view = _byte_view(tensor)
            yield view
            at = offset + view.nbytes
        if at > self.nbytes:
            raise ValueError(f"chunk pieces end at byte {at}, past the chunk's {self.nbytes}")
        yield from _zeros(self.nbytes - at)


_ZEROS = memoryview(bytes(ALIGN))


def _zeros(count: int) -> Iterator[memoryview]:
    while count > 0:
        yield _ZEROS[:min(count, ALIGN)]
        count -= ALIGN


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` (any dtype, any device) as a flat view, copied only when the tensor
    is not a contiguous CPU tensor."""
    flat = tensor.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    array: Any = flat.numpy()
    return memoryview(array)


class _HashingStream:
    """A file DCP writes its part into, hashed on the way (SHA-256 and size of every byte).

    DCP writes a part front to back (``tell`` for offsets, ``write``, ``flush``, ``fsync``), so
    the digest of what passed through is the digest of the file: no second pass reads the part
    back from the page cache to checksum it. A thread hashes the bytes in write order, and starts
    only at ``flush`` (which DCP calls right before its ``fsync``): the writes have the core to
    themselves, and the hash runs while the process waits for the disk. A chunk's pieces
    (:class:`ChunkBytes`) stay unchanged until the save ends, so they are hashed from where they
    lie; any other buffer (DCP's own small writes) is hashed from a copy."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._pending: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._go = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def _hash_in_order(self) -> None:
        self._go.wait()
        while (segment := self._pending.get()) is not None:
            if self._failed is None:
                try:
                    self.sha256.update(segment)
                except BaseException as exc:  # raised again by hexdigest(), on the writer
                    self._failed = exc

    def write(self, data: Any) -> int:
        if self._thread is None:
            self._thread = threading.Thread(target=self._hash_in_order, daemon=True,
                                            name="ecrl-part-hash")
            self._thread.start()
        if isinstance(data, ChunkBytes):
            return sum(self._write(view, view) for view in data.views())
        view = memoryview(data).cast("B")
        return self._write(view, bytes(view))

    def _write(self, view: memoryview, segment: Any) -> int:
        self._pending.put(segment)
        written = self.raw.write(view)
        if written != len(view):  # a buffered file writes all or raises; anything else is a bug
            raise OSError(errno.EIO, f"short write of a checkpoint part ({written} of "
                                     f"{len(view)} bytes)")
        self.size += written
        return written

    def hexdigest(self) -> str:
        """The digest of every byte written (waits for the hashing thread)."""
        self.stop()
        if self._failed is not None:
            raise self._failed
        return self.sha256.hexdigest()

    def finish(self) -> None:
        """No more writes: the thread hashes what is queued and ends by itself."""
        if self._thread is not None:
            self._pending.put(None)
            self._go.set()

    def stop(self) -> None:
        self.finish()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()
        self._go.set()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        """Cut off what a recycled file held past the content written (DCP closes the stream
        when the part is complete), then close."""
        if not self.raw.closed:
            self.raw.truncate()
            self.raw.close()


class HashingFileSystem(FileSystem):
    """DCP's local file system whose new files are hashed as they are written; :meth:`digest`
    waits for a file's hash to finish."""

    def __init__(self) -> None:
        super().__init__()
        self._hashing: dict[str, _HashingStream] = {}

    def digest(self, name: str) -> tuple[str, int]:
        """(``sha256:<hex>``, size) of the file ``name`` written whole through this system."""
        hashing = self._hashing[name]
        return f"{CHECKSUM_ALGORITHM}:{hashing.hexdigest()}", hashing.size

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        # A recycled part (:func:`retire`) is written over, in place; a new one created. Never
        # through a link and never into a FIFO: a planted one is refused before a byte is written.
        fd = safepath.open_regular(path, write=True, create=True, error=CheckpointError)
        raw: BinaryIO = os.fdopen(fd, "r+b")
        with raw:
            hashing = _HashingStream(raw)
            try:
                yield hashing
                hashing.close()
            except BaseException:
                hashing.stop()
                raise
        hashing.finish()
        self._hashing[Path(path).name] = hashing


def retire(path: Path) -> None:
    """Retention's removal of a checkpoint: a sharded one's parts are recycled, not deleted.

    Writing a new 94 MB file took 230-250 ms here, writing over a recycled one whose pages are
    still in the page cache 17 ms: the pages of a new file are memory the kernel must first hand
    out (on this virtual machine each page's first touch is paid to the host), the recycled file's
    are there already, and its blocks are allocated. Databases recycle their log segments for the
    same reason."""
    if path.name.endswith(SUFFIX) and safepath.kind_of(path, error=CheckpointError) == "dir":
        recycled = path.parent / RECYCLED
        with contextlib.suppress(OSError):
            for entry in path.iterdir():
                if not entry.name.endswith(".distcp") or entry.is_symlink() \
                        or not entry.is_file():
                    safepath.remove_entry(entry)  # first the manifest: now it is no checkpoint
            safepath.remove_entry(recycled)
            os.rename(path, recycled)
            return
    remove_checkpoint(path)


def take_recycled(directory: Path, tmp: Path) -> bool:
    """Make the recycled parts the temporary directory ``tmp`` of the next checkpoint.

    Only a real directory of regular files is taken: a link planted in its place (or among its
    parts) would send the next checkpoint's writes, and the clean-up of its stray parts, into
    another directory. Whatever was taken is checked again once it is ``tmp`` (it could have
    been swapped between the check and the rename); anything else there is removed itself,
    never followed, and the checkpoint is written into a fresh directory."""
    recycled = directory / RECYCLED
    try:
        if safepath.kind_of(recycled, error=CheckpointError) != "dir":
            safepath.remove_entry(recycled)
            return False
        os.rename(recycled, tmp)
        safepath.require_dir(tmp, error=CheckpointError)
        for entry in tmp.iterdir():
            safepath.kind_of(entry, error=CheckpointError)
    except CheckpointError as exc:
        warn(f"{exc} (checkpoints/{RECYCLED}: not reused, removed)")
        safepath.remove_entry(recycled)
        safepath.remove_entry(tmp)
        return False
    except OSError:
        return False
    return True


class PartWriter(FileSystemWriter):
    """DCP's file writer, remembering the files this rank wrote and their digests (taken while
    writing); crash points for tests."""

    def __init__(self, path: Path, crash: Crash) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1,
                         overwrite=True)
        self.fs: HashingFileSystem = HashingFileSystem()
        self.crash = crash
        self.written: list[str] = []

    def part_digests(self) -> dict[str, dict[str, Any]]:
        """``{part: {"checksum", "size"}}`` of the parts this rank wrote."""
        return {part: dict(zip(("checksum", "size"), self.fs.digest(part), strict=True))
                for part in self.written}

    def write_data(self, plan: Any, planner: Any) -> TorchFuture[list[WriteResult]]:
        if self.crash.armed(DISK_FULL_POINT):
            # A full disk surfaces at the write call, once part of the data reached the file.
            target = Path(self.path) / f"__{dist.get_rank() if dist.is_initialized() else 0}_0"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        future = super().write_data(plan, planner)
        results = future.wait()
        written = {r.storage_data.relative_path for r in results}
        for name in written:  # DCP names the parts; each must be a plain file of this directory
            safepath.check_name(name, where=f"{self.path}: DCP's relative_path",
                                error=CheckpointError)
        self.written = sorted(written)
        self.crash.at("after-parts")
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        if self.crash.armed("during-metadata"):
            # Torn: the process dies with half of .metadata on disk (never fsync'd whole).
            target = Path(self.path) / METADATA_FILE
            with open(target, "r+b") as handle:
                handle.truncate(max(1, target.stat().st_size // 2))
            os._exit(CRASH_EXIT_CODE)
        self.crash.at("after-metadata")



class ChunkPlanner(DefaultSavePlanner):
    """DCP's save planner that hands a chunk's byte entry to the writer as it is: DCP's default
    pickles the object of a byte entry with ``torch.save`` first."""

    def transform_object(self, write_item: Any, object: Any) -> Any:
        if isinstance(object, ChunkBytes):
            return object
        return super().transform_object(write_item, object)




def unwrap_failures(exc: BaseException) -> list[BaseException]:
    """The ranks' own exceptions inside DCP's CheckpointException (``(exception, stack)``)."""
    failures = getattr(exc, "failures", None) or {}
    out = []
    for failure in failures.values():
        inner = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(inner, BaseException):
            out.append(inner)
    return out


def first_line(exc: BaseException) -> str:
    for inner in unwrap_failures(exc):
        if isinstance(inner, OSError):
            return f"{inner.strerror or inner} ({inner.filename})"
        if isinstance(inner, BaseException):
            return (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def disk_problem(exc: BaseException) -> OSError | None:
    for inner in [exc, *unwrap_failures(exc)]:
        if isinstance(inner, OSError):
            return inner
    return None
