"""Where each file of a run directory lives, and which directories are runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunPaths", "find_runs", "is_run_dir"]


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Where each file of a run directory lives."""

    root: Path

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> RunPaths:
        return cls(Path(root))

    @property
    def manifest(self) -> Path:
        return self.root / "run.json"

    @property
    def supervisor(self) -> Path:
        return self.root / "supervisor.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest(self) -> Path:
        return self.checkpoints / "latest.json"

    def attempt_dir(self, attempt: int) -> Path:
        return self.logs / f"attempt-{attempt:03d}"

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.attempt_dir(attempt) / f"rank-{rank:03d}.jsonl"

    def attempt_record(self, attempt: int) -> Path:
        """``attempt.json``: the attempt as its own rank 0 recorded it (``AttemptRecord``)."""
        return self.attempt_dir(attempt) / "attempt.json"

    def checkpoint_log(self, attempt: int) -> Path:
        return self.attempt_dir(attempt) / "checkpoint_rank0.jsonl"

    def attempts(self) -> list[int]:
        """Attempt numbers that have a log directory, ascending."""
        if not self.logs.is_dir():
            return []
        found = []
        for entry in self.logs.iterdir():
            name = entry.name
            if entry.is_dir() and name.startswith("attempt-") and name[8:].isdigit():
                found.append(int(name[8:]))
        return sorted(found)

    def rank_logs(self, attempt: int) -> dict[int, Path]:
        """``{rank: path}`` of the step logs one attempt wrote."""
        directory = self.attempt_dir(attempt)
        found: dict[int, Path] = {}
        if directory.is_dir():
            for entry in directory.iterdir():
                stem = entry.name
                if stem.startswith("rank-") and stem.endswith(".jsonl") and stem[5:-6].isdigit():
                    found[int(stem[5:-6])] = entry
        return dict(sorted(found.items()))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """A directory holding ``run.json`` or a ``logs/`` folder is treated as a run when it is named
    directly (so a run that lost its ``run.json`` still gets a verdict saying so)."""
    p = Path(path)
    return (p / "run.json").is_file() or (p / "logs").is_dir()


def find_runs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if it is a run, else every run directory below it, sorted.

    Below ``path`` a run is recognised by its ``run.json`` only, and hidden directories are not
    entered: ``.git`` has a ``logs/`` folder too, and is no run.
    """
    root = Path(path)
    if is_run_dir(root):
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if here != root and (here / "run.json").is_file():
            found.append(here)
            dirnames.clear()  # runs do not nest
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(found)
