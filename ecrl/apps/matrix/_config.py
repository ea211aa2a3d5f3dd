"""The matrix config: a TOML file → suites and units, validated before any unit runs (torch-free).

A matrix is the product of three axes — ``[datasets.NAME]``, ``[models.NAME]`` and
``[schedules.NAME]`` — with the run settings of ``[run]`` applied to every unit. Each axis entry is
itself a partial ``ecrl run`` config (the keys are the flags of ``ecrl run``), merged in the order
``[run]`` < dataset < model < schedule, so a model may, say, set its own ``global-batch``. A
schedule names the steps after which failures are injected (``fail-at``); ``[matrix]`` says which
strategies run under failures, which strategy the reference runs with, and how many seeds.

Every mistake is found here, before anything is written or launched, and reported as one line
naming the file, the line, the table and the key: a model the runtime does not know, a failure
beyond the run, a global batch some world size does not divide, a key no table takes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ecrl.contract.errors import ConfigError
from ecrl.runtime import runconfig
from ecrl.runtime.runconfig import DATASETS, MODELS, RunConfig, read_config_text

__all__ = ["AxisEntry", "Suite", "Unit", "MatrixConfig", "load_matrix", "runtime_strategies",
           "REFERENCE"]

REFERENCE = "reference"
"""The variant name of a suite's failure-free run."""

_TABLES = ("matrix", "run", "datasets", "models", "schedules")
_MATRIX_KEYS = ("strategies", "reference", "seeds")
_RUN_FIELDS = tuple(f.name for f in fields(RunConfig) if f.name != "explicit")
# The matrix decides these for every unit: where it runs, with which strategy, failures and seed.
_OWNED = frozenset({"out", "strategy", "fail_at", "deadline"})
_DATASET_KEYS = frozenset({"dataset", "dataset_size", "data_dir", "image_size"})
_CIFAR = ("cifar10", "cifar100")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def runtime_strategies() -> tuple[str, ...]:
    """The strategies the runtime can run today, in its order (read at call time, so a strategy
    registered later is a variant too)."""
    return tuple(runconfig.BUILT_STRATEGIES)


@dataclass(frozen=True, kw_only=True, slots=True)
class AxisEntry:
    """One value of an axis: its name and the run settings it contributes."""

    name: str
    """The table's name, e.g. ``resnet18`` for ``[models.resnet18]``."""
    settings: Mapping[str, Any]
    """``ecrl run`` settings (field names of RunConfig) this entry sets."""
    generate: int | None = None
    """Datasets only: write a CIFAR-format training set of this many images (no ``data-dir``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Suite:
    """One cell of datasets × models × schedules."""

    dataset: str
    model: str
    schedule: str

    @property
    def name(self) -> str:
        return f"{self.dataset}-{self.model}-{self.schedule}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One ``ecrl run``: a variant of a suite at one seed.

    A suite's reference has no failures, so it does not depend on the schedule: the suites of one
    data set and model share their reference units (one run each, not one per schedule).
    """

    uid: str
    """``DATASET-MODEL/reference-seedS`` or ``DATASET-MODEL-SCHEDULE/STRATEGY-seedS``."""
    dataset: str
    model: str
    schedule: str | None
    """None for the reference."""
    variant: str
    """``reference`` or the strategy that runs under the schedule's failures."""
    strategy: str
    seed: int
    settings: Mapping[str, Any]
    """Every ``ecrl run`` setting but ``out`` (and ``data_dir`` of a generated data set)."""
    reference: str | None
    """uid of the reference unit this one is compared with (None for a reference)."""

    def run_config(self, out: str, data_dir: str | None = None) -> RunConfig:
        values = dict(self.settings)
        if data_dir is not None:
            values["data_dir"] = data_dir
        return RunConfig.from_dict({**values, "out": out},
                                   explicit=frozenset(values) | {"out"})


