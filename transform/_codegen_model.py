"""The data of code generation: the names generated code uses, what the generator decides for
each statement of a region (:class:`Marks`), and what it returns (:class:`Generated`).

:mod:`transform._codegen_marks` fills the marks and builds the plan, :mod:`transform._codegen_emit`
writes the program from them, :mod:`transform.codegen` ties the two together. The mechanism
(*walk and skip*) is described in :mod:`transform.codegen`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from transform.planspec import Plan

__all__ = ["ACTIVATION", "PROGRAM", "RUNTIME", "MARKER", "RESERVED", "WIDTH", "Generated", "Step",
           "Marks", "Marked"]

ACTIVATION = "_ecrl"
PROGRAM = "_ECRL"
RUNTIME = "_ecrl_runtime"
MARKER = f"import transform.runtime as {RUNTIME}"
RESERVED = (ACTIVATION, PROGRAM, RUNTIME)
"""Names the generated code binds: a program that uses one is refused."""
WIDTH = 96
"""Line width the generated lines are wrapped to."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Generated:
    """The written program, or the reason nothing was written."""

    code: str
    changed: bool
    note: str = ""
    """One line for the user when the program is left unchanged."""
    checkpoints: tuple[int, ...] = ()
    """Hint ids that became checkpoints."""
    plan: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(slots=True)
class Step:
    block: list[ast.stmt]
    index: int
    arm: tuple[str, ast.AST] | None
    """How the way continues into ``block[index]`` (``None``: it is the hint)."""


@dataclass(slots=True)
class Marks:
    """Per statement: what the generated code does there (filled region by region). Statements
    are keyed by ``id()`` of their ``ast`` node."""

    lines: list[str]
    """The source's lines (``elif`` and ``else: if`` differ only there)."""
    skip: set[int] = field(default_factory=set)
    """Statements skipped while walking (guarded, or headers that evaluate nothing)."""
    site: dict[tuple[str, int], int] = field(default_factory=dict)
    """(kind, id(node)) → steering site number."""
    sites: dict[int, set[int]] = field(default_factory=dict)
    """Steering site → the hints inside it."""
    ranges: set[int] = field(default_factory=set)
    """``for`` sites over a ``range``."""
    hint_loops: dict[int, list[int]] = field(default_factory=dict)
    hint_subjects: dict[int, list[int]] = field(default_factory=dict)
    restore_before: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    """id(outermost statement of a function's stretch of the way to saved points) → (hint,
    level): the values bound there are those of call-stack level ``level`` (None: the hint's
    own function)."""
    chosen: dict[int, int] = field(default_factory=dict)
    """id(hint statement) → hint id."""
    chains: dict[int, list[Step]] = field(default_factory=dict)
    """Hint → the way to it from its region's body."""
    branches: dict[int, int] = field(default_factory=dict)
    """id(branch statement) → its settle site (branches holding chosen slots)."""
    generators: frozenset[str] = frozenset()
    """The program's generator functions (:func:`transform.cfg.generator_functions`)."""
    settle: dict[int, dict[int, int]] = field(default_factory=dict)
    """settle site → {slot id: positions per execution of the branch}."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Marked:
    """A program's chosen checkpoints, decided: the marks, and the plan the program carries."""

    marks: Marks
    plan: Plan
    hints: dict[int, dict[str, Any]]
    """Hint → what its save holds (``save``, ``maybe``…), as in the plan's literal."""
    region_names: dict[int, str]
    """id(function node) → region name, for the functions that checkpoint."""
    hosted_names: dict[int, str] = field(default_factory=dict)
    """id(function node) → the region a hosted function's checkpoints belong to."""
    path_chains: set[int]
    """ids of the ``if`` statements of chains with an arm that leads to a saved point."""
