"""What ``ecrl run`` is asked to do: flags, TOML config, defaults, validation (torch-free).

Precedence: built-in defaults < ``--config FILE.toml`` < flags given on the command line. The
checkpoint settings are :class:`~ecrl.runtime.settings.CheckpointSettings`' fields: their docs,
defaults and checks live there, and ``ecrl launch`` shares their flags (:func:`launch_flags`). The
TOML file may hold the keys at top level or in a ``[run]`` table, spelled like the flags with
``-`` or ``_`` (``global-batch = 64``, ``world_sizes = [2, 1]``). Every problem is a
:class:`~ecrl.contract.errors.ConfigError` whose message names the flag or key and what to do.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.contract.strategies import describe
from ecrl.runtime.checkpoint.registry import REGISTRY, built_strategies, strategy_names
from ecrl.runtime.settings import (
    DATASETS,
    DEFAULT_FAKE_SIZE,
    DEFAULT_STEPS,
    DEFAULTS,
    MODELS,
    SUPERVISOR_DEFAULTS,
    TRAINER_DEFAULTS,
    CheckpointSettings,
    SupervisorSettings,
    TrainerSettings,
    check_finite,
    checkpoint_fields,
    field_docs,
    section_fields,
)

__all__ = [
    "read_config_text",
    "RunFlag",
    "run_flags",
    "LAUNCH_KEYS",
    "launch_flags",
    "STRATEGIES",
    "BUILT_STRATEGIES",
    "MODELS",
    "DATASETS",
    "DEFAULT_FAKE_SIZE",
    "DEFAULT_STEPS",
    "RunConfig",
    "load_config",
    "parse_int_list",
]

STRATEGIES = strategy_names()
"""Every strategy ``--strategy`` accepts (from :mod:`ecrl.runtime.checkpoint.registry`)."""
BUILT_STRATEGIES = built_strategies()
"""The strategies a run can use today (from :mod:`ecrl.runtime.checkpoint.registry`)."""
_KINDS: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("out", "dataset", "model", "strategy", "parallel", "data_dir", "deadline",
                     "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf"), str),
    "log_ids": bool,
    "warm_standby": bool,
    "verify_follow": bool,
    "lr": (int, float),
    "collective_timeout_s": (int, float),
    **dict.fromkeys(("deadline_k_step", "deadline_k_ckpt", "hang_timeout_s"), (int, float)),
}
_KIND_NAMES: dict[type | tuple[type, ...], str] = {
    str: "a string", bool: "true or false", (int, float): "a number",
}
MAX_INT = (1 << 63) - 1
"""Every integer setting fits a signed 64-bit integer: what run.json's readers (and the
contract's step arithmetic) accept."""


