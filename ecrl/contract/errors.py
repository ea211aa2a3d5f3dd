"""The root of every error ECRL raises for a user's mistake.

Command-line entry points catch :class:`EcrlError` and print its message as one line (no
traceback); anything else escaping is a bug in ECRL and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["EcrlError", "ConfigError", "SemanticsError", "RunFormatError"]


class EcrlError(Exception):
    """A problem the user can act on; ``str(error)`` is the one line to show them."""


class ConfigError(EcrlError, ValueError):
    """A flag, config key or argument has a value ECRL cannot run with."""


class SemanticsError(ConfigError):
    """Dataset size, batch, world size or seed violate the run semantics."""


class RunFormatError(EcrlError):
    """A run-directory file does not follow the run format.

    ``path`` and ``line`` (1-based, ``None`` for whole-file problems) locate the problem; the
    message is rendered as ``path:line: message`` so editors and CI can jump to it.
    """

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
