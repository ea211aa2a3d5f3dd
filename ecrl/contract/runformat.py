"""The run directory: what the runtime writes and the verifier reads (torch-free).

::

    RUN/run.json                                 RunManifest
    RUN/supervisor.json                          SupervisorState (attempts, restarts, status)
    RUN/logs/attempt-NNN/rank-NNN.jsonl          StepRecord per line
    RUN/logs/attempt-NNN/checkpoint_rank0.jsonl  CheckpointEvent per line
    RUN/checkpoints/latest.json                  LatestPointer

Every record carries ``schema_version``; a reader rejects versions it does not know rather than
guess. Records are typed, frozen dataclasses; ``from_dict`` validates field names and types and
keeps unknown fields in ``extra`` (adding fields is allowed by the contract, renaming is not), and
``to_dict`` writes them back, so a round trip loses nothing.

JSON-lines files are appended one whole line per ``write`` and flushed, so the only damage a
killed process can do is a torn last line (no trailing newline). :class:`JsonlReader` tolerates
exactly that, where the caller says the file belongs to a failed attempt, and reports it as a
warning; every other defect is a :class:`~ecrl.contract.errors.RunFormatError` at ``file:line``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from ecrl.contract.atomicio import AppendLog, atomic_write_bytes
from ecrl.contract.errors import RunFormatError

try:  # orjson is several times faster; the format is plain JSON either way.
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    _JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is a declared dependency

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    _JSON_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)

__all__ = [
    "SCHEMA_VERSION",
    "STRATEGIES",
    "SAMPLER_KINDS",
    "RunManifest",
    "SupervisorAttempt",
    "SupervisorState",
    "StepRecord",
    "CheckpointEvent",
    "LatestPointer",
    "TornLine",
    "JsonlReader",
    "JsonlWriter",
    "RunPaths",
    "read_json_record",
    "write_json_record",
    "find_runs",
    "is_run_dir",
    "dumps",
    "loads",
]

SCHEMA_VERSION = 1
STRATEGIES = ("none", "blocking", "overlapped", "sharded", "sharded-async", "jit")
"""Checkpoint strategies a manifest may name (the runtime builds the first three so far)."""
SAMPLER_KINDS = ("ecrl", "external")
"""``run.json`` ``sampler.kind``: ECRL's own order, or one the verifier can only audit."""

loads = _loads
dumps = _dumps


