"""Program and Activation: the calls a generated program makes, and the walk back on resume.

See :mod:`transform.runtime` for the protocol between the generated code and this module.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from transform.planspec import FrameSpec, HintSpec, Plan, PlanError
from transform.runtime._exit import CheckpointError, ExitWatch
from transform.runtime._inplace import anchor_kind, anchor_state, apply_anchor, update_container
from transform.runtime._observe import Saved, notify
from transform.runtime._pickling import BlobMemo, dumps, loads, set_program
from transform.runtime._resources import (
    LoaderInBar,
    LoopWindow,
    bar_loader,
    enumerated,
    loop_iterator,
    loop_origin,
    resumed_loop,
)
from transform.runtime._resources import install as install_resources
from transform.runtime._rng import rng_state, set_rng_state
from transform.runtime._statefile import StateDir, StoredState, resolve_directory
from transform.runtime._writer import SYNC_ENV, Job, StateWriter

__all__ = ["Program", "Activation", "KILL_ENV", "DEDUP_ENV", "SYNC_ENV", "SKIP"]

KILL_ENV = "ECRL_TRANSFORM_KILL_AT"
"""Failure injection for tests: ``N`` (SIGKILL right after the N-th save of this process is
written), ``N:POINT`` (during the N-th save's write, at an
:data:`ecrl.contract.atomicio.CRASH_POINTS` step of ``resume.ckpt``) — every save then waits for
its write, so the kill lands on a known state — or ``N:in-flight`` (the N-th save's write stops
before its rename until the program has handed over a later save, then SIGKILL: a kill while the
training thread runs ahead of the background writer)."""
IN_FLIGHT = "in-flight"
DEDUP_ENV = "ECRL_TRANSFORM_DEDUP"
"""``0`` writes every value into every checkpoint (no blob saved once): the benchmark's baseline."""


# --------------------------------------------------------------------------- program, regions


