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
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.contract.strategies import describe
from ecrl.runtime.checkpoint.registry import REGISTRY, built_strategies, strategy_names
from ecrl.runtime.settings import DEFAULTS, CheckpointSettings, checkpoint_fields, field_docs

__all__ = [
    "RunFlag",
    "run_flags",
    "LAUNCH_KEYS",
    "launch_flags",
    "STRATEGIES",
    "BUILT_STRATEGIES",
    "MODELS",
    "DATASETS",
    "RunConfig",
    "load_config",
    "parse_int_list",
]

STRATEGIES = strategy_names()
"""Every strategy ``--strategy`` accepts (from :mod:`ecrl.runtime.checkpoint.registry`)."""
BUILT_STRATEGIES = built_strategies()
"""The strategies a run can use today (from :mod:`ecrl.runtime.checkpoint.registry`)."""
MODELS = ("tiny-cnn", "resnet18", "resnet50")
DATASETS = ("fake", "cifar10", "cifar100", "imagefolder")
DEFAULT_FAKE_SIZE = 4096
_KINDS: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("out", "dataset", "model", "strategy", "data_dir", "deadline", "rdzv_backend",
                     "rdzv_endpoint", "rdzv_id", "rdzv_conf"), str),
    "log_ids": bool,
    "warm_standby": bool,
    "lr": (int, float),
    "collective_timeout_s": (int, float),
    **dict.fromkeys(("deadline_k_step", "deadline_k_ckpt", "hang_timeout_s"), (int, float)),
}
_KIND_NAMES: dict[type | tuple[type, ...], str] = {
    str: "a string", bool: "true or false", (int, float): "a number",
}
DEFAULT_STEPS = 200
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
    world_sizes: tuple[int, ...] = (1,)
    """W0,W1,…: world size of attempt 0, 1, …; the last one repeats."""
    dataset: str = "fake"
    """NAME: fake (generated), cifar10, cifar100 or imagefolder."""
    data_dir: str | None = None
    """DIR: dataset root for cifar10, cifar100 and imagefolder."""
    dataset_size: int | None = None
    """D: samples of the fake dataset (default 4096); other datasets have their own size."""
    model: str = "tiny-cnn"
    """NAME: tiny-cnn, resnet18 or resnet50."""
    global_batch: int = 32
    """B: samples per step over all ranks; constant for the whole run."""
    steps: int | None = None
    """T: committed steps to reach (default 200 unless ``epochs`` is given)."""
    epochs: int | None = None
    """E: alternative to ``steps``: this many epochs of S = D // B steps."""
    # The checkpoint settings: docs, defaults and checks in CheckpointSettings (settings.py).
    ckpt_every: int = DEFAULTS.ckpt_every
    strategy: str = DEFAULTS.strategy
    max_inflight: int = DEFAULTS.max_inflight
    fail_at: tuple[int, ...] = ()
    """STEPS: global steps after which a failure is injected, each once over the whole run."""
    fail_rank: int = 0
    """R: rank that exits with code 137 at an injected failure."""
    seed: int = 0
    """Seed of the sample order, the model initialisation and every RNG."""
    log_ids: bool = False
    """Log every sample ID in the step records, not only count and hash."""
    max_restarts: int | None = None
    """N: relaunches allowed after failures in one ecrl run (default: injected failures + 3)."""
    deadline: str | None = None
    """TIME: commit a final checkpoint and stop before this time: a duration (90s, 15m, 1h30m), a
    time (18:00, 2026-11-23T18:00:00Z) or @UNIX seconds (default: SLURM_JOB_END_TIME when set)."""
    deadline_k_step: float = DEFAULTS.deadline_k_step
    deadline_k_ckpt: float = DEFAULTS.deadline_k_ckpt
    hang_timeout_s: float | None = DEFAULTS.hang_timeout_s
    keep_checkpoints: int = DEFAULTS.keep_checkpoints
    lr: float = 0.05
    """Peak learning rate of SGD (momentum 0.9) under cosine decay over the run."""
    image_size: int = 32
    """PX: side of the (square) input images for fake and imagefolder data."""
    threads: int | None = None
    """N: torch CPU threads per rank (default: usable cores / ranks per node, at least 1)."""
    warm_standby: bool = False
    """Start the next attempt's torchrun while this one trains, so that a restart skips the
    launch, the rendezvous and the imports (single node; costs the memory of idle ranks)."""
    collective_timeout_s: float = 60.0
    """S: timeout of every collective: how long a hung (not dead) peer can stall the job."""
    nnodes: int = 1
    """N: torchrun --nnodes; with more than one node, pass the rendezvous options too."""
    rdzv_backend: str | None = None
    """NAME: torchrun --rdzv-backend (multi-node)."""
    rdzv_endpoint: str | None = None
    """HOST:PORT: torchrun --rdzv-endpoint (multi-node)."""
    rdzv_id: str | None = None
    """ID: torchrun --rdzv-id (multi-node)."""
    rdzv_conf: str | None = None
    """K=V,…: torchrun --rdzv-conf (multi-node)."""
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
        if not self.out:
            raise bad("out", "must name a directory")
        self.checkpoint  # noqa: B018 - validates the checkpoint settings
        if self.model not in MODELS:
            raise bad("model", f"{self.model!r} is unknown: choose one of {', '.join(MODELS)}")
        if self.dataset not in DATASETS:
            raise bad("dataset", f"{self.dataset!r} is unknown: choose one of "
                                 f"{', '.join(DATASETS)}")
        if self.dataset == "fake":
            if self.data_dir is not None:
                raise bad("data-dir", "is only for cifar10, cifar100 and imagefolder")
        elif self.dataset_size is not None:
            raise bad("dataset-size", f"is only for the fake dataset ({self.dataset} has its "
                                      "own size)")
        for name, low in (("global_batch", 1), ("image_size", 4), ("nnodes", 1),
                          ("fail_rank", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name.replace("_", "-"), f"must be an integer >= {low}, got {value!r}")
        if self.seed > semantics.MAX_SEED:
            raise bad("seed", f"must be at most {semantics.MAX_SEED}")
        for name in ("dataset_size", "steps", "epochs", "threads", "max_restarts"):
            value = getattr(self, name)
            low = 0 if name == "max_restarts" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < low):
                raise bad(name.replace("_", "-"), f"must be an integer >= {low}, got {value!r}")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("give --steps or --epochs, not both")
        if not self.world_sizes or any(w < 1 for w in self.world_sizes):
            raise bad("world-sizes", f"must be positive integers, got {self.world_sizes}")
        for w in self.world_sizes:
            try:
                semantics.local_batch(self.global_batch, w)
            except SemanticsError as exc:
                raise ConfigError(f"--global-batch/--world-sizes: {exc}") from None
            if w % self.nnodes:
                raise ConfigError(f"world size {w} is not divisible by --nnodes {self.nnodes}")
        if self.fail_rank >= min(self.world_sizes):
            raise bad("fail-rank", f"{self.fail_rank} does not exist in an attempt of world "
                                   f"size {min(self.world_sizes)}")
        if any(f < 0 for f in self.fail_at):
            raise bad("fail-at", "steps must be non-negative")
        if not self.lr > 0:
            raise bad("lr", f"must be positive, got {self.lr!r}")
        if not self.collective_timeout_s > 0:
            raise bad("collective-timeout-s", "must be positive")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint (and the same --rdzv-id on "
                              "every node)")

    # --- derived values -----------------------------------------------------------------------

    @property
    def checkpoint(self) -> CheckpointSettings:
        """The checkpoint section of this run (validated)."""
        return CheckpointSettings(**{name: getattr(self, name) for name in checkpoint_fields()})

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
        return self.max_restarts if self.max_restarts is not None else len(self.fail_at) + 3

    def threads_per_rank(self, ranks_per_node: int) -> int:
        """torch CPU threads of each rank: ``threads``, or the usable cores shared out."""
        if self.threads is not None:
            return self.threads
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        return max(1, cores // max(1, ranks_per_node))

    def fake_size(self) -> int:
        return self.dataset_size if self.dataset_size is not None else DEFAULT_FAKE_SIZE

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
    docs = {**field_docs(CheckpointSettings), **field_docs(RunConfig)}
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


LAUNCH_KEYS = ("world_sizes", "ckpt_every", "strategy", "max_inflight", "fail_at", "fail_rank",
               "max_restarts", "keep_checkpoints", "deadline", "deadline_k_step",
               "deadline_k_ckpt", "hang_timeout_s", "threads", "nnodes", "rdzv_backend",
               "rdzv_endpoint", "rdzv_id", "rdzv_conf", "warm_standby")
"""The settings of ``ecrl launch``: the supervisor's and the checkpoint section (a subset of
``ecrl run``'s; data, model, batch and steps are the script's)."""
_LAUNCH_HELP = {
    "threads": "OMP_NUM_THREADS per rank (default: cores / ranks per node)",
    "nnodes": "torchrun --nnodes; one ecrl launch per node (docs/library.md)",
    "rdzv_id": "torchrun --rdzv-id (same on every node)",
    "max_restarts": "relaunches allowed after failures (default: injected failures + 3)",
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


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
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