@dataclass(frozen=True, kw_only=True, slots=True)
class MatrixConfig:
    """A validated matrix: its axes, variants and seeds; :meth:`units` lists what runs."""

    path: str
    """The TOML file it came from."""
    datasets: tuple[AxisEntry, ...]
    models: tuple[AxisEntry, ...]
    schedules: tuple[AxisEntry, ...]
    strategies: tuple[str, ...]
    """Strategies that run under each schedule's failures (one variant each)."""
    reference_strategy: str
    """Strategy of the failure-free reference variant."""
    seeds: tuple[int, ...]
    """Seeds every unit is repeated with."""
    run: Mapping[str, Any] = field(default_factory=dict)
    """Settings of ``[run]``, common to every unit."""

    @property
    def variants(self) -> tuple[str, ...]:
        return (REFERENCE, *self.strategies)

    def suites(self) -> list[Suite]:
        return [Suite(dataset=d.name, model=m.name, schedule=s.name)
                for d in self.datasets for m in self.models for s in self.schedules]

    def dataset(self, name: str) -> AxisEntry:
        return next(d for d in self.datasets if d.name == name)

    def units(self) -> list[Unit]:
        """Every unit in run order: per seed, data set and model, the reference first."""
        out: list[Unit] = []
        for seed in self.seeds:
            for d in self.datasets:
                for m in self.models:
                    base = {**self.run, **d.settings, **m.settings, "seed": seed}
                    ref_uid = f"{d.name}-{m.name}/{REFERENCE}-seed{seed}"
                    out.append(Unit(uid=ref_uid, dataset=d.name, model=m.name, schedule=None,
                                    variant=REFERENCE, strategy=self.reference_strategy,
                                    seed=seed, reference=None,
                                    settings={**base, "strategy": self.reference_strategy}))
                    for s in self.schedules:
                        for strategy in self.strategies:
                            out.append(Unit(
                                uid=f"{d.name}-{m.name}-{s.name}/{strategy}-seed{seed}",
                                dataset=d.name, model=m.name, schedule=s.name, variant=strategy,
                                strategy=strategy, seed=seed, reference=ref_uid,
                                settings={**base, **s.settings, "strategy": strategy}))
        return out

    def digest(self) -> str:
        """Identity of what the matrix runs: a folder holds the results of one definition."""
        units = [{"uid": u.uid, "settings": dict(sorted(u.settings.items()))}
                 for u in self.units()]
        generated = {d.name: d.generate for d in self.datasets if d.generate}
        blob = json.dumps({"units": units, "generated": generated}, sort_keys=True, default=list)
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


# --- reading and validation --------------------------------------------------------------------


