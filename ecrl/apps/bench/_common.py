"""What every ``ecrl bench`` produces: ratio rows, a markdown section, targets met or not.

A benchmark compares ECRL with the alternative in the same process run, so the ratio is
meaningful even on a noisy or slow machine. Results are data (:class:`BenchResult`); rendering
to text, JSON (``{"rows": [...]}``) and the section of ``docs/benchmarks.md`` happens here.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract.atomicio import atomic_write_text

__all__ = ["BenchRow", "BenchResult", "Target", "Progress", "render_text", "render_json",
           "write_docs_section", "machine_line", "median_time"]

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchRow:
    """One side-by-side measurement; ``ratio = candidate_value / alternative_value``."""

    candidate: str
    alternative: str
    metric: str
    """What was measured, with its unit and which direction is better."""
    candidate_value: float | None
    alternative_value: float | None
    """None when the alternative could not run (e.g. it would not fit in memory)."""
    ratio: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.candidate_value is not None and self.alternative_value:
            object.__setattr__(self, "ratio", self.candidate_value / self.alternative_value)


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """A number the issue asks for, and whether this run met it."""

    description: str
    measured: str
    met: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchResult:
    name: str
    command: str
    rows: Sequence[BenchRow]
    targets: Sequence[Target] = ()
    notes: Sequence[str] = field(default_factory=tuple)
    section: str = ""
    """Its section of ``docs/benchmarks.md`` when not ``name``'s own (the same benchmark
    measured on other hardware keeps both)."""

    @property
    def title(self) -> str:
        return f"`ecrl bench {self.name}`" + (f" ({self.section})" if self.section else "")


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3g}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _table(result: BenchResult) -> list[str]:
    lines = [
        "| metric | candidate | value | alternative | value | ratio | note |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for r in result.rows:
        lines.append(
            f"| {r.metric} | {r.candidate} | {_fmt(r.candidate_value)} | {r.alternative} | "
            f"{_fmt(r.alternative_value)} | {_fmt(r.ratio)} | {r.note} |"
        )
    return lines


def _targets(result: BenchResult) -> list[str]:
    return [
        f"- {'met' if t.met else 'NOT met'}: {t.description} — measured {t.measured}"
        for t in result.targets
    ]


def render_text(result: BenchResult) -> str:
    out = [f"ecrl bench {result.name}" + (f" ({result.section})" if result.section else ""),
           *_table(result)]
    if result.targets:
        out += ["", "targets:", *_targets(result)]
    out += [f"note: {n}" for n in result.notes]
    return "\n".join(out)


def render_json(result: BenchResult) -> str:
    return json.dumps(
        {
            "name": result.name,
            "command": result.command,
            "rows": [asdict(r) for r in result.rows],
            "targets": [asdict(t) for t in result.targets],
            "notes": list(result.notes),
        },
        indent=2,
    )


def machine_line() -> str:
    cpus = os.cpu_count()
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "absent"
    return (
        f"{platform.system()} {platform.machine()}, {cpus} CPU cores, Python "
        f"{platform.python_version()}, torch {torch_version}{_gpu_words()}"
    )


def _gpu_words() -> str:
    """``, GPU <name> (CUDA <version>)`` where torch sees one: a figure measured on a GPU names
    its card."""
    try:
        import torch

        if not torch.cuda.is_available():
            return ""
        return f", GPU {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    except ImportError:
        return ""


def write_docs_section(path: str | os.PathLike[str], result: BenchResult) -> None:
    """Replace (or append) this benchmark's section of ``docs/benchmarks.md``."""
    key = result.section or result.name
    start = f"<!-- bench:{key}:start -->"
    end = f"<!-- bench:{key}:end -->"
    body = [
        start,
        f"### {result.title}",
        "",
        f"Command: `{result.command}`  ",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine_line()}.",
        "",
        *_table(result),
    ]
    if result.targets:
        body += ["", "Targets:", "", *_targets(result)]
    if result.notes:
        body += ["", *[f"- {n}" for n in result.notes]]
    body.append(end)
    section = "\n".join(body)
    doc = Path(path)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_text(doc, text)


def median_time(fn: Callable[[], object], *, repeats: int) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[len(samples) // 2]


def timed_calls(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    """``fn`` whose every call's wall time is appended to ``spent`` (a function: set on a class,
    it binds as a method)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    return timed


def command_line() -> str:
    return " ".join(["ecrl", *sys.argv[1:]]) if sys.argv else "ecrl bench"
