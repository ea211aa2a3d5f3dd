"""``ecrl-transform``: turn ``_checkpoint()`` hints into real checkpoints (never imports torch).

For programs: ``from transform import _checkpoint, checkpoint_params`` — both do nothing when the
program runs untransformed; ``_iterations: N`` and ``_cost: SECONDS`` are bare annotations.

For tools: :func:`analyze` returns :class:`AnalysisSuccess` — the task tree (:class:`TaskTree`
of :class:`Region` → :class:`Seq` of :class:`Code` / :class:`HintSite` / :class:`Loop` /
:class:`Branch`, each with ``ast`` statements and :class:`Position`), one :class:`RegionSchedule`
per region (its :class:`Firing` rules say at which executions of each hint slot a checkpoint is
taken), and :class:`LiveFacts` per hint (sorted names to save, names to re-bind by re-running
imports/defs) — or :class:`AnalysisFailure` with a :class:`SourceIssue` (``file:line:col:
message``). :func:`generate` writes the program (:class:`Generated`); generated programs import
:mod:`transform.runtime`. The solvers are in :mod:`transform.schedule`. docs/transform.md
documents the whole surface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "_checkpoint",
    "checkpoint_params",
    "analyze",
    "AnalysisSuccess",
    "AnalysisFailure",
    "AnalysisResult",
    "ScheduleParams",
    "RegionSchedule",
    "Firing",
    "LiveFacts",
    "TaskTree",
    "Region",
    "Seq",
    "Code",
    "HintSite",
    "Loop",
    "Branch",
    "Hint",
    "Position",
    "SourceIssue",
    "SourceError",
    "TransformError",
    "Profile",
    "generate",
    "Generated",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# Set only by the profiling child (transform.profile); None makes the hint a no-op.
_recorder: Callable[[], None] | None = None


def _checkpoint() -> None:
    """A possible checkpoint place; ``ecrl-transform`` decides whether it becomes one."""
    if _recorder is not None:
        _recorder()


def checkpoint_params(*, overhead: float | None = None, ckpt_cost: float | None = None,
                      failure_rate: float | None = None,
                      mtbf: float | None = None) -> Callable[[_F], _F]:
    """Declare schedule parameters for a function (as a decorator) or, called as a statement at
    module level, for the module's top level. Read statically; does nothing at run time."""
    def keep(func: _F) -> _F:
        return func

    return keep


def __getattr__(name: str) -> Any:
    # The analysis imports networkx and numpy (code generation libcst): load them only when a
    # tool asks for them, so a program that merely imports the hint stays light.
    if name in ("analyze", "AnalysisSuccess", "AnalysisFailure", "AnalysisResult"):
        from transform import analysis

        return getattr(analysis, name)
    if name in ("ScheduleParams", "RegionSchedule", "Firing"):
        from transform import plan

        return getattr(plan, name)
    if name == "LiveFacts":
        from transform.liveness import LiveFacts

        return LiveFacts
    if name in ("TaskTree", "Region", "Seq", "Code", "HintSite", "Loop", "Branch", "Hint",
                "Position"):
        from transform import tasks

        return getattr(tasks, name)
    if name in ("SourceIssue", "SourceError", "TransformError"):
        from transform import errors

        return getattr(errors, name)
    if name in ("generate", "Generated"):
        from transform import codegen

        return getattr(codegen, name)
    if name == "Profile":
        from transform.profile import Profile

        return Profile
    raise AttributeError(f"module 'transform' has no attribute {name!r}")