class _Source:
    """The file's text, to point an error at the line that set a key."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, table: str, key: str | None) -> int | None:
        header = None
        wanted = table.replace(" ", "").replace('"', "")
        for i, line in enumerate(self.lines):
            if line.strip().replace(" ", "").replace('"', "") == f"[{wanted}]":
                header = i
                break
        if key is None:
            return None if header is None else header + 1
        spellings = {key, key.replace("_", "-"), key.replace("-", "_")}
        pattern = re.compile(r"^\s*[\"']?(" + "|".join(map(re.escape, spellings))
                             + r")[\"']?\s*=")
        start = 0 if header is None else header + 1
        for i in range(start, len(self.lines)):
            if header is not None and self.lines[i].lstrip().startswith("["):
                break
            if pattern.match(self.lines[i]):
                return i + 1
        return None if header is None else header + 1

    def error(self, table: str, key: str | None, message: str) -> ConfigError:
        line = self.line_of(table, key)
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        what = f"[{table}]" + (f" {key.replace('_', '-')}" if key else "")
        return ConfigError(f"{where}: {what}: {message}")


def _key(name: str) -> str:
    return name.replace("-", "_")


def _settings(src: _Source, table: str, data: Any, *, allowed: frozenset[str],
              extra: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise src.error(table, None, "must be a table of `ecrl run` settings")
    out: dict[str, Any] = {}
    for raw, value in data.items():
        name = _key(raw)
        if name in extra:
            out[name] = value
            continue
        if name not in allowed:
            if name in _OWNED or (name == "seed" and table != "run"):
                why = ("is set by the matrix for each unit" if name != "fail_at"
                       else "belongs in a [schedules.NAME] table")
                raise src.error(table, raw, why)
            names = sorted(k.replace("_", "-") for k in (*allowed, *extra))
            close = difflib.get_close_matches(raw.replace("_", "-"), names, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise src.error(table, raw, f"unknown key; {hint}(this table takes: "
                            f"{', '.join(names)})")
        out[name] = value
    return out


def _resolve_dir(src: _Source, settings: dict[str, Any]) -> None:
    value = settings.get("data_dir")
    if isinstance(value, str) and not os.path.isabs(value):
        settings["data_dir"] = str((src.path.parent / value).resolve())


def _axis(src: _Source, data: Mapping[str, Any], table: str, *, allowed: frozenset[str],
          extra: Sequence[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    raw = data.get(table)
    if raw is None or raw == {}:
        raise src.error(table, None, f"the matrix needs at least one [{table}.NAME] table")
    if not isinstance(raw, dict):
        raise src.error(table, None, f"must hold [{table}.NAME] tables")
    entries = []
    for name, body in raw.items():
        if not _NAME.match(name):
            raise src.error(f"{table}.{name}", None, "names may only hold letters, digits, "
                            "'-', '_' and '.'")
        settings = _settings(src, f"{table}.{name}", body, allowed=allowed, extra=extra)
        _resolve_dir(src, settings)
        entries.append((name, settings))
    return entries


def _strategies(src: _Source, value: Any) -> tuple[str, ...]:
    built = runtime_strategies()
    if value is None or value == "all":
        # Every strategy that checkpoints: without checkpoints a failure restarts from step 0.
        return tuple(s for s in built if s != "none")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
        raise src.error("matrix", "strategies", 'must be "all" or a list of strategy names')
    for name in value:
        if name == REFERENCE:
            raise src.error("matrix", "strategies", "the reference is always run; list the "
                            "strategies to run under failures")
        if name not in built:
            known = ", ".join(runconfig.STRATEGIES)
            why = ("is not built yet" if name in runconfig.STRATEGIES
                   else f"is unknown (strategies: {known})")
            raise src.error("matrix", "strategies", f"{name!r} {why}; the runtime can run "
                            f"{', '.join(built)}")
    if len(set(value)) != len(value):
        raise src.error("matrix", "strategies", "lists a strategy twice")
    return tuple(value)


def _int(src: _Source, table: str, key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise src.error(table, key, f"must be an integer >= {low}, got {value!r}")
    return value


def load_matrix(path: str | os.PathLike[str], *, seeds: int | None = None) -> MatrixConfig:
    """Read and validate a matrix config; every problem is one :class:`ConfigError` line."""
    file = Path(path)
    # The reader of ecrl run --config: a directory, a binary file or a FIFO is one line.
    text = read_config_text(file, name=str(file),
                            remedy="give a matrix config (a TOML file), or cpu or gpu for a "
                                   "shipped one")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    src = _Source(file, text)
    for table in data:
        if table not in _TABLES:
            raise src.error(table, None, "unknown table (the tables are "
                            f"{', '.join(f'[{t}]' for t in _TABLES)})")

    matrix = data.get("matrix", {})
    if not isinstance(matrix, dict):
        raise src.error("matrix", None, "must be a table")
    for raw in matrix:
        if _key(raw) not in _MATRIX_KEYS:
            raise src.error("matrix", raw, "unknown key (this table takes: "
                            f"{', '.join(k for k in _MATRIX_KEYS)})")
    strategies = _strategies(src, matrix.get("strategies"))
    reference = matrix.get("reference", "none")
    if not isinstance(reference, str) or reference not in runtime_strategies():
        raise src.error("matrix", "reference", f"{reference!r} is not a strategy the runtime can "
                        f"run ({', '.join(runtime_strategies())})")
    n_seeds = _int(src, "matrix", "seeds", matrix.get("seeds", 1), 1)
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be at least 1, got {seeds}")
        n_seeds = seeds

    run_allowed = frozenset(_RUN_FIELDS) - _OWNED
    run = _settings(src, "run", data.get("run", {}), allowed=run_allowed)
    _resolve_dir(src, run)
    axis_allowed = run_allowed - {"seed"}
    datasets = _axis(src, data, "datasets", allowed=axis_allowed, extra=("generate",))
    models = _axis(src, data, "models", allowed=axis_allowed - _DATASET_KEYS)
    schedules = _axis(src, data, "schedules",
                      allowed=frozenset({"fail_at", "fail_rank", "max_restarts"}))
    first_seed = _int(src, "run", "seed", run.pop("seed", 0), 0)

    config = MatrixConfig(
        path=str(file),
        datasets=tuple(_dataset_entry(src, name, s) for name, s in datasets),
        models=tuple(_model_entry(src, name, s) for name, s in models),
        schedules=tuple(_schedule_entry(src, name, s) for name, s in schedules),
        strategies=strategies, reference_strategy=reference,
        seeds=tuple(range(first_seed, first_seed + n_seeds)), run=run)
    _check_units(src, config)
    _check_data(src, config)
    return config


def _check_data(src: _Source, config: MatrixConfig) -> None:
    """Your data sets must be there now, not when their first unit starts.

    The check is the runtime's own (the one ``ecrl run`` makes before launching); its module
    imports torch, so it is imported only when a data set names a ``data-dir``.
    """
    given = [d for d in config.datasets if "data_dir" in d.settings]
    if not given:
        return
    from ecrl.runtime.trainer.datasets import check_data_dir

    for d in given:
        try:
            check_data_dir(str(d.settings["dataset"]), Path(str(d.settings["data_dir"])))
        except ConfigError as exc:
            message = str(exc).removeprefix("--data-dir ")
            raise src.error(f"datasets.{d.name}", "data_dir", message) from None


def _dataset_entry(src: _Source, name: str, settings: dict[str, Any]) -> AxisEntry:
    table = f"datasets.{name}"
    explicit = "dataset" in settings
    kind = settings.setdefault("dataset", name)
    if kind not in DATASETS:
        raise src.error(table, "dataset" if explicit else None, f"{kind!r} is not a data set "
                        f"the runtime knows: choose one of {', '.join(DATASETS)}")
    generate = settings.pop("generate", None)
    if generate is not None:
        if kind not in _CIFAR:
            raise src.error(table, "generate", f"writes a CIFAR-format data set: only for "
                            f"dataset cifar10 or cifar100, not {kind!r}")
        if "data_dir" in settings:
            raise src.error(table, "generate", "give generate (the tool writes the data) or "
                            "data-dir (your data), not both")
        _int(src, table, "generate", generate, 1)
    elif kind in (*_CIFAR, "imagefolder") and "data_dir" not in settings:
        raise src.error(table, None, f"dataset {kind!r} needs data-dir (your copy) or, for "
                        "CIFAR, generate = N (the tool writes a CIFAR-format set of N images)")
    return AxisEntry(name=name, settings=settings, generate=generate)


def _model_entry(src: _Source, name: str, settings: dict[str, Any]) -> AxisEntry:
    explicit = "model" in settings
    model = settings.setdefault("model", name)
    if model not in MODELS:
        raise src.error(f"models.{name}", "model" if explicit else None, f"model {model!r} is "
                        f"unknown: choose one of {', '.join(MODELS)}")
    return AxisEntry(name=name, settings=settings)


def _schedule_entry(src: _Source, name: str, settings: dict[str, Any]) -> AxisEntry:
    table = f"schedules.{name}"
    if "fail_at" not in settings:
        raise src.error(table, None, "needs fail-at = [STEP, …]: the steps after which a "
                        "failure is injected")
    try:
        steps = runconfig.parse_int_list("fail-at", settings["fail_at"])
    except ConfigError as exc:
        raise src.error(table, "fail_at", str(exc)) from None
    if not steps:
        raise src.error(table, "fail_at", "is empty: a schedule injects at least one failure "
                        "(the reference variant is the run without failures)")
    if any(s < 0 for s in steps) or len(set(steps)) != len(steps):
        raise src.error(table, "fail_at", f"{list(steps)}: steps must be distinct and >= 0")
    return AxisEntry(name=name, settings={**settings, "fail_at": list(steps)})


def _origin(config: MatrixConfig, unit: Unit, key: str) -> str:
    """The table that set ``key`` for ``unit`` (the last in merge order)."""
    for table, entries in (("schedules", config.schedules), ("models", config.models),
                           ("datasets", config.datasets)):
        name = {"schedules": unit.schedule, "models": unit.model,
                "datasets": unit.dataset}[table]
        entry = next((e for e in entries if e.name == name), None)
        if entry is not None and key in entry.settings:
            return f"{table}.{name}"
    return "run"


def _target(settings: Mapping[str, Any], generate: int | None) -> int | None:
    """T of a unit when it can be known without reading the data (None: only the run knows)."""
    if settings.get("epochs") is None:
        steps = settings.get("steps")
        return steps if steps is not None else runconfig.DEFAULT_STEPS
    size = (settings.get("dataset_size") or runconfig.DEFAULT_FAKE_SIZE
            if settings.get("dataset", "fake") == "fake" else generate)
    batch = settings.get("global_batch", 32)
    if size is None or not isinstance(size, int) or not isinstance(batch, int) or batch < 1:
        return None
    return int(settings["epochs"]) * (size // batch)


def _check_units(src: _Source, config: MatrixConfig) -> None:
    for unit in config.units():
        s = unit.settings
        batch = s.get("global_batch", 32)
        sizes = s.get("world_sizes", (1,))
        try:
            sizes = runconfig.parse_int_list("world-sizes", sizes)
        except ConfigError as exc:
            raise src.error(_origin(config, unit, "world_sizes"), "world_sizes", str(exc)) \
                from None
        if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
            for w in sizes:
                if w > 0 and batch % w:
                    table = _origin(config, unit, "global_batch")
                    raise src.error(table, "global_batch", f"{batch} is not divisible by world "
                                    f"size {w} (world-sizes {list(sizes)} of "
                                    f"[{_origin(config, unit, 'world_sizes')}]); the global "
                                    "batch must split evenly over every world size")
        if unit.schedule is not None:
            target = _target(s, config.dataset(unit.dataset).generate)
            late = [f for f in s["fail_at"] if target is not None and f >= target]
            if late and target is not None:
                raise src.error(f"schedules.{unit.schedule}", "fail_at",
                                f"step {late[0]} is beyond the run of suite "
                                f"{unit.uid.split('/')[0]} (steps 0..{target - 1}): scale the "
                                "schedule to the run length")
        try:
            unit.run_config("matrix-check", data_dir="." if config.dataset(
                unit.dataset).generate else None)
        except (ConfigError, TypeError) as exc:
            message = str(exc)
            flag = re.match(r"--([a-z-]+)", message)
            key = _key(flag.group(1)) if flag else None
            table = _origin(config, unit, key) if key else "run"
            raise src.error(table, key, f"{message} (unit {unit.uid})") from None
