"""The supervisor's events as the lines ``ecrl run``, ``ecrl launch`` and ``ecrl demo`` print.

The runtime reports :mod:`ecrl.runtime.supervision.events`; :class:`Console` turns each into
lines on stdout (progress, the normal course of a run) or stderr (crashes and errors). Printing is
never a reason to stop: once stdout or stderr is gone (``ecrl run … | head``, a closed terminal)
the console stops printing to it and the supervisor goes on supervising.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ecrl.runtime.endings import Ending
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervision.events import (
    AttemptEnded,
    AttemptStarted,
    DeadlinePassed,
    Event,
    PointerRepaired,
    RepeatedCrash,
    RestartLimitReached,
    RunAlreadyComplete,
    RunCompleted,
    RunFailed,
    RunOpened,
    RunResumed,
    ScriptEndedShort,
    StepProgress,
    StopRequested,
    StrayLogsSetAside,
)
from ecrl.runtime.supervision.summary import render_summary

__all__ = ["Console", "Emitter", "render"]

Lines = list[tuple[str, str]]
"""(stream, line) pairs: ``out`` or ``err``."""


@dataclass(slots=True)
class Emitter:
    """Prints lines to stdout or stderr until the stream breaks, then silently drops them."""

    stream: str
    broken: bool = False

    def __call__(self, line: str) -> None:
        if self.broken:
            return
        handle = sys.stdout if self.stream == "stdout" else sys.stderr
        try:
            print(line, file=handle, flush=True)
        except (OSError, ValueError):  # EPIPE, EIO from a hung-up terminal, a closed file
            self.broken = True
            # The interpreter flushes the stream again at exit: let that land in /dev/null
            # instead of printing "Exception ignored … BrokenPipeError" and exiting 120.
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, handle.fileno())
                os.close(devnull)


@dataclass(slots=True)
class Console:
    """A :class:`ecrl.runtime.supervision.events.Reporter` that prints (``out``: stdout's lines,
    ``err``: stderr's)."""

    out: Callable[[str], None] = field(default_factory=lambda: Emitter("stdout"))
    err: Callable[[str], None] = field(default_factory=lambda: Emitter("stderr"))

    def report(self, event: Event) -> None:
        for stream, line in render(event):
            (self.out if stream == "out" else self.err)(line)


def _after_step(step: int | None) -> str:
    return "before completing a step" if step is None else f"after step {step}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _shown(config: RunConfig, name: str) -> str:
    """A checkpoint setting as the launch knows it before the script runs: the flag given, or
    the script's choice with the default behind it."""
    value = getattr(config, name)
    return f"{value} (flag)" if name in config.explicit else f"(the script's, else {value})"


def _describe_ending(ending: Ending) -> str:
    """One line: who hung or died, and what the just-in-time rescue saved."""
    parts = []
    if ending.status == "hung":
        who = ", ".join(map(str, ending.stopped_ranks)) or "unknown"
        bound = max((float(v.get("bound_s", 0)) for v in ending.hung.values()), default=0.0)
        parts.append(f"hung: rank {who} stopped stepping (detected within the {bound:.1f} s "
                     "bound)")
    jit = ending.jit
    if jit is not None:
        if jit.get("saved"):
            parts.append(f"jit: rank {jit.get('rank')} saved step {jit.get('global_step')} "
                         f"({jit.get('source')} state) after {jit.get('reason')}")
        else:
            parts.append(f"jit: nothing saved ({jit.get('why_not')}) after {jit.get('reason')}")
    elif ending.status == "jit":
        parts.append("jit")
    return "; ".join(parts)


def _header(e: RunOpened) -> str:
    if e.command == "launch":
        c = e.config
        node = f" · node {e.node_rank} of {c.nnodes}" if c.nnodes > 1 else ""
        return (f"ecrl launch: {e.root} · {' '.join(e.program)} · strategy "
                f"{_shown(c, 'strategy')} every {_shown(c, 'ckpt_every')} · world sizes "
                f"{','.join(map(str, c.world_sizes))}{node}")
    m = e.manifest
    return (f"ecrl {e.command}: {e.root} · {m.dataset['name']} D={m.dataset_size} · "
            f"{m.model} · B={m.global_batch} · {m.target_steps} steps · strategy "
            f"{m.strategy} every {m.ckpt_every} · world sizes "
            f"{','.join(map(str, m.world_sizes))}")


def _attempt_ended(e: AttemptEnded) -> Lines:
    again = f"run `ecrl {e.command} --out {e.root}` again to continue"
    if e.status == "completed":
        if e.exit_code == 0:
            return []
        # Every rank logged the last step, then a rank died on its way out.
        return [("err", f"[attempt {e.attempt}] torchrun exited {e.exit_code} after the run's "
                        "last step was logged by every rank; the run is complete")]
    if e.status == "stopped":
        return [("out", f"[attempt {e.attempt}] stopped after step {e.last_step}; {again}")]
    if e.fatal is not None:
        return []  # the run's end says it (RunFailed)
    if e.status == "deadline":
        return [("out", f"[attempt {e.attempt}] stopped after step {e.last_step} before the "
                        f"deadline, its checkpoint committed; {again}")]
    after = ("no checkpoint yet" if e.latest_step is None
             else f"latest checkpoint: step {e.latest_step}" + (
                 f" ({e.latest_by}'s own)" if e.latest_by else ""))
    if e.ending is not None:
        return [("out", f"[attempt {e.attempt}] {_describe_ending(e.ending)}; {after}")]
    if e.fired is not None:
        return [("out", f"[attempt {e.attempt}] injected failure after step "
                        f"{e.fired.global_step} (rank {e.fired.rank}, exit 137); {after}")]
    lines: Lines = [("err", f"[attempt {e.attempt}] crashed (torchrun exit {e.exit_code}) "
                            f"{_after_step(e.last_step)}; {after}")]
    crash = e.crash
    if crash is None:
        return lines
    if crash.error is not None:
        error = crash.error
        who = "a rank" if error.rank is None else f"rank {error.rank}"
        lines.append(("err", f"  {who}: {error.exception}"))
        lines.append(("err", f"  ({error.where + '; ' if error.where else ''}full traceback in "
                             f"{crash.log})"))
    elif crash.tail is not None:
        lines.append(("err", f"  from {crash.log}:"))
        lines += [("err", f"  | {line}") for line in crash.tail]
    return lines


def render(event: Event) -> Lines:
    """The lines one event prints, each with its stream (``out`` or ``err``)."""
    match event:
        case RunOpened():
            return [("out", _header(event))]
        case RunAlreadyComplete(command=command, root=root, target_steps=target):
            steps = "" if target is None else f" ({target} steps)"
            return [("out", f"ecrl {command}: {root} is already complete{steps}; nothing to do")]
        case RunResumed(command=command, root=root, earlier_attempts=n):
            earlier = _count(n, "earlier attempt") if command == "run" else f"{n} earlier attempts"
            return [("out", f"ecrl {command}: resuming {root} ({earlier})")]
        case PointerRepaired(description=description):
            return [("err", f"ecrl run: {description}")]
        case StrayLogsSetAside(command=command, moved=moved):
            folders = ", ".join(f"{folder} → {to}" for folder, to in moved)
            return [("err", f"ecrl {command}: set aside {_count(len(moved), 'attempt folder')} "
                            f"that supervisor.json does not record (not written by this run; "
                            f"kept as evidence): {folders}")]
        case StopRequested(signal_name=name):
            return [("err", f"ecrl run: {name} received, stopping the job…")]
        case AttemptStarted():
            how = ("fresh start" if event.resumed_from_step is None
                   else f"resume after step {event.resumed_from_step}")
            start = 0 if event.resumed_from_step is None else event.resumed_from_step + 1
            target = event.target_steps
            span = f"steps {start}..{target - 1}" if target else f"from step {start}"
            if event.resumed_from_step is None and event.framework is not None:
                how = f"resumed by the script from {event.framework}'s own checkpoint"
                span = f"up to step {target - 1}" if target else "to the end"
            fail_at = list(event.fail_at)
            return [("out", f"[attempt {event.attempt}] world size {event.world_size}, {how}, "
                            f"{span}" + (f", failures at {fail_at}" if fail_at else ""))]
        case StepProgress():
            rate = "" if event.steps_per_s is None else f" · {event.steps_per_s:.1f} steps/s"
            loss = "n/a" if event.loss is None else f"{event.loss:.4f}"
            # ecrl launch: the target is unknown until the script wrote run.json.
            of = f"/{event.target_steps}" if event.target_steps else ""
            return [("out", f"  step {event.step + 1}{of} · loss {loss}{rate} · restarts "
                            f"{event.restarts} [attempt {event.attempt}, W={event.world_size}]")]
        case AttemptEnded():
            return _attempt_ended(event)
        case RunCompleted(command=command, root=root, summary=summary, node_rank=node):
            if summary is None:
                return [("out", f"ecrl {command}: node {node} done; the run's summary is node "
                                f"0's (run directory {root})")]
            return [("out", f"ecrl {command}: done; run directory {root}"),
                    *(("out", f"  {line}") for line in render_summary(summary))]
        case RunFailed(message=message, command=command):
            return [("err", f"ecrl {command}: error: {message}")]
        case RepeatedCrash(root=root, attempt=attempt, last_step=last, command=command):
            return [("err", f"ecrl {command}: error: the same error ended attempts "
                            f"{attempt - 1} and {attempt} {_after_step(last)}, so a restart "
                            f"cannot fix it; fix the cause, then run `ecrl {command} --out "
                            f"{root}` to continue")]
        case RestartLimitReached(limit=limit, last_step=last):
            return [("err", f"ecrl run: restart limit reached (--max-restarts {limit}); the run "
                            f"stops {_after_step(last)}")]
        case DeadlinePassed(command=command, root=root):
            return [("out", f"ecrl {command}: the deadline has passed; run `ecrl {command} "
                            f"--out {root}` again to continue")]
        case ScriptEndedShort():
            why = ("it wrote no step log (use ecrl.StepLog)" if not event.wrote_log
                   else f"its step log ends at step {event.last_step}, run.json's target is "
                        f"step {event.target_steps - 1}")
            return [("err", f"ecrl launch: error: the script exited 0 but {why}; ECRL cannot "
                            "call the run complete")]
    return []
