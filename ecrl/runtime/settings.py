"""The run's settings sections: one name, one default and one documented precedence each
(torch-free).

A run's settings come in three sections, each handed to the part that uses it (torchtitan
style): :class:`TrainerSettings` (what the built-in trainer trains), :class:`SupervisorSettings`
(world sizes, failures, restarts, deadline, standby, rendezvous) and :class:`CheckpointSettings`
(below). :class:`ecrl.runtime.runconfig.RunConfig` generates the flags from their fields and
docstrings and gives each section (``.trainer``, ``.supervisor``, ``.checkpoint``); what ties the
sections together (``B % W`` for every world size) it checks itself.

A setting has one home, :class:`CheckpointSettings`: its field name is the flag (``ckpt_every`` is
``--ckpt-every``), the TOML key, the environment variable the supervisor sets for the ranks
(``ECRL_CKPT_EVERY``, :mod:`ecrl.runtime.launchenv`) and the field the
:class:`ecrl.Checkpointer` reads; its default is written once, here.

Precedence, applied by :func:`resolve_checkpoint` in every rank:

1. a value the user gave ``ecrl launch``/``ecrl run`` (on the command line or in its ``--config``
   file): the supervisor passes to the ranks *only* those;
2. else the script's own constructor argument (``Checkpointer(..., every=8)`` or
   ``Checkpointer(..., checkpoint=CheckpointSettings(ckpt_every=8))``);
3. else the default below.

So a setting the user did not give never silently replaces one the script did. ``ecrl run`` is
the same rule applied to the built-in trainer, which passes its run configuration as its
constructor arguments. The resolved values and where each came from are recorded by rank 0 in
``logs/attempt-NNN/checkpoint-settings.json`` (:data:`SETTINGS_FILE`), from which the supervisor's
summary says what was in effect.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint.registry import strategy_names
from ecrl.runtime.deadlinetime import parse_deadline
from ecrl.runtime.meshplan import MeshLayout, plan_meshes

__all__ = ["SOURCES", "SETTINGS_FILE", "DEFAULTS", "CheckpointSettings", "ResolvedCheckpoint",
           "resolve_checkpoint", "script_values", "field_docs", "checkpoint_fields",
           "TrainerSettings", "SupervisorSettings", "TRAINER_DEFAULTS", "SUPERVISOR_DEFAULTS",
           "FAKE_CLASSES", "section_fields", "MODELS", "DATASETS", "check_finite", "RNG_POLICY",
           "RNG_NOTE", "TINY_GPT"]

SOURCES = ("flag", "script", "default")
"""Where a resolved setting came from: given to the supervisor (a flag or its config file), the
script's constructor argument, or the default."""
SETTINGS_FILE = "checkpoint-settings.json"
"""Rank 0's record of the settings in effect, in each attempt's log folder."""
_SCHEMA_VERSION = 1