def parse_int_list(flag: str, value: Any) -> tuple[int, ...]:
    """``"2,1"``, ``[2, 1]`` or ``2`` → ``(2, 1)``; anything else is a one-line error."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be a list of integers, got {value!r}")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"{flag} must be a list of integers, got {value!r}")
    out = []
    for item in items:
        try:
            if isinstance(item, bool):
                raise ValueError
            out.append(int(item))
        except (TypeError, ValueError):
            raise ConfigError(f"{flag}: {item!r} is not an integer") from None
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """One training run under the supervisor (the flags of ``ecrl run``)."""

    # Each field is one `ecrl run` flag (run_flags): its docstring is the flag's help, after an
    # optional "METAVAR: " prefix; ``name`` in a docstring is shown as the flag --name.
    out: str
    """DIR: run directory; created, or resumed when it already holds a run."""
    # The sections' settings, in flag order: docs, defaults and checks in the sections
    # (settings.py): TrainerSettings (T), SupervisorSettings (S), CheckpointSettings (C).
    world_sizes: tuple[int, ...] = SUPERVISOR_DEFAULTS.world_sizes
    parallel: str = SUPERVISOR_DEFAULTS.parallel
    replicate: int = SUPERVISOR_DEFAULTS.replicate
    tp: int = SUPERVISOR_DEFAULTS.tp
    dataset: str = TRAINER_DEFAULTS.dataset
    data_dir: str | None = TRAINER_DEFAULTS.data_dir
    dataset_size: int | None = TRAINER_DEFAULTS.dataset_size
    model: str = TRAINER_DEFAULTS.model
    global_batch: int = TRAINER_DEFAULTS.global_batch
    steps: int | None = TRAINER_DEFAULTS.steps
    epochs: int | None = TRAINER_DEFAULTS.epochs
    ckpt_every: int = DEFAULTS.ckpt_every
    strategy: str = DEFAULTS.strategy
    max_inflight: int = DEFAULTS.max_inflight
    fail_at: tuple[int, ...] = SUPERVISOR_DEFAULTS.fail_at
    fail_rank: int = SUPERVISOR_DEFAULTS.fail_rank
    seed: int = TRAINER_DEFAULTS.seed
    log_ids: bool = TRAINER_DEFAULTS.log_ids
    max_restarts: int | None = SUPERVISOR_DEFAULTS.max_restarts
    deadline: str | None = SUPERVISOR_DEFAULTS.deadline
    deadline_k_step: float = DEFAULTS.deadline_k_step
    deadline_k_ckpt: float = DEFAULTS.deadline_k_ckpt
    hang_timeout_s: float | None = DEFAULTS.hang_timeout_s
    keep_checkpoints: int = DEFAULTS.keep_checkpoints
    lr: float = TRAINER_DEFAULTS.lr
    image_size: int = TRAINER_DEFAULTS.image_size
    threads: int | None = TRAINER_DEFAULTS.threads
    warm_standby: bool = SUPERVISOR_DEFAULTS.warm_standby
    verify_follow: bool = SUPERVISOR_DEFAULTS.verify_follow
    collective_timeout_s: float = SUPERVISOR_DEFAULTS.collective_timeout_s
    nnodes: int = SUPERVISOR_DEFAULTS.nnodes
    rdzv_backend: str | None = SUPERVISOR_DEFAULTS.rdzv_backend
    rdzv_endpoint: str | None = SUPERVISOR_DEFAULTS.rdzv_endpoint
    rdzv_id: str | None = SUPERVISOR_DEFAULTS.rdzv_id
    rdzv_conf: str | None = SUPERVISOR_DEFAULTS.rdzv_conf
    explicit: frozenset[str] = field(default=frozenset(), compare=False)
    """Names of the fields the user set (flag or config file), for resume checks."""

    def __post_init__(self) -> None:
        def bad(flag: str, message: str) -> ConfigError:
            return ConfigError(f"--{flag} {message}")

        for f in fields(self):
            value = getattr(self, f.name)
            kind = _KINDS.get(f.name)
            if kind is not None and value is not None and not (
                    isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))):
                raise bad(f.name.replace("_", "-"), f"must be {_KIND_NAMES[kind]}, got {value!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, int) and not isinstance(v, bool) and v > MAX_INT
                   for v in values):
                raise bad(f.name.replace("_", "-"), f"must be at most {MAX_INT}")
        check_finite(self)
        if not self.out:
            raise bad("out", "must name a directory")
        # Each section checks its own settings; what ties sections together is checked here.
        self.checkpoint  # noqa: B018
        self.trainer  # noqa: B018
        self.supervisor  # noqa: B018
        if self.strategy == "jit" and self.parallel != "ddp":
            # The Checkpointer refuses it in every rank too (a script's own sharded model).
            raise ConfigError(f"--strategy jit with --parallel {self.parallel}: no rank of a "
                              "sharded model holds a full replica to rescue from; use "
                              "blocking, overlapped or sharded")
        for w, mesh in zip(self.world_sizes, self.supervisor.meshes, strict=True):
            try:
                if mesh.tp == 1:
                    semantics.local_batch(self.global_batch, w)
                else:
                    semantics.mesh_local_batch(self.global_batch, mesh.dp_size)
            except SemanticsError as exc:
                raise ConfigError(f"--global-batch/--world-sizes: {exc}") from None

    # --- derived values -----------------------------------------------------------------------

    @property
    def checkpoint(self) -> CheckpointSettings:
        """The checkpoint section of this run (validated)."""
        return CheckpointSettings(**{name: getattr(self, name) for name in checkpoint_fields()})

    @property
    def trainer(self) -> TrainerSettings:
        """The trainer section of this run (validated)."""
        return TrainerSettings(**{name: getattr(self, name)
                                  for name in section_fields(TrainerSettings)})

    @property
    def supervisor(self) -> SupervisorSettings:
        """The supervisor section of this run (validated)."""
        return SupervisorSettings(**{name: getattr(self, name)
                                     for name in section_fields(SupervisorSettings)})

    @property
    def checkpoint_given(self) -> dict[str, Any]:
        """The checkpoint settings the user gave (a flag or the config file): what the
        supervisor passes to the ranks, so that the others leave the script's own choice alone."""
        return {name: getattr(self, name) for name in checkpoint_fields()
                if name in self.explicit}

    @property
    def effective_ckpt_every(self) -> int:
        """0 when the strategy takes no checkpoints."""
        return self.checkpoint.effective_ckpt_every

    @property
    def effective_max_restarts(self) -> int:
        return self.supervisor.effective_max_restarts

    def threads_per_rank(self, ranks_per_node: int) -> int:
        """torch CPU threads of each rank: ``threads``, or the usable cores shared out."""
        return self.trainer.threads_per_rank(ranks_per_node)

    def fake_size(self) -> int:
        return self.trainer.fake_size()

    def geometry(self, dataset_size: int) -> semantics.Geometry:
        try:
            return semantics.Geometry(dataset_size=dataset_size, global_batch=self.global_batch)
        except SemanticsError as exc:
            raise ConfigError(str(exc)) from None

    def target_steps(self, dataset_size: int) -> int:
        """T: from --steps, or --epochs x S; failures must lie inside [0, T)."""
        geometry = self.geometry(dataset_size)
        if self.epochs is not None:
            target = self.epochs * geometry.steps_per_epoch
            if target > MAX_INT:
                raise ConfigError(f"--epochs {self.epochs}: {target} steps is more than the "
                                  f"{MAX_INT} a run can have")
        else:
            target = self.steps if self.steps is not None else DEFAULT_STEPS
        late = [f for f in self.fail_at if f >= target]
        if late:
            raise ConfigError(
                f"--fail-at {','.join(map(str, late))}: the run has steps 0..{target - 1} only, "
                "so these failures could never fire"
            )
        return target

    def command_line(self, *, out: str = "NEW_DIR") -> str:
        """The ``ecrl run`` command that starts a run of this definition in ``out``."""
        parts = ["ecrl", "run", "--out", shlex.quote(out)]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("out", "explicit") or (f.default is not MISSING and value == f.default):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                parts += [flag] if value else []
            else:
                text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
                parts += [flag, shlex.quote(text)]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("explicit")
        data["world_sizes"] = list(self.world_sizes)
        data["fail_at"] = list(self.fail_at)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, explicit: frozenset[str] = frozenset()
                  ) -> RunConfig:
        known = {f.name for f in fields(cls)} - {"explicit"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown setting {unknown[0]!r}")
        values = dict(data)
        for key in ("world_sizes", "fail_at"):
            if key in values:
                values[key] = parse_int_list(f"--{key.replace('_', '-')}", values[key])
        return cls(**values, explicit=explicit)

    def with_explicit(self, **changes: Any) -> RunConfig:
        return replace(self, **changes, explicit=self.explicit | frozenset(changes))


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFlag:
    """One ``ecrl run`` flag, generated from a documented :class:`RunConfig` field."""

    name: str
    """The field, and the flag's argparse destination."""
    flag: str
    """``--global-batch`` for ``global_batch``."""
    kind: str
    """int, float, str, bool (a switch) or ints (a comma-separated list)."""
    metavar: str | None
    help: str
    """The field's docstring, with its default appended."""


_METAVAR = re.compile(r"^([A-Z][A-Z0-9]*(?:[,:=][A-Z0-9]+)*(?:,…)?): ")


@functools.cache
def run_flags() -> tuple[RunFlag, ...]:
    """The flags of ``ecrl run``, one per RunConfig field, in field order: the single source of
    their names, types and help."""
    docs = {**field_docs(TrainerSettings), **field_docs(SupervisorSettings),
            **field_docs(CheckpointSettings), **field_docs(RunConfig)}
    names = {f.name for f in fields(RunConfig)}
    flags = []
    for f in fields(RunConfig):
        if f.name == "explicit":
            continue
        doc = docs[f.name]  # a KeyError here is a field added without its docstring
        doc = doc.replace("{strategies}", describe(strategy_names())).replace(
            "{background}", " and ".join(n for n in strategy_names() if REGISTRY[n].background))
        match = _METAVAR.match(doc)
        metavar, text = (match.group(1), doc[match.end():]) if match else (None, doc)
        text = re.sub(r"``(\w+)``", lambda m: "--" + m.group(1).replace("_", "-")
                      if m.group(1) in names else m.group(1), text)
        kind = str(f.type)
        kind = ("ints" if kind.startswith("tuple") else "bool" if kind == "bool"
                else "float" if "float" in kind else "int" if "int" in kind else "str")
        text = text.rstrip(".")
        if text[:1].isupper() and text[1:2].islower():
            text = text[0].lower() + text[1:]  # argparse's style: help starts in lower case
        if f.default not in (MISSING, None, False, ()) and "default" not in text:
            shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) \
                else f.default
            text = f"{text} (default {shown})"
        flags.append(RunFlag(name=f.name, flag="--" + f.name.replace("_", "-"), kind=kind,
                             metavar=metavar, help=text.replace("%", "%%")))
    return tuple(flags)


