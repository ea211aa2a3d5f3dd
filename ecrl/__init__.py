"""ECRL: fault-tolerant PyTorch DDP training with exact, verifiable recovery.

Importing ``ecrl`` does not import torch. Three layers, one subpackage each: ``ecrl.contract``
(torch-free: what the verifier and the transformer share), ``ecrl.runtime`` (the torch runtime)
and ``ecrl.apps`` (command line, demo, benchmarks: the only layer importing verifier and transform).

The library API for a user's own training loop (``docs/library.md``) loads torch when one of its
names is first used: :class:`GlobalBatchSampler`, :class:`WithSampleIds`, :class:`StepLog`,
:class:`Checkpointer`. Without torch (``pip install ecrl`` alone) such a name raises
:class:`ecrl.contract.extras.MissingExtraError`, an ``ImportError`` naming ``ecrl[train]``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ecrl.contract.errors import ConfigError, EcrlError, RunFormatError, SemanticsError
from ecrl.contract.extras import require as _require

if TYPE_CHECKING:
    from ecrl.runtime.checkpoint.checkpointer import Checkpointer
    from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
    from ecrl.runtime.sampling.meshbuild import data_parallel_mesh, init_mesh
    from ecrl.runtime.sampling.sample_ids import WithSampleIds
    from ecrl.runtime.sampling.steplog import StepLog
    from ecrl.runtime.settings import CheckpointSettings

__all__ = ["CheckpointSettings", "Checkpointer", "ConfigError", "EcrlError", "GlobalBatchSampler",
           "RunFormatError", "SemanticsError", "StepLog", "WithSampleIds", "__version__",
           "data_parallel_mesh", "init_mesh"]
__version__ = "0.1.0"

_LAZY = {
    "GlobalBatchSampler": "ecrl.runtime.sampling.batch_sampler",
    "WithSampleIds": "ecrl.runtime.sampling.sample_ids",
    "StepLog": "ecrl.runtime.sampling.steplog",
    "Checkpointer": "ecrl.runtime.checkpoint.checkpointer",
    "CheckpointSettings": "ecrl.runtime.settings",
    "init_mesh": "ecrl.runtime.sampling.meshbuild",
    "data_parallel_mesh": "ecrl.runtime.sampling.meshbuild",
}
_TORCH_FREE = frozenset({"CheckpointSettings"})
"""Lazy names that need no torch (a launcher script may build its settings without it)."""


def __getattr__(name: str) -> Any:
    # PEP 562: the torch-backed names are imported on first use, so `import ecrl` stays light.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ecrl' has no attribute {name!r}")
    if name not in _TORCH_FREE:
        _require("torch", what=f"ecrl.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