class Program:
    """One transformed program: its plan, its resume state, its regions' entries."""

    def __init__(self, file: str, plan: Mapping[str, Any],
                 lines: Mapping[str, Any] | None = None) -> None:
        self.file = file
        self.lines = lines
        """The generator's map from the program's lines to the original's (tracebacks)."""
        try:
            self.plan = Plan.from_literal(plan)
        except PlanError as exc:
            raise CheckpointError(f"{file}: {exc}; transform the original program again with "
                                  "the installed ecrl-transform") from None
        self.hints: Mapping[int, HintSpec] = self.plan.hints
        self.sites = self.plan.sites
        self.state_dir = StateDir(resolve_directory(file, self.plan.ckpt_dir))
        self.directory = self.state_dir.directory
        self.path = self.state_dir.path
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.pid = os.getpid()
        """The process that runs the program: a child it forks neither writes nor removes."""
        self.entries: dict[str, int] = {}
        self.active: dict[str, Activation] = {}
        """Each region's latest activation: hosted functions join it."""
        # Functions and classes are found in, and closures bound to, the program's namespace.
        set_program(sys._getframe(1).f_globals, file)
        # Before the program's imports: data-loader iterators it creates are re-creatable.
        install_resources()
        self.dedup = os.environ.get(DEDUP_ENV, "1") != "0"
        self.blob_memo = BlobMemo() if self.dedup else None
        if self.rank == 0:
            self.state_dir.clean()
        self.pending: StoredState | None = self.state_dir.read(self.plan.source)
        self.walking: list[Activation] = []
        self.saves = 0
        self.kill_at = _parse_kill(os.environ.get(KILL_ENV))
        self.writer = StateWriter(self.state_dir,
                                  background=os.environ.get(SYNC_ENV, "0") in ("", "0"))
        ExitWatch.install(self)

    def where(self, line: int) -> str:
        """A position in the original program, for messages: ``file:line``."""
        return f"{self.plan.original or self.file}:{line}"

    def enter(self, region: str) -> Activation:
        entry = self.entries.get(region, 0) + 1
        self.entries[region] = entry
        state = self.pending
        if state is not None and state.region == region and state.entry == entry:
            self.pending = None
            activation = Activation(self, region, entry, state, sys._getframe(1))
        else:
            activation = Activation(self, region, entry, None, sys._getframe(1))
        self.active[region] = activation
        return activation

    def within(self, region: str) -> Activation:
        """A hosted function's activation: that of the region whose loop calls it (it walks and
        counts as part of it, see :mod:`transform._hosting`)."""
        activation = self.active.get(region)
        if activation is None:
            # No line: this frame's numbers are the generated program's, not the original's.
            code = sys._getframe(1).f_code
            raise CheckpointError(
                f"{self.plan.original or self.file}: {code.co_qualname}() holds checkpoints of "
                f"{region}() and runs only when {region}() calls it; it was called before "
                f"{region}() started (transform the program again if it changed)")
        return activation

    # -- writing
    def write(self, header: dict[str, Any], data: bytes, blobs: dict[str, bytes]) -> None:
        """Hand a serialized state to the writer (rank 0 only): the training thread goes on."""
        self.saves += 1
        hook: Callable[[str], None] | None = None
        kill = self.kill_at
        if kill is not None and kill[0] == self.saves and kill[1] not in ("after", IN_FLIGHT):
            point = kill[1]

            def hook(step: str) -> None:
                if step == point:
                    os.kill(os.getpid(), signal.SIGKILL)
        elif kill is not None and kill == (self.saves, IN_FLIGHT):
            number, writer = self.saves, self.writer

            def hook(step: str) -> None:
                if step == "before-rename":
                    writer.hold_until_overtaken(number)
                    os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == 0:
            if self.saves == 1:
                self.state_dir.prepare()
            self.writer.submit(Job(self.saves, header, data, blobs, hook))
            if kill is not None and not (kill[1] == IN_FLIGHT and self.saves >= kill[0]):
                self.writer.wait()  # an injected kill lands on a known state
            elif kill == (self.saves, IN_FLIGHT):
                self.writer.wait_taken(self.saves)
        if kill is not None and kill == (self.saves, "after"):
            os.kill(os.getpid(), signal.SIGKILL)

    def finish_writes(self, *, completed: bool) -> str | None:
        """At exit: the write in flight finished (and, unless the program completed, the waiting
        one); the error of a write that failed, if any."""
        return self.writer.drain(discard_waiting=completed)

    def complete(self) -> None:
        """The program ended normally: its resume state is spent."""
        if self.rank == 0:
            self.state_dir.remove()


def _parse_kill(value: str | None) -> tuple[int, str] | None:
    if not value:
        return None
    count, _, point = value.partition(":")
    return int(count), point or "after"


class _Skip(BaseException):
    """Raised as the first statement of a skipped ``with`` body; :data:`SKIP` swallows it."""


class _SkipContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, traceback: object) -> bool:
        return kind is _Skip


SKIP = _SkipContext()
_NOTHING = object()