LAUNCH_KEYS = ("world_sizes", "parallel", "replicate", "tp", "ckpt_every", "strategy",
               "max_inflight", "fail_at", "fail_rank", "max_restarts", "keep_checkpoints",
               "deadline", "deadline_k_step", "deadline_k_ckpt", "hang_timeout_s", "threads",
               "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "warm_standby",
               "verify_follow")
"""The settings of ``ecrl launch``: the supervisor's and the checkpoint section (a subset of
``ecrl run``'s; data, model, batch and steps are the script's)."""
_LAUNCH_HELP = {
    "threads": "OMP_NUM_THREADS per rank (default: cores / ranks per node)",
    "nnodes": "torchrun --nnodes; one ecrl launch per node (docs/library.md)",
    "rdzv_id": "torchrun --rdzv-id (same on every node)",
    "max_restarts": "relaunches allowed after failures (default: injected failures + 3)",
    "parallel": "ddp, fsdp or hsdp: the mesh ecrl.init_mesh builds (default: the script's "
                "init_mesh argument, else ddp)",
    "replicate": "hsdp's replica groups at the first world size (default: the script's "
                 "init_mesh argument, else 1)",
    "tp": "tensor-parallel degree of ecrl.init_mesh's mesh (default: the script's init_mesh "
          "argument, else 1)",
}
"""Where a launch flag's help says more than its ``ecrl run`` twin (the script has no
``--threads`` of its own; several nodes need one launch each)."""


