"""The task tree: a program's hints, and the code between them, as data with source positions.

A *region* is what one schedule covers: the module's top level, or one function whose body holds
hints (directly: a nested function is its own region). Inside a region the statements become a
:class:`Seq` of items: :class:`Code` (statements that cannot cross a hint; a compound statement
without hints stays whole), :class:`HintSite`, and the structured tasks :class:`Loop` and
:class:`Branch` for loops and branches that contain hints. ``with`` bodies and ``try`` bodies are
spliced into the enclosing sequence (``Code`` items carry their enclosing statements, so code
generation can re-enter them).

Every item keeps its ``ast`` statements (Python's own :mod:`ast`) and 1-based :class:`Position`.
This module is the data only; :mod:`transform._tasks_build` parses a source and builds the
tree (:func:`~transform._tasks_build.build_task_tree`), with the rules on where hints may
stand.

Costs are seconds: declared (``_cost: X``), estimated (:data:`STATEMENT_SECONDS` per simple
statement) or profiled (see :mod:`transform.profile`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from transform.errors import SourceIssue

if TYPE_CHECKING:  # the hosting module reads task trees' names: a cycle at run time
    from transform._hosting import Hosting

__all__ = [
    "STATEMENT_SECONDS",
    "HINT_NAME",
    "PARAMS_NAME",
    "CHECKHINT_NAME",
    "Position",
    "Hint",
    "Code",
    "HintSite",
    "Loop",
    "Branch",
    "Seq",
    "Item",
    "RegionParams",
    "Region",
    "TaskTree",
]

STATEMENT_SECONDS = 1e-3
"""Static estimate of one simple statement (documented in docs/transform.md; crude on purpose:
declare ``_cost`` or profile when it matters)."""
HINT_NAME = "_checkpoint"
PARAMS_NAME = "checkpoint_params"
CHECKHINT_NAME = "schedule_checkpoints"
"""CheckHint's decorator (seed 001), read as a synonym with its own keywords."""



@dataclass(frozen=True, kw_only=True, slots=True)
class Position:
    """A source span: 1-based lines and columns, end exclusive (as editors show them)."""

    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Hint:
    """One ``_checkpoint()`` statement. Ids are 1-based in source order over the whole file."""

    id: int
    position: Position
    region: str
    """Qualified name of the region (``<module>`` or ``train``, ``Trainer.fit``…)."""
    loops: tuple[int, ...]
    """Source lines of the enclosing loops of the region, outermost first."""
    statement: ast.Expr = field(compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Code:
    """Statements between hints (none of them holds a hint of this region)."""

    position: Position
    statements: tuple[ast.stmt, ...] = field(compare=False, repr=False)
    cost: float
    """Seconds for one execution: declared (``_cost``) or estimated."""
    declared: bool
    """True when a ``_cost`` annotation gave ``cost``."""
    enclosing: tuple[ast.stmt, ...] = field(default=(), compare=False, repr=False)
    """``with``/``try`` statements spliced around this code (outermost first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HintSite:
    hint: Hint
    enclosing: tuple[ast.stmt, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Loop:
    """A ``for``/``while`` loop whose body holds hints."""

    position: Position
    node: ast.For | ast.While = field(compare=False, repr=False)
    iterations: int
    iterations_from: str
    """``annotation`` (``_iterations: N``) or ``range`` (literal bounds)."""
    header_cost: float
    """Seconds per iteration outside the body's statements (the test or the iterator step)."""
    body: Seq
    enclosing: tuple[ast.stmt, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Branch:
    """An ``if``/``elif``/``else`` chain or a ``match`` whose arms hold hints.

    A missing ``else`` (or a match without a wildcard) is an empty arm. Arms are joined for the
    schedule as in CheckHint: position by position, the dearest arm's time.
    """

    position: Position
    node: ast.If | ast.Match = field(compare=False, repr=False)
    arms: tuple[Seq, ...]
    test_cost: float
    enclosing: tuple[ast.stmt, ...] = field(default=(), compare=False, repr=False)


Item = Code | HintSite | Loop | Branch


@dataclass(frozen=True, kw_only=True, slots=True)
class Seq:
    items: tuple[Item, ...]

    def hints(self) -> Iterator[Hint]:
        for item in self.items:
            if isinstance(item, HintSite):
                yield item.hint
            elif isinstance(item, Loop):
                yield from item.body.hints()
            elif isinstance(item, Branch):
                for arm in item.arms:
                    yield from arm.hints()


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionParams:
    """Schedule parameters declared in the source (``@checkpoint_params(...)``); None: unset."""

    overhead: float | None = None
    ckpt_cost: float | None = None
    failure_rate: float | None = None
    mtbf: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Region:
    name: str
    position: Position
    node: ast.Module | ast.FunctionDef = field(compare=False, repr=False)
    body: Seq
    params: RegionParams

    @property
    def statements(self) -> list[ast.stmt]:
        return self.node.body


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskTree:
    path: str
    source: str = field(compare=False, repr=False)
    module: ast.Module = field(compare=False, repr=False)
    regions: tuple[Region, ...]
    hints: tuple[Hint, ...]
    warnings: tuple[SourceIssue, ...]
    hosted: tuple[Hosting, ...] = ()
    """Functions whose checkpoints belong to the region of the function calling them from a
    loop (:mod:`transform._hosting`), innermost last along each chain."""
    hosting_issue: SourceIssue | None = None
    """Why a hosting call cannot be resumed (code generation refuses the program)."""