def check_finite(settings: Any) -> None:
    """Raise a one-line :class:`ConfigError` for a field of the dataclass ``settings`` that holds
    an infinite or NaN float (alone or in a tuple).

    The one check every settings section, :class:`ecrl.runtime.runconfig.RunConfig` and the
    ranks' environment go through, whatever the value came from (a flag, a TOML ``inf`` or
    ``nan``, ``1e400``, an ``ECRL_*`` variable): such a value would be written to ``run.json`` as
    ``Infinity``/``NaN``, which JSON does not have, and the run could then never be continued or
    verified."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"--{_flag(f.name)} must be a finite number, got {item!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSettings:
    """How the :class:`ecrl.Checkpointer` saves: the checkpoint section of a run."""

    # Each field is a flag of `ecrl run` and `ecrl launch`: its docstring is the flag's help, after
    # an optional "METAVAR: " prefix; {strategies} and {background} are filled in from the
    # registry (every strategy; those that write in the background).
    strategy: str = "overlapped"
    """NAME: {strategies} (docs/strategies.md)."""
    ckpt_every: int = 50
    """K: checkpoint after every K-th step (0: never)."""
    max_inflight: int = 2
    """N: {background}: checkpoints that may be pending in the background."""
    keep_checkpoints: int = 2
    """K: retention: the newest K >= 2 checkpoints are kept."""
    deadline_k_step: float = 10.0
    """K: deadline buffer: multiple of the longest step time kept in reserve."""
    deadline_k_ckpt: float = 2.0
    """K: deadline buffer: multiple of the longest checkpoint time kept in reserve."""
    hang_timeout_s: float | None = None
    """S: a rank whose step does not complete in S seconds is hung (default: 10 x the p99 step
    time, at least 30 s; 0: no watchdog)."""

    def __post_init__(self) -> None:
        check_finite(self)
        if not isinstance(self.strategy, str) or self.strategy not in strategy_names():
            raise ConfigError(f"--strategy {self.strategy!r} is unknown: choose one of "
                              f"{', '.join(strategy_names())}")
        for name, low in (("ckpt_every", 0), ("max_inflight", 1), ("keep_checkpoints", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"--{_flag(name)} must be an integer >= {low}, got {value!r}")
        for name in ("deadline_k_step", "deadline_k_ckpt", "hang_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "hang_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"--{_flag(name)} must be a number >= 0, got {value!r}")

    @property
    def effective_ckpt_every(self) -> int:
        """0 when the strategy takes no checkpoints."""
        return 0 if self.strategy == "none" else self.ckpt_every


def _flag(name: str) -> str:
    return name.replace("_", "-")


@functools.cache
def checkpoint_fields() -> tuple[str, ...]:
    """The names of the checkpoint settings, in their order."""
    return tuple(f.name for f in fields(CheckpointSettings))


DEFAULTS = CheckpointSettings()
"""Every checkpoint setting at its default."""


def script_values(section: CheckpointSettings | None = None, **arguments: Any) -> dict[str, Any]:
    """What a script gave its Checkpointer: the fields of its ``section`` that differ from the
    default, and the keyword ``arguments`` that are not None (field names). Both naming the same
    setting differently is a mistake."""
    unknown = sorted(set(arguments) - set(checkpoint_fields()))
    if unknown:
        raise ConfigError(f"no checkpoint setting {unknown[0]!r}")
    out = {k: v for k, v in arguments.items() if v is not None}
    if section is not None:
        for name in checkpoint_fields():
            value = getattr(section, name)
            if value == getattr(DEFAULTS, name):
                continue
            if name in out and out[name] != value:
                raise ConfigError(f"Checkpointer: {name} given twice ({out[name]!r} and "
                                  f"checkpoint.{name}={value!r}): give it once")
            out[name] = value
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedCheckpoint:
    """The checkpoint settings in effect, and where each came from."""

    settings: CheckpointSettings
    """The values in effect."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Setting name → one of :data:`SOURCES`."""

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def record(self) -> dict[str, Any]:
        """The JSON object of :data:`SETTINGS_FILE`."""
        return {"schema_version": _SCHEMA_VERSION,
                "settings": {name: {"value": getattr(self.settings, name),
                                    "source": self.source(name)}
                             for name in checkpoint_fields()}}

    @classmethod
    def from_record(cls, data: Any) -> ResolvedCheckpoint | None:
        """The record read back; None when it is not one (another version, damage)."""
        if not isinstance(data, dict) or data.get("schema_version") != _SCHEMA_VERSION \
                or not isinstance(data.get("settings"), dict):
            return None
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, entry in data["settings"].items():
            if name not in checkpoint_fields() or not isinstance(entry, dict) \
                    or entry.get("source") not in SOURCES:
                return None
            values[name], sources[name] = entry.get("value"), entry["source"]
        try:
            return cls(settings=CheckpointSettings(**values), sources=sources)
        except (ConfigError, TypeError):
            return None

    def describe(self) -> str:
        """``checkpoint every 8 steps (script), strategy overlapped (default)``."""
        s = self.settings
        every = (f"no periodic checkpoints ({self.source('ckpt_every')})"
                 if s.effective_ckpt_every == 0 and s.strategy != "none"
                 else "no checkpoints" if s.strategy == "none"
                 else f"checkpoint every {s.ckpt_every} steps ({self.source('ckpt_every')})")
        return f"{every}, strategy {s.strategy} ({self.source('strategy')})"


