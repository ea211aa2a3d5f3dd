"""``run.json``: the one builder and the one "is this the same run?" check (torch-free).

Three writers describe a run: ``ecrl run``'s supervisor (from its flags), ``ecrl launch``'s
supervisor (a placeholder until the user's script writes the real one) and :class:`ecrl.StepLog`
(from the script's sampler). They all build the manifest with :func:`build_manifest`, so the
permutation's name and version, the creation time and the ECRL version are stamped one way.

Continuing a run with other settings would make its logs describe two different runs. Whoever
finds a ``run.json`` compares it with what it would have written (:func:`check_same_run`), on the
fields it knows: the supervisor on all of :data:`RUN_FIELDS`, a script's step log on the fields
that define its sample stream (:data:`STREAM_FIELDS`; the supervisor owns the rest). The first
difference stops the run with one line naming the field, both values, the flag when there is one,
and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ecrl import __version__
from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import RunManifest
from ecrl.runtime.settings import RNG_POLICY

__all__ = ["RUN_FIELDS", "STREAM_FIELDS", "build_manifest", "check_same_run"]

# Not "strategy": a run may continue with another one (every strategy loads every checkpoint
# format; each checkpoint event names the strategy that wrote it).
STREAM_FIELDS = ("dataset.size", "global_batch", "seed", "steps_per_epoch", "target_steps",
                 "sampler", "rng")
"""What defines the sample stream a run consumes, whoever feeds it, and the random streams it
draws (the RNG policy: the same for every strategy, so a run continued with another
``--strategy`` keeps its trajectory)."""
RUN_FIELDS = ("seed", "dataset", "global_batch", "steps_per_epoch", "target_steps", "permutation",
              "rng", "log_ids", "ckpt_every", "fail_at", "world_sizes", "meshes", "model",
              "image_size", "lr")
"""What defines an ``ecrl run``: its stream, its failures, world sizes and the mesh of each, and
the settings kept only in the stored configuration that still define what is trained (another
image size changes the model's input, another lr the updates)."""

_GET: dict[str, Callable[[RunManifest], Any]] = {
    "dataset.size": lambda m: m.dataset_size,
    "sampler": lambda m: (m.sampler or {"kind": "ecrl"}).get("kind"),
    "image_size": lambda m: m.extra.get("config", {}).get("image_size"),
    "lr": lambda m: m.extra.get("config", {}).get("lr"),
    "rng": lambda m: m.extra.get("rng"),
}
_CONFIG_ONLY = ("image_size", "lr")
_FLAG_OF = {"dataset": "--dataset/--dataset-size", "target_steps": "--steps/--epochs",
            "steps_per_epoch": "--dataset-size/--global-batch", "permutation": "(ECRL version)",
            "rng": "(ECRL version: its RNG policy)",
            "dataset.size": "--dataset-size", "meshes": "--parallel/--replicate/--tp"}


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_manifest(*, seed: int, dataset: str, dataset_size: int, global_batch: int,
                   steps_per_epoch: int, target_steps: int, log_ids: bool, model: str,
                   strategy: str, ckpt_every: int, fail_at: Sequence[int],
                   world_sizes: Sequence[int], sampler: Mapping[str, Any] | None = None,
                   extra: Mapping[str, Any] | None = None,
                   meshes: Sequence[Mapping[str, Any]] | None = None) -> RunManifest:
    """The ``run.json`` of a new run, stamped with this ECRL's permutation, version and time."""
    return RunManifest(
        seed=seed, dataset={"name": dataset, "size": dataset_size}, global_batch=global_batch,
        steps_per_epoch=steps_per_epoch, target_steps=target_steps,
        permutation={"algorithm": semantics.PERMUTATION_ALGORITHM,
                     "version": semantics.PERMUTATION_VERSION},
        log_ids=log_ids, strategy=strategy, ckpt_every=ckpt_every,
        fail_at=sorted(set(fail_at)), world_sizes=list(world_sizes), model=model,
        created=_now_iso(), sampler=None if sampler is None else dict(sampler),
        meshes=None if not meshes else [dict(m) for m in meshes],
        extra={"ecrl_version": __version__, "rng": dict(RNG_POLICY), **(extra or {})})


def _value(manifest: RunManifest, field: str) -> Any:
    get = _GET.get(field)
    return get(manifest) if get is not None else manifest.to_dict().get(field)


def check_same_run(existing: RunManifest, planned: RunManifest, *, where: Path | str,
                   fields: Sequence[str], planned_by: str, fresh: str,
                   flags: bool = True) -> None:
    """Raise :class:`ConfigError` at the first of ``fields`` where ``existing`` (the
    ``run.json`` at ``where``) and ``planned`` (what ``planned_by`` would write) differ.

    ``fresh`` says where a different run goes (``a new --out``); ``flags`` adds the flag that
    sets the field. A setting kept only in the stored configuration is compared only when the
    existing run recorded it (runs made before it was kept name no value)."""
    stored = existing.extra.get("config", {})
    for field in fields:
        if field in _CONFIG_ONLY and field not in stored:
            continue
        old, new = _value(existing, field), _value(planned, field)
        if old != new:
            flag = f" ({_FLAG_OF.get(field, '--' + field.replace('_', '-'))})" if flags else ""
            raise ConfigError(
                f"{where} describes a run with {field} {json.dumps(old)}, {planned_by} "
                f"{json.dumps(new)}{flag}: continue the run with its own settings, or use "
                f"{fresh}")
