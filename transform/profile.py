"""Profile mode: run the program once with timers at its hints (in a child process).

The child installs a recorder behind :func:`transform._checkpoint`, runs the program as
``__main__`` and records, for every pair (previous hint or start, next hint or end), how often it
was seen and the seconds between them — exactly the task times of the flattened timeline — and,
for each hint, the pickled size of the values live there (sampled on the first few executions).
Sizes become per-hint checkpoint costs (``latency + bytes / bandwidth``), so checkpoint cost varies
per hint as CheckHint's §5.1 asks. The profile is a small JSON file that can be reused.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from transform.errors import TransformError

__all__ = ["Profile", "load_profile", "record_profile", "DEFAULT_BANDWIDTH", "DEFAULT_LATENCY"]

DEFAULT_BANDWIDTH = 200e6
"""Bytes per second a checkpoint write is assumed to reach (override with --write-bandwidth)."""
DEFAULT_LATENCY = 0.05
"""Fixed seconds per checkpoint (fsyncs, renames)."""
_SIZE_SAMPLES = 3

Key = tuple[int | None, int | None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    transitions: Mapping[Key, float]
    """(previous hint id | None, next hint id | None) → mean seconds between them."""
    counts: Mapping[Key, int]
    save_bytes: Mapping[int, int]
    """hint id → pickled bytes of its live values (largest sample)."""
    unsaveable: Mapping[int, str] = field(default_factory=dict)
    """hint id → why a live value could not be pickled (name and error)."""
    bandwidth: float = DEFAULT_BANDWIDTH
    latency: float = DEFAULT_LATENCY

    def checkpoint_costs(self) -> dict[int, float]:
        return {h: self.latency + b / self.bandwidth for h, b in self.save_bytes.items()}

    def to_json(self) -> dict[str, object]:
        return {
            "transitions": [[a, b, self.transitions[(a, b)], self.counts.get((a, b), 0)]
                            for (a, b) in sorted(self.transitions, key=str)],
            "save_bytes": {str(h): n for h, n in sorted(self.save_bytes.items())},
            "unsaveable": {str(h): why for h, why in sorted(self.unsaveable.items())},
        }


def load_profile(path: str | os.PathLike[str], *, bandwidth: float = DEFAULT_BANDWIDTH,
                 latency: float = DEFAULT_LATENCY) -> Profile:
    try:
        data = json.loads(Path(path).read_text())
        transitions = {(a, b): float(t) for a, b, t, _ in data["transitions"]}
        counts = {(a, b): int(c) for a, b, _, c in data["transitions"]}
        sizes = {int(h): int(n) for h, n in data["save_bytes"].items()}
        why = {int(h): str(w) for h, w in data.get("unsaveable", {}).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TransformError(f"{path}: not a profile written by --record-profile ({exc})") from None
    return Profile(transitions=transitions, counts=counts, save_bytes=sizes, unsaveable=why,
                   bandwidth=bandwidth, latency=latency)


def record_profile(src: str, out: str, *, hints: Mapping[int, tuple[int, tuple[str, ...]]],
                   args: tuple[str, ...] = (), bandwidth: float = DEFAULT_BANDWIDTH,
                   latency: float = DEFAULT_LATENCY) -> Profile:
    """Run ``src`` once (``python SRC ARGS`` semantics) and write its profile to ``out``.

    ``hints`` maps hint id → (line, names to size). Raises :class:`TransformError` if the program
    fails.
    """
    spec = {str(h): [line, list(names)] for h, (line, names) in hints.items()}
    proc = subprocess.run([sys.executable, "-m", "transform.profile", src, out, json.dumps(spec),
                           *args], check=False, stdout=2)  # keep our stdout for the report
    if proc.returncode != 0:
        raise TransformError(f"{src}: the profiling run exited with {proc.returncode}; fix the "
                             "program (or profile with the arguments it needs) and try again")
    return load_profile(out, bandwidth=bandwidth, latency=latency)


class _Recorder:
    def __init__(self, src: str, spec: Mapping[str, list[object]]) -> None:
        self.src = os.path.realpath(src)
        self.by_line = {int(v[0]): int(h) for h, v in spec.items()}  # type: ignore[call-overload]
        self.names = {int(h): list(v[1]) for h, v in spec.items()}  # type: ignore[call-overload]
        self.last: int | None = None
        self.stamp = time.perf_counter()
        self.total: dict[Key, float] = {}
        self.count: dict[Key, int] = {}
        self.sizes: dict[int, int] = {}
        self.samples: dict[int, int] = {}
        self.unsaveable: dict[int, str] = {}

    def step(self, hint: int | None) -> None:
        now = time.perf_counter()
        key = (self.last, hint)
        self.total[key] = self.total.get(key, 0.0) + (now - self.stamp)
        self.count[key] = self.count.get(key, 0) + 1
        self.last = hint

    def __call__(self) -> None:
        frame: FrameType | None = sys._getframe(2)
        if frame is None or os.path.realpath(frame.f_code.co_filename) != self.src:
            return
        hint = self.by_line.get(frame.f_lineno)
        if hint is None:
            return
        self.step(hint)
        if self.samples.get(hint, 0) < _SIZE_SAMPLES:
            self.samples[hint] = self.samples.get(hint, 0) + 1
            self.sizes[hint] = max(self.sizes.get(hint, 0), self._size(hint, frame))
        self.stamp = time.perf_counter()  # sizing is not the program's time

    def _size(self, hint: int, frame: FrameType) -> int:
        scope = frame.f_locals
        total = 0
        for name in self.names.get(hint, []):
            if name not in scope:
                continue
            try:
                total += len(pickle.dumps(scope[name], protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                self.unsaveable.setdefault(hint, f"{name}: {type(exc).__name__}: {exc}")
        return total

    def dump(self, out: str) -> None:
        self.step(None)
        data = {
            "transitions": [[a, b, self.total[(a, b)] / self.count[(a, b)], self.count[(a, b)]]
                            for (a, b) in self.total],
            "save_bytes": {str(h): n for h, n in self.sizes.items()},
            "unsaveable": {str(h): w for h, w in self.unsaveable.items()},
        }
        Path(out).write_text(json.dumps(data, indent=1))


def _main(argv: list[str]) -> int:
    import runpy

    import transform

    src, out, spec_json, *rest = argv
    recorder = _Recorder(src, json.loads(spec_json))
    transform._recorder = recorder
    sys.argv = [src, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(src)))
    try:
        runpy.run_path(src, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    recorder.dump(out)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
