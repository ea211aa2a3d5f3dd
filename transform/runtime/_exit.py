"""How a transformed program ends: one-line refusals, tracebacks in the user's source, and the
resume state kept or removed.

The generated program keeps every line of the original but adds lines of its own, so an uncaught
exception's traceback is rewritten: frames in the generated file show the original file's name,
line number and line. The generator wrote the map from its lines to the original's into the
program (``Program(..., lines=...)``: runs of consecutive lines, and the original text of the
lines it changed), so nothing is parsed here, only when there is a traceback to show.

The resume state is spent only when the program ends normally: no uncaught exception
(``sys.excepthook``) and no ``sys.exit`` with a failing status. A walk that never arrived is a
bug worth a loud exit, never a silent success.
"""

from __future__ import annotations

import atexit
import os
import sys
import tokenize
import traceback
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from transform.runtime._program import Program

__all__ = ["CheckpointError", "ExitWatch", "user_traceback", "line_map"]


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

        def excepthook(kind: type[BaseException], value: BaseException,
                       tb: types.TracebackType | None) -> None:
            cls.failed = True
            try:
                text = user_traceback(cls.programs, kind, value, tb)
            except Exception:  # never hide the user's error behind one of ours
                text = None
            if text is None:
                previous_hook(kind, value, tb)
            else:
                sys.stderr.write(text)

        def exit_(status: Any = None) -> None:
            if status not in (None, 0):
                cls.failed = True
            previous_exit(status)

        sys.excepthook = excepthook
        sys.exit = exit_  # type: ignore[assignment]
        atexit.register(cls.at_exit)

    @classmethod
    def at_exit(cls) -> None:
        # A child the program forked (os.fork, a DataLoader worker) ends without touching the
        # parent's resume state: neither its writes nor its removal are the child's.
        programs = [program for program in cls.programs if program.pid == os.getpid()]
        # States still being written by the background writer are made durable first (a failed
        # run resumes from its newest one); at normal completion a waiting one is dropped.
        errors = [error for program in programs
                  if (error := program.finish_writes(completed=not cls.failed)) is not None]
        if errors:
            # A write failed after its save returned: said now, never lost, and the run fails
            # (exit 1 unless it failed already); the state on disk, the last one written whole,
            # stays.
            sys.stderr.write(f"ecrl-transform: {errors[0]}\n")
            sys.stdout.flush()
            sys.stderr.flush()
            if not cls.failed:
                os._exit(1)
        if cls.failed:
            return  # the failure said why; the resume state stays
        for program in programs:
            stuck = [a for a in program.walking if not a.run]
            if stuck:
                a = stuck[0]
                line = program.plan.hints[a.target].line
                sys.stderr.write(f"ecrl-transform: {program.where(line)}: resuming never reached "
                                 "this checkpoint; the output of this run is not valid (please "
                                 "report this with the program)\n")
                sys.stderr.flush()
                os._exit(70)
        for program in programs:
            program.complete()


def line_map(lines: Mapping[str, Any] | None) -> tuple[dict[int, int], dict[int, str]]:
    """The map a generated program carries, read: its line → the original's line (a line the
    generator added is absent), and the original's text of the lines the generator changed."""
    mapping: dict[int, int] = {}
    if not lines:
        return mapping, {}
    for start, source_line, count in lines.get("runs", ()):
        for k in range(count):
            mapping[start + k] = source_line + k
    return mapping, {int(k): str(v) for k, v in lines.get("text", {}).items()}


def user_traceback(programs: Sequence[Program], kind: type[BaseException],
                   value: BaseException, tb: types.TracebackType | None) -> str | None:
    """The traceback with the generated files' frames moved to the originals, or None when no
    frame is in a generated file."""
    generated = {os.path.abspath(p.file): p for p in programs}
    maps: dict[str, tuple[dict[int, int], dict[int, str], list[str]]] = {}
    moved = False
    top = traceback.TracebackException(kind, value, tb)
    seen: set[int] = set()
    pending = [top]
    while pending:
        exc = pending.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        for chained in (exc.__cause__, exc.__context__):
            if chained is not None:
                pending.append(chained)
        for i, frame in enumerate(exc.stack):
            path = os.path.abspath(frame.filename)
            program = generated.get(path)
            if program is None or frame.lineno is None:
                continue
            if path not in maps:
                with tokenize.open(path) as f:  # its own encoding, any line ending
                    maps[path] = (*line_map(program.lines), f.read().splitlines())
            mapping, changed, ours = maps[path]
            line = mapping.get(frame.lineno, 0)
            if line == 0 or frame.lineno > len(ours):
                continue
            text = changed.get(line)
            exc.stack[i] = traceback.FrameSummary(
                program.plan.original or frame.filename, line, frame.name,
                line=ours[frame.lineno - 1].strip() if text is None else text)
            moved = True
    if not moved:
        return None
    return "".join(top.format())
