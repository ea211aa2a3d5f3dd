"""How ECRL's command lines end, one definition for ``ecrl``, ``ecrl-verify``, ``ecrl-transform``.

Each ``main`` parses its arguments and hands the rest of its work to :func:`run_main`, which
ends the program the same way for all three:

- a user's mistake (:class:`~ecrl.contract.errors.EcrlError`, and for a program that asks, an
  ``OSError`` on a path it was given) is one line on stderr, ``PROG: error: MESSAGE``, and exit
  code 2 — never a traceback;
- Ctrl-C is one line, ``PROG: interrupted``, and exit code 130 (128 + SIGINT, what a shell
  reports for a program the signal ended);
- a reader that closed stdout early (``ecrl-verify RUNS | head -1``) ends the program quietly,
  with exit code 141 (128 + SIGPIPE, what a shell reports for ``yes | head -1``'s writer);
  :func:`print_quietly` lets a program keep its own exit code instead (``ecrl-verify``'s verdict);
- anything else is a bug in ECRL and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ecrl.contract.errors import EcrlError

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_PIPE", "run_main", "print_quietly",
           "silence_stdout"]

EXIT_ERROR = 2
EXIT_INTERRUPTED = 128 + 2
EXIT_PIPE = 128 + 13


def silence_stdout() -> None:
    """Point stdout at /dev/null: nobody reads it any more, and the interpreter's final flush of
    what is still buffered would otherwise raise again and print a traceback at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def print_quietly(text: str) -> bool:
    """Print ``text`` and flush; on a closed pipe stop writing quietly and return False."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        silence_stdout()
        return False
    return True


def run_main(prog: str, body: Callable[[], int], *,
             os_error: Callable[[OSError], str] | None = None) -> int:
    """Run ``body`` (a program's work after parsing) and return its exit code, ending the way the
    module docstring says. ``prog`` starts each line (``ecrl run``, ``ecrl-verify``);
    ``os_error``, when given, makes an ``OSError`` a user's error and writes its message."""
    try:
        code = body()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        silence_stdout()
        return EXIT_PIPE
    except EcrlError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        if os_error is None:
            raise
        print(f"{prog}: error: {os_error(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