# --- field validation -------------------------------------------------------------------------

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_nonneg_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_hash(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 16 and not v.strip("0123456789abcdef")


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


_DESCRIBE: dict[Check, str] = {
    _is_int: "an integer",
    _is_nonneg_int: "a non-negative integer",
    _is_number: "a number",
    _is_hash: "16 lowercase hex digits",
    _is_str: "a string",
    _is_bool: "true or false",
    _is_dict: "an object",
}

T = TypeVar("T", bound="_Record")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Record:
    """Base of every record: typed fields, validation from JSON, lossless round trip."""

    # name -> (check, description); fields absent here are not read from JSON (only ``extra``).
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = {}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields this version of the schema does not name; kept so a round trip loses nothing."""

    @classmethod
    def from_dict(cls: type[T], data: Any, *, where: tuple[str, int | None] = ("<memory>", None)
                  ) -> T:
        """Validate ``data`` (one parsed JSON value) into a record; errors name ``where``."""
        path, line = where
        if not isinstance(data, dict):
            raise RunFormatError(path, line, f"expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RunFormatError(
                path,
                line,
                f"unsupported schema_version {version!r} (this ECRL reads {SCHEMA_VERSION}); "
                "verify with the ECRL version that wrote the run",
            )
        kwargs: dict[str, Any] = {}
        for name, (check, what) in cls._SPEC.items():
            if name not in data:
                if name in cls._OPTIONAL:
                    continue
                raise RunFormatError(path, line, f"missing field {name!r}")
            value = data[name]
            if not check(value):
                raise RunFormatError(path, line, f"field {name!r} must be {what}, got {value!r}")
            kwargs[name] = value
        extra = {k: v for k, v in data.items() if k not in cls._SPEC and k != "schema_version"}
        if extra:
            kwargs["extra"] = extra
        return cls._build(kwargs, where)

    @classmethod
    def _build(cls: type[T], kwargs: dict[str, Any], where: tuple[str, int | None]) -> T:
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if value is None and name in self._OPTIONAL:
                continue
            out[name] = value
        out.update(self.extra)
        return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A record's fields but ``extra``, in order (``to_dict`` runs once per logged step)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.name != "extra")
    return names


def _spec(**items: Check | tuple[Check, str]) -> dict[str, tuple[Check, str]]:
    spec: dict[str, tuple[Check, str]] = {}
    for name, item in items.items():
        spec[name] = item if isinstance(item, tuple) else (item, _DESCRIBE[item])
    return spec


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class RunManifest(_Record):
    """``run.json``: what the run was asked to do; the verifier's expectations come from here."""

    seed: int
    """Permutation (and training) seed."""
    dataset: Mapping[str, Any]
    """``{"name": str, "size": int}``."""
    global_batch: int
    """B, constant for the whole run."""
    steps_per_epoch: int
    """S = D // B, recorded so a reader can cross-check it."""
    target_steps: int
    """Committed steps the run must reach (steps 0..target_steps-1)."""
    permutation: Mapping[str, Any]
    """``{"algorithm": str, "version": int}`` of :mod:`ecrl.contract.semantics`."""
    log_ids: bool
    """Whether step records carry full ``sample_ids`` (else count + hash only)."""
    strategy: str
    """Checkpoint strategy: one of :data:`STRATEGIES`."""
    ckpt_every: int
    """Checkpoint every K committed steps (0: never)."""
    fail_at: list[int]
    """Global steps after which a failure is injected."""
    world_sizes: list[int]
    """World size per attempt; the last one repeats."""
    model: str
    created: str
    """ISO-8601 time the run directory was created."""
    sampler: Mapping[str, Any] | None = None
    """What fed the run: ``{"kind": "ecrl"}`` (windows are known and checked; also when absent)
    or ``{"kind": "external", "name": ...}`` (a sampler whose order ECRL does not know, e.g.
    ``torch.utils.data.DistributedSampler``: the verifier audits what it can prove without
    windows). Further keys describe the sampler and are kept as they are."""

    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"sampler"})
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        seed=_is_nonneg_int,
        dataset=(
            lambda v: isinstance(v, dict) and _is_str(v.get("name")) and _is_int(v.get("size"))
            and v["size"] > 0,
            'an object {"name": str, "size": positive int}',
        ),
        global_batch=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        steps_per_epoch=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        target_steps=_is_nonneg_int,
        permutation=(
            lambda v: isinstance(v, dict) and _is_str(v.get("algorithm"))
            and _is_int(v.get("version")),
            'an object {"algorithm": str, "version": int}',
        ),
        log_ids=_is_bool,
        strategy=_is_str,
        ckpt_every=_is_nonneg_int,
        fail_at=(_list_of(_is_nonneg_int), "a list of non-negative integers"),
        world_sizes=(
            lambda v: isinstance(v, list) and bool(v) and all(_is_int(x) and x > 0 for x in v),
            "a non-empty list of positive integers",
        ),
        model=_is_str,
        created=_is_str,
        sampler=(
            lambda v: isinstance(v, dict) and v.get("kind") in SAMPLER_KINDS
            and (v["kind"] == "ecrl" or _is_str(v.get("name"))),
            '{"kind": "ecrl"} or {"kind": "external", "name": str, ...}',
        ),
    )

    @property
    def external_sampler(self) -> bool:
        """True when the run's order is not ECRL's (windows cannot be checked, only audited)."""
        return self.sampler is not None and self.sampler.get("kind") == "external"

    @property
    def dataset_size(self) -> int:
        return int(self.dataset["size"])

    def world_size_of(self, attempt: int) -> int:
        """World size planned for ``attempt`` (the last entry repeats)."""
        return self.world_sizes[min(attempt, len(self.world_sizes) - 1)]


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisorAttempt:
    """One launch of ``torchrun`` as the supervisor saw it."""

    attempt: int
    world_size: int
    resumed_from_step: int | None
    """Global step of the checkpoint this attempt loaded (None: fresh start)."""
    first_step: int | None
    """First global step the attempt ran (None until known)."""
    last_step: int | None
    """Last global step the attempt completed (None if it completed none)."""
    exit_code: int | None
    status: str
    """running, completed, failed or stopped."""
    start_time: float
    end_time: float | None

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        attempt=_is_nonneg_int,
        world_size=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        resumed_from_step=(_optional(_is_nonneg_int), "a non-negative integer or null"),
        first_step=(_optional(_is_nonneg_int), "a non-negative integer or null"),
        last_step=(_optional(_is_nonneg_int), "a non-negative integer or null"),
        exit_code=(_optional(_is_int), "an integer or null"),
        status=_is_str,
        start_time=_is_number,
        end_time=(_optional(_is_number), "a number or null"),
    )

    @classmethod
    def from_dict(cls, data: Any, *, where: tuple[str, int | None]) -> SupervisorAttempt:
        path, line = where
        if not isinstance(data, dict):
            raise RunFormatError(path, line, "each attempt must be a JSON object")
        kwargs = {}
        for name, (check, what) in cls._SPEC.items():
            if name not in data:
                raise RunFormatError(path, line, f"attempt is missing field {name!r}")
            if not check(data[name]):
                raise RunFormatError(
                    path, line, f"attempt field {name!r} must be {what}, got {data[name]!r}"
                )
            kwargs[name] = data[name]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisorState(_Record):
    """``supervisor.json``: every attempt, rewritten atomically as the run progresses."""

    attempts: list[SupervisorAttempt]
    restarts: int
    status: str
    """running, completed, failed (restart limit or unrecoverable) or stopped (by the user)."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        attempts=(lambda v: isinstance(v, list), "a list of attempt objects"),
        restarts=_is_nonneg_int,
        status=_is_str,
    )

    @classmethod
    def _build(cls, kwargs: dict[str, Any], where: tuple[str, int | None]) -> SupervisorState:
        kwargs["attempts"] = [
            SupervisorAttempt.from_dict(a, where=where) for a in kwargs["attempts"]
        ]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = _Record.to_dict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord(_Record):
    """One line of ``rank-NNN.jsonl``: what one rank consumed at one committed-or-not step."""

    attempt: int
    global_step: int
    epoch: int
    cursor_step: int
    rank: int
    world_size: int
    local_batch: int
    sample_ids_count: int
    sample_ids_hash: str
    """:func:`ecrl.contract.semantics.format_hash` of the IDs this rank consumed."""
    loss: float | None
    """Loss of this rank's shard (null when the loss was not finite)."""
    time: float
    """Wall-clock seconds (Unix time) when the step's update completed."""
    sample_ids: list[int] | None = None
    """The IDs themselves, when the run logs them (``run.json`` ``log_ids``)."""

    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"sample_ids"})
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        attempt=_is_nonneg_int,
        global_step=_is_nonneg_int,
        epoch=_is_nonneg_int,
        cursor_step=_is_nonneg_int,
        rank=_is_nonneg_int,
        world_size=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        local_batch=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        sample_ids_count=_is_nonneg_int,
        sample_ids_hash=_is_hash,
        loss=(_optional(_is_number), "a number or null"),
        time=_is_number,
        sample_ids=(_list_of(_is_int), "a list of integers"),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointEvent(_Record):
    """One line of ``checkpoint_rank0.jsonl``: the cost of one checkpoint, by phase."""

    global_step: int
    """Last completed step the checkpoint captures (resume runs global_step + 1)."""
    strategy: str
    snapshot_s: float
    """Copying training state off the live objects."""
    write_s: float
    """Serialising and writing durably (in the background for ``overlapped``)."""
    enqueue_s: float
    """Handing the snapshot to the background writer."""
    backpressure_s: float
    """Waiting for a free slot when the writer had ``max_inflight`` writes pending."""
    stall_s: float
    """Time training was stopped for this checkpoint, barriers included."""
    bytes: int
    path: str
    """Checkpoint file, relative to ``checkpoints/``."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        global_step=_is_nonneg_int,
        strategy=_is_str,
        snapshot_s=_is_number,
        write_s=_is_number,
        enqueue_s=_is_number,
        backpressure_s=_is_number,
        stall_s=_is_number,
        bytes=_is_nonneg_int,
        path=_is_str,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LatestPointer(_Record):
    """``checkpoints/latest.json``: the newest durable checkpoint."""

    path: str
    """Relative to ``checkpoints/``; never absolute, never outside it."""
    global_step: int
    epoch: int
    cursor_step: int
    world_size: int
    time: float
    checksum: str
    """``algorithm:hexdigest`` of the checkpoint payload."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = _spec(
        path=(
            lambda v: isinstance(v, str) and bool(v) and not os.path.isabs(v)
            and ".." not in Path(v).parts,
            "a relative path inside checkpoints/",
        ),
        global_step=_is_nonneg_int,
        epoch=_is_nonneg_int,
        cursor_step=_is_nonneg_int,
        world_size=(lambda v: _is_int(v) and v > 0, "a positive integer"),
        time=_is_number,
        checksum=(lambda v: isinstance(v, str) and ":" in v, "'algorithm:hexdigest'"),
    )


