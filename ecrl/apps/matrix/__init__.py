"""``ecrl matrix``: the seeds' experiment matrix in one resume-safe command (torch-free).

Suites are data sets × models × failure schedules; each suite runs a failure-free reference and
every checkpoint strategy the runtime offers under the schedule's failures, all at the same global
batch. Each unit is one ``ecrl run`` in its own run directory, judged by ``ecrl-verify``'s Python
API. The output folder holds a manifest, per-unit records, summary tables (CSV, markdown, JSON)
and PNG figures; see ``docs/experiments.md``.

>>> from ecrl.apps.matrix import load_matrix, run_matrix, shipped_config
>>> config = load_matrix(shipped_config("cpu"))        # doctest: +SKIP
>>> run_matrix(config, Path("out"), progress=print)     # doctest: +SKIP
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ecrl.contract.errors import ConfigError

from ._config import REFERENCE, MatrixConfig, Suite, Unit, load_matrix, runtime_strategies
from ._measure import Measured, measure_run
from ._report import write_outputs
from ._runner import MatrixOutcome, default_out, read_records, run_matrix
from ._stats import Estimate, estimate, t_quantile
from ._tables import Tables, build_tables

__all__ = [
    "REFERENCE",
    "MatrixConfig",
    "Suite",
    "Unit",
    "load_matrix",
    "runtime_strategies",
    "shipped_config",
    "resolve_config",
    "SHIPPED",
    "run_matrix",
    "MatrixOutcome",
    "default_out",
    "read_records",
    "write_outputs",
    "build_tables",
    "Tables",
    "Estimate",
    "estimate",
    "t_quantile",
    "Measured",
    "measure_run",
]

SHIPPED = ("cpu", "gpu")
"""Configs shipped with ECRL: ``ecrl matrix cpu`` is ``configs/matrix-cpu.toml``."""


def shipped_config(name: str) -> Path:
    """The path of a shipped config (``cpu``, ``gpu``, or ``matrix-cpu.toml``)."""
    stem = name.removesuffix(".toml").removeprefix("matrix-")
    if stem not in SHIPPED:
        raise ConfigError(f"{name!r} is neither a file nor a shipped matrix config "
                          f"({', '.join(SHIPPED)})")
    return Path(str(resources.files(__package__) / "configs" / f"matrix-{stem}.toml"))


def resolve_config(name: str) -> Path:
    """A file, else a shipped config's name (``cpu`` is shipped even beside a folder ``cpu/``,
    such as the results of ``--out cpu``)."""
    path = Path(name)
    shipped = name.removesuffix(".toml").removeprefix("matrix-") in SHIPPED
    if path.is_file() or (not shipped and path.suffix == ".toml"):
        return path
    return shipped_config(name)