@functools.cache
def launch_flags() -> tuple[RunFlag, ...]:
    """The settings flags of ``ecrl launch``: ``ecrl run``'s (:func:`run_flags`) for
    :data:`LAUNCH_KEYS`, in their order there, with the same names, types and help."""
    flags = {f.name: f for f in run_flags()}
    out = []
    for name in LAUNCH_KEYS:
        flag = flags[name]
        if name in _LAUNCH_HELP:
            flag = replace(flag, help=_LAUNCH_HELP[name])
        elif name in checkpoint_fields():
            # Not given, a checkpoint setting is the script's own (docs/library.md, precedence).
            flag = replace(flag, help=re.sub(r"\(default:? ", "(default: the script's "
                                             "Checkpointer argument, else ", flag.help))
        out.append(flag)
    return tuple(out)


MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this is not a run's settings (nor a matrix's)."""


def read_config_text(path: str | os.PathLike[str], *, name: str | None = None,
                     remedy: str = "give a TOML file of settings") -> str:
    """The text of a config file the user named (``ecrl run --config``, ``ecrl matrix CONFIG``):
    a regular file of UTF-8 text, or a one-line :class:`ConfigError` ``NAME: why: REMEDY``
    (``name`` defaults to ``--config PATH``).

    Opened without blocking, so that a FIFO or a device (or a symlink to one) is refused instead
    of hanging the command; a directory, a binary file or a huge one is refused too."""
    where = name if name is not None else f"--config {os.fspath(path)}"

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{where}: {why}: {remedy}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise refuse("no such file") from None
    except IsADirectoryError:
        raise refuse("is a directory, not a file") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise refuse("is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise refuse("is not a regular file (a FIFO, socket or device)")
        if info.st_size > MAX_CONFIG_BYTES:
            raise refuse(f"is {info.st_size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a "
                         "settings file can have")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:
        raise refuse(f"is more than the {MAX_CONFIG_BYTES:,} bytes a settings file can have")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"is not text (byte {exc.start} is not UTF-8)") from None
    if "\0" in text:
        raise refuse("is not text (it holds NUL bytes)")
    return text


def _read_toml(path: Path) -> dict[str, Any]:
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if "run" in data and isinstance(data["run"], dict):
        extra = sorted(k for k in data if k != "run")
        if extra:
            raise ConfigError(f"{path}: put {extra[0]!r} inside the [run] table")
        data = data["run"]
    known = {f.name for f in fields(RunConfig)} - {"explicit"}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (the keys are the flags of ecrl run, "
                              "e.g. global-batch)")
        if name in ("out", "data_dir") and isinstance(value, str):
            value = str(path.parent / value) if not os.path.isabs(value) else value
        out[name] = value
    return out


def load_config(flags: Mapping[str, Any], *, config_file: str | None,
                default_out: str) -> RunConfig:
    """Merge defaults, the TOML file and the flags the user gave (values that are not None)."""
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(_read_toml(Path(config_file)))
    given = {k: v for k, v in flags.items() if v is not None}
    if isinstance(given.get("data_dir"), str):
        # Ranks and later resumes may run elsewhere: record where the data is, not how to get there.
        given["data_dir"] = os.path.abspath(given["data_dir"])
    merged.update(given)
    explicit = frozenset(merged)
    merged.setdefault("out", default_out)
    try:
        return RunConfig.from_dict(merged, explicit=explicit)
    except TypeError as exc:  # a TOML value of the wrong type reaching a comparison
        raise ConfigError(f"invalid setting: {exc}") from None