def resolve_checkpoint(*, flags: Mapping[str, Any], script: Mapping[str, Any]
                       ) -> ResolvedCheckpoint:
    """The settings in effect: each from ``flags`` (given to the supervisor), else ``script``
    (the Checkpointer's constructor), else the default."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in checkpoint_fields():
        if name in flags and flags[name] is not None:
            values[name], sources[name] = flags[name], "flag"
        elif name in script and script[name] is not None:
            values[name], sources[name] = script[name], "script"
        else:
            sources[name] = "default"
    return ResolvedCheckpoint(settings=CheckpointSettings(**values), sources=sources)


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a settings dataclass, read from its module's source (attribute
    docstrings are not kept at run time), whitespace folded."""
    source = inspect.getsourcefile(cls)
    assert source is not None
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for item, after in zip(node.body, node.body[1:], strict=False):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            docs[item.target.id] = " ".join(after.value.value.split())
    return docs


RNG_POLICY = {"policy": "per-step", "version": 1}
"""The run's RNG policy, recorded in ``run.json`` (``rng``) and checked unchanged whenever a run
continues, whatever ``--strategy`` becomes: before every step each rank's Python, NumPy and torch
(CPU, CUDA) global generators are seeded from ``(seed, rank, step)``
(:func:`ecrl.runtime.checkpoint.checkpointer.rank_seed`), under every strategy. It is what makes a
``jit`` rescue exact (a survivor cannot gather a dead rank's streams, but every rank can derive
them from the step), so it is every run's policy: the same run under ``none``, ``blocking``,
``overlapped``, ``sharded`` and ``jit``, interrupted or not, draws the same numbers
(docs/semantics.md, "Random streams")."""
RNG_NOTE = ("ecrl: RNG policy per-step: Python's, NumPy's and torch's global generators are "
            "reseeded from (seed, rank, step) before every step; generators your script creates "
            "itself (torch.Generator, numpy.random.default_rng, random.Random) are neither "
            "reseeded nor checkpointed")
"""The one line a script's rank 0 prints when its run starts (docs/library.md)."""

MODELS = ("tiny-cnn", "tiny-cnn-bn", "resnet18", "resnet50", "tiny-gpt")
"""The built-in trainer's models (``--model``)."""
TINY_GPT = {"vocab": 64, "width": 32, "layers": 2, "heads": 4, "seq_len": 16}
"""``tiny-gpt``'s sizes: its vocabulary (the generated tokens' alphabet), model width, blocks,
attention heads (``--tp`` must divide them) and sequence length (tokens per sample)."""
DATASETS = ("fake", "cifar10", "cifar100", "imagefolder")
"""The built-in trainer's data sets (``--dataset``)."""
DEFAULT_FAKE_SIZE = 4096
FAKE_CLASSES = 10
"""Classes of the generated data set."""
_TINY_CNN_CONV = (3 * 9 + 1) * 16 + (16 * 9 + 1) * 32
_RESNET_PARAMETERS = {"resnet18": (11_176_512, 513), "resnet50": (23_508_032, 2049)}
"""torchvision's ResNets: parameters without the classifier, and per class (its 512 or 2048
inputs and bias); the image size does not change them."""
DEFAULT_STEPS = 200