class Activation:
    """One execution of a region (a call of a checkpointing function, or the module's run)."""

    __slots__ = ("run", "program", "region", "entry", "target", "state", "counters", "index",
                 "entry_rng", "subjects", "values", "entry_objects", "is_module", "marked",
                 "pending", "levels", "replaced", "loop_iterators", "loop_settles", "bar_counts",
                 "loop_windows", "loop_iterables", "loop_items", "file_starts")

    SKIP = SKIP

    def __init__(self, program: Program, region: str, entry: int, state: StoredState | None,
                 frame: types.FrameType) -> None:
        self.program = program
        self.region = region
        self.entry = entry
        self.state = state
        self.run = state is None
        """False while walking back to the saved point: guarded statements are skipped."""
        self.target = state.hint if state is not None else 0
        self.counters: dict[int, int] = {}
        self.index: dict[int, int] = {}
        self.entry_rng: dict[int, Any] = {}
        self.loop_iterators: dict[int, weakref.ref[Any]] = {}
        """A loop's DataLoader iterator, while it lives (its random states are saved)."""
        self.loop_iterables: dict[int, Any] = {}
        self.loop_items: dict[int, Any] = {}
        """A running loop's iterable and current item: an iterator that is itself saved comes
        back where it stood, so its resume is given that item back instead of skipping."""
        self.file_starts: dict[int, int] = {}
        """A loop over an open file: where the file stood as the loop began."""
        self.loop_windows: dict[int, LoopWindow] = {}
        """Per loop, the DataLoader iterators made as it began (:class:`LoopWindow`)."""
        self.bar_counts: dict[int, int] = {}
        """A loop over a progress bar: the bar's count as the loop began."""
        self.loop_settles: list[Callable[[], None]] = []
        """Resumed loops' loaders: their generators' states of the save, put back on arrival."""
        self.subjects: dict[int, Any] = {}
        self.marked: dict[int, dict[int, int]] = {}
        self.pending = False
        self.values: dict[str, Any] | None = None
        """The hint's own function's saved values, once bound on resume."""
        self.levels: dict[int, dict[str, Any]] = {}
        """A hosted hint's call-stack levels' saved values, once bound (level 0: the region)."""
        self.replaced: dict[int, Any] = {}
        """id of a loaded value → the existing object it was restored into."""
        self.is_module = region == "<module>"
        info = program.plan.regions.get(region)
        scope = frame.f_locals
        # The parameters' objects as the caller passed them: saved values identical to these
        # are restored in place on resume, into the objects the caller rebuilds.
        self.entry_objects = {name: scope[name] for name in (info.params if info else ())
                              if name in scope}
        if state is not None:
            program.walking.append(self)

    # -- steering, used by generated headers
    def into(self, site: int) -> bool:
        """Walking, and the saved point lies inside this site (an arm, a loop, a case)."""
        return not self.run and self.target in self.program.sites.get(site, ())

    def enters(self, site: int) -> bool:
        return self.run or self.target in self.program.sites.get(site, ())

    def skip(self, site: int = 0) -> None:
        """First statement of a ``with`` body: leave the block at once if it is skipped."""
        if not self.run and self.target not in self.program.sites.get(site, ()):
            raise _Skip

    def loop(self, site: int) -> Callable[[Iterable[Any]], Iterator[Any]]:
        """Wrap a ``for`` loop's iterable: track its position, or restart it at the saved one."""
        if self.run:
            if site in self.program.plan.ranges:
                return lambda iterable: self._track(site, iterable, 0, iter(iterable))
            # The iterable may draw random numbers when it is created or iterated (a
            # shuffling loader): a fast-forward replays them from this state.
            self.entry_rng[site] = rng_state()
            window = self.loop_windows[site] = LoopWindow()
            return lambda iterable: self._track(site, iterable, 0, self._entered(site, iterable),
                                                window)
        if self.target not in self.program.sites.get(site, ()):
            return lambda iterable: iter(())
        payload = self._payload()
        start = payload["loops"][site]
        entry_state = payload["entry_rng"].get(site)
        if entry_state is not None:
            set_rng_state(entry_state)
            self.entry_rng[site] = entry_state
        origin = payload.get("loaders", {}).get(site)
        resumed: LoopWindow | None = None
        if site not in self.program.plan.ranges:
            resumed = self.loop_windows[site] = LoopWindow(
                None if origin is not None else payload.get("windows", {}).get(site))
        return lambda iterable: self._track(site, iterable, start,
                                            self._seek(site, iterable, start, origin), resumed)

    def _entered(self, site: int, iterable: Iterable[Any]) -> Iterator[Any]:
        self.loop_iterables[site] = iterable
        self.file_starts.pop(site, None)
        if isinstance(iterable, io.IOBase) and not iterable.closed and iterable.seekable():
            # a file the resume opens again (a ``with`` re-entered) but does not read again up
            # to here (a header line taken before the loop): its position as the loop began
            self.file_starts[site] = iterable.tell()
        self.loop_iterators.pop(site, None)
        self.bar_counts.pop(site, None)
        loader = bar_loader(iterable)
        if loader is not None:
            # a progress bar makes its loader's iterator at its first item; its count is saved
            # as it was then (it keeps its running count to itself until the loop ends)
            LoaderInBar(iterable, loader, seen=lambda made: self._tracked(site, made, made))
            self.bar_counts[site] = iterable.n  # type: ignore[attr-defined]
        iterator = iter(iterable)
        self._tracked(site, iterable, iterator)
        return iterator

    def _entry_bar_count(self, site: int) -> int:
        return int(self._payload().get("bar_counts", {}).get(site, 0))

    def _tracked(self, site: int, iterable: Iterable[Any], iterator: Iterator[Any]) -> None:
        inner = loop_iterator(iterable, iterator)
        if inner is not None:
            # held weakly: a loop left by ``break`` must not keep a loader's workers alive
            self.loop_iterators[site] = weakref.ref(inner)

    def _seek(self, site: int, iterable: Iterable[Any], start: int, saved: Any = None
              ) -> Iterator[Any]:
        if isinstance(iterable, range | list | tuple | str | bytes):
            return iter(iterable[start:])
        positioned = self._payload().get("positioned", {})
        if site in positioned:
            # the iterator was saved with the program's values: restored where it stood, past
            # the saved iteration's item, which is given back for the walk
            kind, item = positioned[site]
            self.loop_iterables[site] = iterable
            if kind == "enumerate":
                inner = enumerated(iterable)[0]  # type: ignore[arg-type]
                iterable = enumerate(inner, item[0] + 1)
                self.loop_iterables[site] = iterable
            return itertools.chain((item,), iter(iterable))
        file_start = self._payload().get("file_starts", {}).get(site)
        if file_start is not None and hasattr(iterable, "seek"):
            iterable.seek(file_start)
            self.file_starts[site] = file_start
        if saved is not None:
            loader = bar_loader(iterable)
            resumed = resumed_loop(iterable if loader is None else loader, saved, start)
            if resumed is not None:
                items, inner, settle = resumed
                self.loop_iterators[site] = weakref.ref(inner)
                self.loop_settles.append(settle)
                if loader is None:
                    return items
                # the bar counts the batches passed over, from its count when the loop began: it
                # is given placeholders for them
                self.bar_counts[site] = self._entry_bar_count(site)
                bar: Any = iterable
                bar.n = self.bar_counts[site]
                LoaderInBar(iterable, loader,
                            items=itertools.chain(itertools.repeat(None, start), items))
        iterator = iter(iterable)
        skipped = sum(1 for _ in itertools.islice(iterator, start))
        if skipped < start:
            raise CheckpointError(
                f"cannot resume: the loop of site {site} yields {skipped} items before the saved "
                f"position {start}; iterables other than range and sequences are fast-forwarded "
                "and must give the same items on every run")
        return iterator

    def _track(self, site: int, iterable: Iterable[Any], start: int,
               iterator: Iterator[Any], window: LoopWindow | None = None) -> Iterator[Any]:
        index = self.index
        items = self.loop_items
        try:
            for i, item in enumerate(iterator, start):
                if window is not None:
                    # the loop has begun: the loaders it draws from are made
                    window.close()
                    self.loop_settles.extend(window.settles)
                    window = None
                index[site] = i
                items[site] = item
                yield item
        finally:
            if window is not None:  # an empty loop
                window.close()
            items.pop(site, None)
            self.loop_iterables.pop(site, None)

    def subject(self, site: int, value: Any) -> Any:
        """A ``match`` subject: kept, so resuming matches the same case."""
        self.subjects[site] = value
        return value

    def replay(self, site: int) -> Any:
        if self.target in self.program.sites.get(site, ()):
            value = self._payload()["subjects"][site]
            self.subjects[site] = value
            return value
        return _NOTHING

    # -- the model's clock through branches
    def mark(self, site: int) -> None:
        """Before a branch whose arms hold chosen hints: remember its slots' counters."""
        if self.run:
            counters = self.counters
            self.marked[site] = {s: counters.get(s, 0) for s in self.program.plan.settle[site]}

    def settle(self, site: int) -> None:
        """After the branch: count every position the model gives its slots, whichever arm
        ran; a checkpoint the schedule placed on a position the run skipped is taken at the
        next chosen hint instead."""
        if not self.run:
            return
        before = self.marked.pop(site, None)
        if before is None:
            return
        for slot, positions in self.program.plan.settle[site].items():
            want = before[slot] + positions
            have = self.counters.get(slot, 0)
            if have < want:
                rule = self.program.plan.slots[slot]
                if any(rule.fires(o) for o in range(have + 1, want + 1)):
                    self.pending = True
                self.counters[slot] = want

    # -- restoring
    def restoring(self, hint: int) -> bool:
        return not self.run and self.target == hint

    def restore(self, hint: int, level: int | None = None) -> tuple[Any, ...]:
        """The saved values of the hint's always-bound names, in the plan's order; with
        ``level``, those of that function of a hosted hint's call stack."""
        frame = sys._getframe(1)
        if level is None:
            values, names = self._values(frame), self.program.hints[hint].save
        else:
            values, names = self._level(frame, level), self.program.hints[hint].outer[level].save
        try:
            return tuple(values[name] for name in names)
        except KeyError as exc:
            raise CheckpointError(f"cannot resume: {exc} was not saved (please report this "
                                  "with the program)") from None

    def saved(self, name: str, level: int | None = None) -> bool:
        values = self.values if level is None else self.levels.get(level)
        return values is not None and name in values

    def value(self, name: str, level: int | None = None) -> Any:
        values = self.values if level is None else self.levels[level]
        assert values is not None
        return values[name]

    def _payload(self) -> dict[str, Any]:
        state = self.state
        assert state is not None
        if state.payload is None:
            raise CheckpointError("cannot resume: the saved values are needed before they can "
                                  "be loaded (please report this with the program)")
        return state.payload

    def _values(self, frame: types.FrameType) -> dict[str, Any]:
        """The hint's own function's saved values, bound against ``frame`` (its frame)."""
        if self.values is None:
            payload = self._load(frame)
            self.values = self._bind(payload["values"], frame,
                                     () if payload.get("outer") else payload["global_names"])
        return self.values

    def _level(self, frame: types.FrameType, level: int) -> dict[str, Any]:
        """The saved values of one function above a hosted hint, bound against its frame."""
        if level not in self.levels:
            payload = self._load(frame)
            self.levels[level] = self._bind(payload["outer"][level], frame,
                                            payload["global_names"] if level == 0 else ())
        return self.levels[level]

    def _load(self, frame: types.FrameType) -> dict[str, Any]:
        """Unpickle the saved state once, its anchors found from the region's ``frame`` (the
        first to ask is always the region's function: the walk starts there)."""
        state = self.state
        assert state is not None
        if state.payload is not None:
            return state.payload
        header = state.header
        scope = frame.f_globals if self.is_module else frame.f_locals
        current: dict[tuple[str, ...], Any] = {}
        for key in header["anchors"]:
            token = tuple(json.loads(key))
            holder = frame.f_globals if token[0] == "g" else scope
            if token[1] not in holder:
                raise CheckpointError(f"cannot resume: `{token[1]}` is not bound when the "
                                      "resumed function starts")
            obj = holder[token[1]]
            if len(token) > 2:
                getter = {"p": "get_parameter", "b": "get_buffer", "m": "get_submodule"}[
                    token[2]]
                obj = getattr(obj, getter)(token[3])
            current[token] = obj
        payload = loads(state.data, current, header["globals"], self.program.state_dir.blob)
        state.payload = payload
        for token_list, saved in payload["anchor_states"]:
            token = tuple(token_list)
            apply_anchor(header["anchors"][json.dumps(token_list)], current[token], saved,
                          token[1])
        self.counters = dict(payload["counters"])
        self.marked = {site: dict(m) for site, m in payload["marked"].items()}
        self.pending = payload["pending"]
        self.index.update(payload["loops"])
        return payload

    def _bind(self, saved_values: Mapping[str, Any], frame: types.FrameType,
              global_list: Iterable[str]) -> dict[str, Any]:
        """Saved values for one frame: a container the frame already holds under the same
        name is updated in place and kept (and so wherever else the value was saved)."""
        scope = frame.f_locals  # a module's: its globals; a hosted hint's function's: its own
        values: dict[str, Any] = dict(saved_values)
        global_names = set(global_list)
        replaced = self.replaced
        for name, saved in list(values.items()):
            holder = frame.f_globals if name in global_names else scope
            if name in holder and holder[name] is not saved and \
                    update_container(holder[name], saved):
                replaced[id(saved)] = holder[name]
                values[name] = holder[name]
        for name, saved in list(values.items()):
            values[name] = replaced.get(id(saved), saved)
        payload = self.state.payload if self.state is not None else None
        if payload is not None and global_names:
            for name in payload["extra_globals"]:
                frame.f_globals[name] = values.pop(name)
        return values

    # -- checkpoints
    def checkpoint(self, hint: int) -> bool:
        """After a chosen hint: save when the schedule says so; True where a walk arrives."""
        if not self.run:
            if hint != self.target:
                return False
            frame = sys._getframe(1)
            self._values(frame)
            for settle in self.loop_settles:
                settle()
            set_rng_state(self._payload()["rng"])
            self.run = True
            self.program.walking.remove(self)
            return True
        info = self.program.hints[hint]
        slot = info.slot
        occurrence = self.counters.get(slot, 0) + 1
        self.counters[slot] = occurrence
        if self.program.plan.slots[slot].fires(occurrence) or self.pending:
            self.pending = False
            start = time.perf_counter()
            self._save(hint, info, sys._getframe(1))
            notify(Saved(number=self.program.saves, hint=hint,
                         seconds=time.perf_counter() - start))
        return False

    def _save(self, hint: int, info: HintSpec, frame: types.FrameType) -> None:
        program = self.program
        _check_nesting(self, frame, info.line)
        # A hosted hint: the frames of the functions above it, the region's first.
        frames = _caller_frames(program, frame, info)
        region_frame = frames[0] if frames else frame
        region = program.plan.regions.get(self.region)
        declared = set(region.declared if region else ())
        global_names: list[str] = []
        extra_globals: list[str] = []
        levels: list[dict[str, Any]] = []
        specs: list[FrameSpec | HintSpec] = [*info.outer, info]
        for level, spec in enumerate(specs):
            at = frames[level] if level < len(frames) else frame
            in_region = at is region_frame
            # A module's locals are its globals; a function's are its own, also where it hosts
            # a hint of the module region (its names are not the module's).
            scope = at.f_locals
            values: dict[str, Any] = {}
            for name in (*spec.save, *spec.maybe):
                holder = at.f_globals if in_region and name in declared else scope
                if name in holder:
                    values[name] = holder[name]
                    if in_region and name in declared:
                        global_names.append(name)
            levels.append(values)
        values = levels[-1]
        for name in info.detach:
            if name in values:
                values[name] = _detached(values[name])
        region_values = levels[0]
        if not self.is_module:
            # Module globals the function may read or change: the module rebuilds them before
            # the function runs again, so they are restored in place (or rebound) on resume.
            for name in (region.globals if region else ()):
                if name in region_frame.f_globals and name not in region_values:
                    region_values[name] = region_frame.f_globals[name]
                    global_names.append(name)
                    extra_globals.append(name)
        anchors, anchor_states = self._anchors(region_values, set(global_names))
        payload = {
            "values": values,
            "outer": levels[:-1],
            "global_names": global_names,
            "extra_globals": extra_globals,
            "anchor_states": anchor_states,
            "rng": rng_state(),
            "loops": {site: self.index[site] for site in info.loops if site in self.index},
            "entry_rng": {site: self.entry_rng[site] for site in info.loops
                          if site in self.entry_rng},
            "loaders": self._loop_origins(info.loops),
            "windows": {site: self.loop_windows[site].origins() for site in info.loops
                        if site in self.loop_windows and site not in self.loop_iterators},
            "positioned": self._positioned(info, levels),
            "file_starts": {site: self.file_starts[site] for site in info.loops
                            if site in self.file_starts},
            "bar_counts": {site: self.bar_counts[site] for site in info.loops
                           if site in self.bar_counts},
            "subjects": {site: self.subjects[site] for site in info.subjects
                         if site in self.subjects},
            "counters": dict(self.counters),
            "marked": dict(self.marked),
            "pending": self.pending,
        }
        try:
            dumped = dumps(payload, anchors, dedup=program.dedup, memo=program.blob_memo)
        except CheckpointError:
            raise
        except Exception as exc:
            every = {name: v for level in levels for name, v in level.items()}
            raise _unsaveable(program, info, every, anchors, anchor_states, exc) from None
        header = {
            "program": program.plan.source, "region": self.region,
            "entry": self.entry, "hint": hint, "globals": dumped.globals,
            "anchors": {json.dumps(list(t)): k for t, k in _token_kinds(anchors, values)},
        }
        program.write(header, dumped.data, dumped.blobs)

    def _positioned(self, info: HintSpec, levels: list[dict[str, Any]]) -> dict[int, Any]:
        """Per loop of the hint over an iterator that is itself saved (``for x in it``, also
        ``enumerate(it)``), the iteration's item: the iterator comes back past it. One iterated
        through another wrapper the loop makes (``zip(it, ys)``) would be skipped twice:
        refused."""
        saved = {id(value) for level in levels for value in level.values()}
        found: dict[int, Any] = {}
        for site in info.loops:
            iterable = self.loop_iterables.get(site)
            if iterable is None or site not in self.loop_items:
                continue
            if id(iterable) in saved and hasattr(iterable, "__next__"):
                found[site] = ("iterator", self.loop_items[site])
            elif type(iterable) is enumerate and id(inner := enumerated(iterable)[0]) in saved \
                    and hasattr(inner, "__next__"):
                found[site] = ("enumerate", self.loop_items[site])
            elif type(iterable) in (enumerate, zip, map, filter):
                inner = iterable.__reduce__()[1]
                if any(id(part) in saved for part in inner if hasattr(part, "__next__")):
                    raise CheckpointError(
                        f"{self.program.where(info.line)}: cannot save this checkpoint: its loop "
                        f"iterates a saved iterator through {type(iterable).__name__}(), which "
                        "the resume cannot put back where it stood; iterate the iterator "
                        "itself, or the loader or sequence it comes from")
        return found

    def _loop_origins(self, loops: Iterable[int]) -> dict[int, Any]:
        """Per loop of the hint over a DataLoader, the random states its iterator was made
        from: its resume re-creates the iterator rather than iterate the restored loader."""
        origins: dict[int, Any] = {}
        for site in loops:
            ref = self.loop_iterators.get(site)
            iterator = ref() if ref is not None else None
            if iterator is not None:
                origins[site] = loop_origin(iterator)
        return origins

    def _anchors(self, values: Mapping[str, Any], global_names: set[str]
                 ) -> tuple[dict[int, tuple[str, ...]], list[tuple[list[str], Any]]]:
        """Saved values the resumed program rebuilds by itself: restored in place."""
        anchors: dict[int, tuple[str, ...]] = {}
        states: list[tuple[list[str], Any]] = []
        if self.is_module:
            return anchors, states
        for name, obj in values.items():
            if name in global_names:
                where = "g"
            elif name in self.entry_objects and self.entry_objects[name] is obj:
                where = "l"
            else:
                continue
            kind = anchor_kind(obj)
            if kind is None or id(obj) in anchors:
                continue
            token = (where, name)
            anchors[id(obj)] = token
            states.append((list(token), anchor_state(kind, obj)))
            if kind == "module":
                for tag, items in (("p", obj.named_parameters()), ("b", obj.named_buffers()),
                                   ("m", obj.named_modules())):
                    for qual, sub in items:
                        if qual and id(sub) not in anchors:
                            anchors[id(sub)] = (where, name, tag, qual)
        return anchors, states