# --- reading and writing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TornLine:
    """A warning: the last line of a failed attempt's file was cut short by the crash."""

    path: str
    line: int
    preview: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: torn last line ignored (crash while writing): " \
               f"{self.preview!r}"


R = TypeVar("R", bound=_Record)


class JsonlReader(Generic[R]):
    """Stream ``(line_number, record)`` from a JSON-lines file, in constant memory.

    ``torn_tail_ok``: the file belongs to an attempt that crashed, so a last line without its
    newline is expected; it is skipped and appended to :attr:`warnings`. Otherwise, and for any
    defect elsewhere, :class:`RunFormatError` names the file and line.
    """

    def __init__(self, path: str | os.PathLike[str], record: type[R], *, torn_tail_ok: bool
                 ) -> None:
        self.path = str(path)
        self.record = record
        self.torn_tail_ok = torn_tail_ok
        self.warnings: list[TornLine] = []

    def raw(self) -> Iterator[tuple[int, Any]]:
        """``(line_number, parsed JSON)`` without record validation (fast path for checkers)."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed in finally
        except OSError as exc:
            raise RunFormatError(self.path, None, f"cannot read: {exc.strerror}") from None
        try:
            number = 0
            for number, line in enumerate(handle, start=1):
                if not line.endswith(b"\n"):
                    # Only the last line can lack its newline.
                    if self.torn_tail_ok:
                        preview = line[:60].decode("utf-8", "replace")
                        self.warnings.append(TornLine(self.path, number, preview))
                        return
                    raise RunFormatError(
                        self.path,
                        number,
                        "last line is incomplete (no newline), but this attempt did not crash",
                    )
                if not line.strip():
                    raise RunFormatError(self.path, number, "empty line")
                try:
                    yield number, _loads(line)
                except _JSON_ERRORS as exc:
                    raise RunFormatError(self.path, number, f"not valid JSON ({exc})") from None
        finally:
            handle.close()

    def __iter__(self) -> Iterator[tuple[int, R]]:
        for number, data in self.raw():
            yield number, self.record.from_dict(data, where=(self.path, number))


class JsonlWriter:
    """Append records to a JSON-lines file, one flushed line each."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self._log = AppendLog(path, fsync=fsync)
        self.path = self._log.path

    def write(self, record: _Record) -> None:
        self._log.append(_dumps(record.to_dict()) + b"\n")

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json_record(path: str | os.PathLike[str], record: _Record, *,
                      hook: Callable[[str], None] | None = None) -> None:
    """Atomically replace ``path`` with ``record`` (pretty-printed: people read these files).

    ``hook`` is passed to :func:`ecrl.contract.atomicio.atomic_write_bytes` (crash tests).
    """
    text = json.dumps(record.to_dict(), indent=2, sort_keys=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), hook=hook)


