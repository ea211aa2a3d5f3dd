"""The transformer's errors: one root, and source positions for people and editors.

A problem in the user's program is a :class:`SourceIssue` (data: path, line, column, message);
raising it wraps it in :class:`SourceError`, which renders as ``file:line:col: message``. Library
calls that cannot fail loudly return the issue instead (see :mod:`transform.analysis`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ecrl.contract.errors import ConfigError, EcrlError

__all__ = ["TransformError", "ScheduleError", "SourceIssue", "SourceError"]


class TransformError(EcrlError):
    """Root of the transformer's errors; ``str(error)`` is the one line to show."""


class ScheduleError(TransformError, ConfigError):
    """Schedule parameters or task times that the model cannot work with."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceIssue:
    """Something in the program the transformer cannot handle soundly, and where it is."""

    path: str
    line: int
    """1-based line."""
    column: int
    """1-based column, in characters (editors' convention)."""
    message: str
    """What is wrong and what to do, one sentence."""
    kind: str
    """A stable tag for tools and tests (``syntax``, ``hint-arguments``, ``unbounded-loop``…)."""

    def render(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.message}"


class SourceError(TransformError):
    """Raised form of a :class:`SourceIssue`."""

    def __init__(self, issue: SourceIssue) -> None:
        self.issue = issue
        super().__init__(issue.render())