def _token_kinds(anchors: Mapping[int, tuple[str, ...]], values: Mapping[str, Any]
                 ) -> Iterator[tuple[tuple[str, ...], str]]:
    by_name = {name: obj for name, obj in values.items()}
    for token in anchors.values():
        if len(token) == 2:
            kind = anchor_kind(by_name[token[1]])
            assert kind is not None
            yield token, kind
        else:
            yield token, "sub"


def _detached(value: Any) -> Any:
    """A tensor that is part of an autograd graph, detached (the analysis found that no later
    read of its variable needs the graph); a tuple of such values (an LSTM's hidden state), its
    tensors detached; any other value as it is. Lists are left alone: one another variable may
    hold too must stay one list, so a graph in it is refused at the save."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach() if value.grad_fn is not None else value
    if type(value) is tuple:
        items = tuple(_detached(item) for item in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def _caller_frames(program: Program, frame: types.FrameType, info: HintSpec
                   ) -> list[types.FrameType]:
    """The frames of the functions above a hosted hint's own, outermost first: each is the
    caller of the next, as the plan says (a wrapper in between would make the resume call the
    function with other arguments than the saved ones)."""
    frames: list[types.FrameType] = []
    at = frame
    for spec in reversed(info.outer):
        caller = at.f_back
        # The plan names nested functions as the source does (``main.epoch``), Python as
        # ``main.<locals>.epoch``.
        if caller is None or caller.f_code.co_qualname.replace("<locals>.", "") != spec.function:
            raise CheckpointError(
                f"{program.where(info.line)}: this checkpoint's function was not called "
                f"directly by {spec.function}() (found "
                f"{caller.f_code.co_qualname if caller else 'nothing'}()): a resume could not "
                "call it again as it was called; transform the program again")
        frames.insert(0, caller)
        at = caller
    return frames


def _check_nesting(activation: Activation, frame: types.FrameType, line: int) -> None:
    outer = frame.f_back
    while outer is not None:
        if outer.f_code.co_name == "<module>":
            other = outer.f_globals.get("_ecrl")
        else:
            other = outer.f_locals.get("_ecrl")
        if isinstance(other, Activation) and other is not activation:
            raise CheckpointError(
                f"{activation.program.where(line)}: a checkpoint in {activation.region} while "
                f"{other.region}, which checkpoints too, is running: a resumed program can "
                "continue only one of them; keep the hints of one of the two")
        outer = outer.f_back


def _unsaveable(program: Program, info: HintSpec, values: Mapping[str, Any],
                anchors: dict[int, tuple[str, ...]],
                anchor_states: list[tuple[list[str], Any]], exc: Exception) -> CheckpointError:
    """Name the value that could not be saved (the payload failed as a whole): a live name, or
    an attribute of an object restored in place (``self.loss``, which a trainer holds)."""
    where = program.where(info.line)
    for name, obj in values.items():
        try:
            dumps({"value": obj}, anchors)
        except Exception as inner:
            kind = type(obj).__name__
            advice = ("define it with `def` inside the function (definitions are re-created on "
                      "resume)" if isinstance(obj, types.FunctionType) else
                      "create it after the checkpoint, or move the hint to where it is not "
                      "live")
            return CheckpointError(f"{where}: cannot save `{name}` (a {kind}) at this "
                                   f"checkpoint: {inner}; {advice}")
    for token, state in anchor_states:
        attributes = state.items() if isinstance(state, dict) else [(None, state)]
        for attribute, obj in attributes:
            try:
                dumps({"value": obj}, anchors)
            except Exception as inner:
                what = token[1] if attribute is None else f"{token[1]}.{attribute}"
                return CheckpointError(
                    f"{where}: cannot save `{what}` (a {type(obj).__name__}) at this "
                    f"checkpoint: {inner}; set it after the checkpoint, or move the hint to "
                    "where it does not hold that")
    return CheckpointError(f"{where}: cannot save the live values at this checkpoint: "
                           f"{type(exc).__name__}: {exc}")