def _check_int(name: str, value: Any, low: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"--{_flag(name)} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerSettings:
    """What the built-in trainer trains, and how: the trainer section of ``ecrl run``."""

    # Each field is a flag of `ecrl run` (``threads`` also of `ecrl launch`), documented as in
    # CheckpointSettings.
    dataset: str = "fake"
    """NAME: fake (generated), cifar10, cifar100 or imagefolder."""
    data_dir: str | None = None
    """DIR: dataset root for cifar10, cifar100 and imagefolder."""
    dataset_size: int | None = None
    """D: samples of the fake dataset (default 4096); other datasets have their own size."""
    model: str = "tiny-cnn"
    """NAME: tiny-cnn, tiny-cnn-bn (with BatchNorm), resnet18, resnet50, or tiny-gpt (a small
    transformer language model on generated tokens)."""
    global_batch: int = 32
    """B: samples per step over all ranks; constant for the whole run."""
    steps: int | None = None
    """T: committed steps to reach (default 200 unless ``epochs`` is given)."""
    epochs: int | None = None
    """E: alternative to ``steps``: this many epochs of S = D // B steps."""
    seed: int = 0
    """Seed of the sample order, the model initialisation and every RNG."""
    log_ids: bool = False
    """Log every sample ID in the step records, not only count and hash."""
    lr: float = 0.05
    """Peak learning rate of SGD (momentum 0.9) under cosine decay over the run."""
    image_size: int = 32
    """PX: side of the (square) input images for fake and imagefolder data."""
    threads: int | None = None
    """N: torch CPU threads per rank (default: usable cores / ranks per node, at least 1)."""

    def __post_init__(self) -> None:
        check_finite(self)
        if self.model not in MODELS:
            raise ConfigError(f"--model {self.model!r} is unknown: choose one of "
                              f"{', '.join(MODELS)}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"--dataset {self.dataset!r} is unknown: choose one of "
                              f"{', '.join(DATASETS)}")
        if self.dataset == "fake":
            if self.data_dir is not None:
                raise ConfigError("--data-dir is only for cifar10, cifar100 and imagefolder")
        elif self.dataset_size is not None:
            raise ConfigError(f"--dataset-size is only for the fake dataset ({self.dataset} has "
                              "its own size)")
        if self.model == "tiny-gpt" and self.dataset != "fake":
            raise ConfigError(f"--model tiny-gpt trains on generated tokens (--dataset fake), "
                              f"not {self.dataset}")
        for name, low in (("global_batch", 1), ("image_size", 4), ("seed", 0)):
            _check_int(name, getattr(self, name), low)
        if self.seed > semantics.MAX_SEED:
            raise ConfigError(f"--seed must be at most {semantics.MAX_SEED}")
        for name in ("dataset_size", "steps", "epochs", "threads"):
            _check_int(name, getattr(self, name), 1, optional=True)
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("give --steps or --epochs, not both")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr!r}")

    def fake_size(self) -> int:
        return self.dataset_size if self.dataset_size is not None else DEFAULT_FAKE_SIZE

    @property
    def input_side(self) -> int:
        """Side of the images the model sees: CIFAR's own 32, else ``image_size``."""
        return 32 if self.dataset.startswith("cifar") else self.image_size

    def model_parameters(self, num_classes: int) -> int:
        """The trainable parameters of ``model`` for ``num_classes`` classes (torch-free; the
        models' own count, pinned by a test): the tiny CNN's head grows with the image area."""
        if self.model == "tiny-gpt":
            v = num_classes  # the vocabulary
            d, n, t = (TINY_GPT[k] for k in ("width", "layers", "seq_len"))
            block = 4 * (d * d + d) + 2 * 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
            return (v + t) * d + n * block + 2 * d + d * v + v
        if self.model in ("tiny-cnn", "tiny-cnn-bn"):
            side = self.image_size
            norms = 2 * (16 + 32) if self.model == "tiny-cnn-bn" else 0  # BatchNorm's affine
            return _TINY_CNN_CONV + norms + (32 * (side // 4) ** 2 + 1) * num_classes
        base, per_class = _RESNET_PARAMETERS[self.model]
        return base + per_class * num_classes

    def rank_memory(self, local_batch: int, num_classes: int) -> tuple[int, int]:
        """A lower bound of what one rank must hold at once, in bytes: its input batch
        (``local_batch`` x 3 x side x side float32) and the model's weights, gradients and SGD
        momentum (3 float32 per parameter). Activations, buffers and torch itself come on top."""
        if self.model == "tiny-gpt":  # int64 tokens and targets
            return (local_batch * 2 * TINY_GPT["seq_len"] * 8,
                    3 * 4 * self.model_parameters(num_classes))
        side = self.input_side
        return (local_batch * 3 * side * side * 4,
                3 * 4 * self.model_parameters(num_classes))

    def threads_per_rank(self, ranks_per_node: int) -> int:
        """torch CPU threads of each rank: ``threads``, or the usable cores shared out."""
        if self.threads is not None:
            return self.threads
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        return max(1, cores // max(1, ranks_per_node))


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisorSettings:
    """How the supervisor launches, fails and relaunches the attempts: the supervisor section of
    ``ecrl run`` and ``ecrl launch``."""

    # Each field is a flag of `ecrl run` and `ecrl launch`, documented as in CheckpointSettings.
    world_sizes: tuple[int, ...] = (1,)
    """W0,W1,…: world size of attempt 0, 1, …; the last one repeats."""
    parallel: str = "ddp"
    """NAME: ddp (a whole model per rank), fsdp (FSDP2 over the data-parallel ranks) or hsdp
    (``replicate`` groups of FSDP2 shards); the data-parallel degree is DP = W / ``tp``."""
    replicate: int = 1
    """R: hsdp's replica groups at the first world size; the shard group (DP / R ranks) stays,
    later world sizes change the number of groups."""
    tp: int = 1
    """T: tensor-parallel degree (fsdp or hsdp): T ranks consume each data-parallel shard."""
    fail_at: tuple[int, ...] = ()
    """STEPS: global steps after which a failure is injected, each once over the whole run."""
    fail_rank: int = 0
    """R: rank that exits with code 137 at an injected failure."""
    max_restarts: int | None = None
    """N: relaunches allowed after failures in one ecrl run (default: injected failures + 3)."""
    deadline: str | None = None
    """TIME: commit a final checkpoint and stop before this time: a duration (90s, 15m, 1h30m), a
    time (18:00, 2026-11-23T18:00:00Z) or @UNIX seconds (default: SLURM_JOB_END_TIME when set)."""
    warm_standby: bool = False
    """Start the next attempt's torchrun while this one trains, so that a restart skips the
    launch, the rendezvous and the imports (single node; costs the memory of idle ranks)."""
    verify_follow: bool = False
    """Run ecrl-verify --follow beside the run: each anomaly on stderr as soon as the logs
    prove it, and the verifier's verdict in the run's summary."""
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

    def __post_init__(self) -> None:
        check_finite(self)
        _check_int("nnodes", self.nnodes, 1)
        _check_int("fail_rank", self.fail_rank, 0)
        _check_int("max_restarts", self.max_restarts, 0, optional=True)
        if not self.world_sizes or any(w < 1 for w in self.world_sizes):
            raise ConfigError(f"--world-sizes must be positive integers, got {self.world_sizes}")
        for w in self.world_sizes:
            if w % self.nnodes:
                raise ConfigError(f"world size {w} is not divisible by --nnodes {self.nnodes}")
        # The j-th injected failure ends attempt j (as planned), which runs at world size
        # world_sizes[j] (the last one repeats): the rank must exist there, not in every attempt.
        for j in range(max(1, len(self.fail_at))):
            size = self.world_sizes[min(j, len(self.world_sizes) - 1)]
            if self.fail_rank >= size:
                where = (f"attempt {j}, which injects failure {j + 1} of --fail-at"
                         if self.fail_at else f"attempt {j}")
                raise ConfigError(f"--fail-rank {self.fail_rank} does not exist in {where} "
                                  f"(world size {size})")
        if any(f < 0 for f in self.fail_at):
            raise ConfigError("--fail-at steps must be non-negative")
        self.meshes  # noqa: B018  (a mesh that does not divide a world size: one line)
        if not self.collective_timeout_s > 0:
            raise ConfigError("--collective-timeout-s must be positive")
        if self.deadline is not None:
            parse_deadline(self.deadline)  # refuses text that names no finite time
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint (and the same --rdzv-id on "
                              "every node)")

    @property
    def effective_max_restarts(self) -> int:
        return self.max_restarts if self.max_restarts is not None else len(self.fail_at) + 3

    @property
    def meshes(self) -> list[MeshLayout]:
        """The mesh of each planned world size (:mod:`ecrl.runtime.meshplan`), checked."""
        return plan_meshes(parallel=self.parallel, replicate=self.replicate, tp=self.tp,
                           world_sizes=self.world_sizes)


@functools.cache
def section_fields(cls: type) -> tuple[str, ...]:
    """The names of a settings section's fields, in their order."""
    return tuple(f.name for f in fields(cls))


TRAINER_DEFAULTS = TrainerSettings()
"""Every trainer setting at its default."""
SUPERVISOR_DEFAULTS = SupervisorSettings()
"""Every supervisor setting at its default."""
