"""How a transformed program ends: one-line refusals, and the resume state kept or removed.

The resume state is spent only when the program ends normally: no uncaught exception
(``sys.excepthook``) and no ``sys.exit`` with a failing status. A walk that never arrived is a
bug worth a loud exit, never a silent success.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from transform.runtime._program import Program

__all__ = ["CheckpointError", "ExitWatch"]


class CheckpointError(SystemExit):
    """A checkpoint cannot be taken or resumed; ends the program with one line (exit 1)."""

    def __init__(self, message: str) -> None:
        ExitWatch.failed = True  # a failed run keeps its resume state
        super().__init__(f"ecrl-transform: {message}")


class ExitWatch:
    """Removes the resume state when the process ends normally, and only then."""

    programs: ClassVar[list[Program]] = []
    failed = False
    installed = False

    @classmethod
    def install(cls, program: Program) -> None:
        cls.programs.append(program)
        if cls.installed:
            return
        cls.installed = True
        previous_hook = sys.excepthook
        previous_exit = sys.exit

        def excepthook(*args: Any) -> None:
            cls.failed = True
            previous_hook(*args)

        def exit_(status: Any = None) -> None:
            if status not in (None, 0):
                cls.failed = True
            previous_exit(status)

        sys.excepthook = excepthook
        sys.exit = exit_  # type: ignore[assignment]
        atexit.register(cls.at_exit)

    @classmethod
    def at_exit(cls) -> None:
        if cls.failed:
            return  # the failure said why; the resume state stays
        for program in cls.programs:
            stuck = [a for a in program.walking if not a.run]
            if stuck:
                a = stuck[0]
                line = program.plan.hints[a.target].line
                sys.stderr.write(f"ecrl-transform: {program.where(line)}: resuming never reached "
                                 "this checkpoint; the output of this run is not valid (please "
                                 "report this with the program)\n")
                sys.stderr.flush()
                os._exit(70)
        for program in cls.programs:
            program.complete()