def read_json_record(path: str | os.PathLike[str], record: type[R]) -> R:
    """Read and validate a whole-file JSON record."""
    p = str(path)
    try:
        data = Path(p).read_bytes()
    except FileNotFoundError:
        raise RunFormatError(p, None, "file is missing") from None
    except OSError as exc:
        raise RunFormatError(p, None, f"cannot read: {exc.strerror}") from None
    try:
        parsed = _loads(data)
    except _JSON_ERRORS as exc:
        raise RunFormatError(p, None, f"not valid JSON ({exc})") from None
    return record.from_dict(parsed, where=(p, None))


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Where each file of a run directory lives."""

    root: Path

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> RunPaths:
        return cls(Path(root))

    @property
    def manifest(self) -> Path:
        return self.root / "run.json"

    @property
    def supervisor(self) -> Path:
        return self.root / "supervisor.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest(self) -> Path:
        return self.checkpoints / "latest.json"

    def attempt_dir(self, attempt: int) -> Path:
        return self.logs / f"attempt-{attempt:03d}"

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.attempt_dir(attempt) / f"rank-{rank:03d}.jsonl"

    def checkpoint_log(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "checkpoint_rank0.jsonl"

    def attempts(self) -> list[int]:
        """Attempt numbers that have a log directory, ascending."""
        if not self.logs.is_dir():
            return []
        found = []
        for entry in self.logs.iterdir():
            name = entry.name
            if entry.is_dir() and name.startswith("attempt-") and name[8:].isdigit():
                found.append(int(name[8:]))
        return sorted(found)

    def rank_logs(self, attempt: int) -> dict[int, Path]:
        """``{rank: path}`` of the step logs one attempt wrote."""
        directory = self.attempt_dir(attempt)
        found: dict[int, Path] = {}
        if directory.is_dir():
            for entry in directory.iterdir():
                stem = entry.name
                if stem.startswith("rank-") and stem.endswith(".jsonl") and stem[5:-6].isdigit():
                    found[int(stem[5:-6])] = entry
        return dict(sorted(found.items()))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """A directory holding ``run.json`` or a ``logs/`` folder is treated as a run when it is named
    directly (so a run that lost its ``run.json`` still gets a verdict saying so)."""
    p = Path(path)
    return (p / "run.json").is_file() or (p / "logs").is_dir()


def find_runs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if it is a run, else every run directory below it, sorted.

    Below ``path`` a run is recognised by its ``run.json`` only, and hidden directories are not
    entered: ``.git`` has a ``logs/`` folder too, and is no run.
    """
    root = Path(path)
    if is_run_dir(root):
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if here != root and (here / "run.json").is_file():
            found.append(here)
            dirnames.clear()  # runs do not nest
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(found)

