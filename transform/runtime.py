"""What a program written by ``ecrl-transform`` imports: checkpoints, and resuming from them.

A transformed program carries a *plan* (the chosen hints, what each saves, the firing rules) and
calls this module at a few places:

* ``_ECRL = Program(__file__, plan)`` once, and ``_ecrl = _ECRL.enter(region)`` at the start of
  the module's top level and of each function that checkpoints. ``enter`` counts the region's
  entries; the entry that a saved resume state belongs to comes back *walking*: ``_ecrl.run`` is
  False, and the generated guards skip every statement before the saved point.
* While walking, the headers on the way to the saved point steer: ``_ecrl.loop(k)(iterable)``
  restarts a ``for`` loop at the saved iteration (``range`` and sequences by index, any other
  iterable fast-forwarded after restoring the random state it was created under),
  ``_ecrl.into(k)`` enters the ``if`` arm / ``while`` body / ``match`` case that holds the saved
  point, ``with`` statements are re-entered. ``_ecrl.restore(h)`` (just before the outermost
  statement holding the saved point, and again at the point) binds the saved values.
* ``_ecrl.checkpoint(h)`` after each chosen ``_checkpoint()``: counts the slot's executions and,
  when the schedule says so, saves; when walking, it is where the walk arrives (random states are
  restored last, so nothing the walk does disturbs them).

What is saved: every live value in one serialization, so objects shared between variables stay
shared; random states (``random``, NumPy's global state, torch CPU and CUDA); loop positions; slot
counters. Inside a function, values that exist before the function runs — its parameters and the
module globals it may read — are *anchors*: on resume they are restored in place into the objects
the program rebuilt (``load_state_dict`` for modules, optimizers, schedulers; element-wise for
arrays, tensors, lists, dicts and sets; generator states; plain objects' ``__dict__``), and other
saved values that referred to them (an optimizer's parameters) refer to the rebuilt objects.

The resume state is one file, ``resume.ckpt``, in ``ECRL_CKPT_DIR`` (else the directory given by
``--ckpt-dir`` at transform time, else ``.ecrl-ckpt/<script stem>/`` under the working
directory), written with :mod:`ecrl.contract.atomicio`'s protocol by rank 0 only (``RANK``),
checked by a SHA-256 of its payload and of the program it belongs to, and removed when the program
ends normally. torch is imported only when the program has imported it itself.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import io
import itertools
import json
import os
import pickle
import random
import signal
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from ecrl.contract.atomicio import atomic_write_bytes, fsync_dir
from transform._firing import fires

__all__ = ["Program", "Activation", "CheckpointError", "STATE_FILE", "DEFAULT_ROOT"]

STATE_FILE = "resume.ckpt"
DEFAULT_ROOT = ".ecrl-ckpt"
_MAGIC = b"ECRL-RESUME\n"
_FORMAT = 1
KILL_ENV = "ECRL_TRANSFORM_KILL_AT"
"""Failure injection for tests: ``N`` (SIGKILL right after the N-th save of this process) or
``N:POINT`` (during the N-th save, at an :data:`ecrl.contract.atomicio.CRASH_POINTS` step)."""


class CheckpointError(SystemExit):
    """A checkpoint cannot be taken or resumed; ends the program with one line (exit 1)."""

    def __init__(self, message: str) -> None:
        _ExitWatch.failed = True  # a failed run keeps its resume state
        super().__init__(f"ecrl-transform: {message}")


# --------------------------------------------------------------------------- random states


def _rng_state() -> dict[str, Any]:
    """Every global random state the program can have touched (numpy, torch only if loaded)."""
    state: dict[str, Any] = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["random"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state:
            torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- serialization

# While one payload is written or read: anchors by object id (dump) and their current objects
# by token (load). Module-level because torch.save builds its own pickler from our class.
_DUMP_ANCHORS: dict[int, tuple[str, ...]] = {}
_LOAD_ANCHORS: dict[tuple[str, ...], Any] = {}


def _anchor(token: tuple[str, ...]) -> Any:
    """Unpickling an anchor gives the object the resumed program rebuilt."""
    try:
        return _LOAD_ANCHORS[token]
    except KeyError:
        raise CheckpointError(f"cannot resume: {_describe(token)} no longer exists in the "
                              "rebuilt program") from None


def _describe(token: tuple[str, ...]) -> str:
    if len(token) == 2:
        return f"`{token[1]}`"
    kind = {"p": "parameter", "b": "buffer", "m": "submodule"}[token[2]]
    return f"{kind} `{token[3]}` of `{token[1]}`"


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        token = _DUMP_ANCHORS.get(id(obj))
        if token is not None:
            return _anchor, (token,)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    pass


def _pickle_module() -> types.ModuleType:
    module = types.ModuleType("transform._runtime_pickle")
    module.Pickler = _Pickler  # type: ignore[attr-defined]
    module.Unpickler = _Unpickler  # type: ignore[attr-defined]
    module.load = pickle.load  # type: ignore[attr-defined]
    module.dump = pickle.dump  # type: ignore[attr-defined]
    return module


def _dumps(payload: Any, anchors: dict[int, tuple[str, ...]]) -> tuple[str, bytes]:
    _DUMP_ANCHORS.clear()
    _DUMP_ANCHORS.update(anchors)
    buf = io.BytesIO()
    try:
        if "torch" in sys.modules:
            import torch

            torch.save(payload, buf, pickle_module=_pickle_module())
            return "torch", buf.getvalue()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
        return "pickle", buf.getvalue()
    finally:
        _DUMP_ANCHORS.clear()


def _loads(kind: str, data: bytes, anchors: dict[tuple[str, ...], Any]) -> Any:
    _LOAD_ANCHORS.clear()
    _LOAD_ANCHORS.update(anchors)
    try:
        if kind == "torch":
            import torch

            return torch.load(io.BytesIO(data), pickle_module=_pickle_module(),
                              weights_only=False)
        return _Unpickler(io.BytesIO(data)).load()
    finally:
        _LOAD_ANCHORS.clear()


# --------------------------------------------------------------------------- in-place restore


def _has_state_dict(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)) and not isinstance(obj, type)


def _plain_object(obj: Any) -> bool:
    cls = type(obj)
    return (hasattr(obj, "__dict__") and not isinstance(obj, type | types.ModuleType
                                                        | types.FunctionType)
            and cls.__module__ not in ("builtins",)
            and cls.__reduce_ex__ is object.__reduce_ex__
            and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
            and getattr(cls, "__setstate__", None) is None and not hasattr(cls, "__slots__"))


def _anchor_kind(obj: Any) -> str | None:
    """How an object can be restored in place, or None (then it is rebound)."""
    module = type(obj).__module__
    if _has_state_dict(obj):
        if callable(getattr(obj, "named_modules", None)) and hasattr(obj, "training"):
            return "module"
        return "state_dict"
    if isinstance(obj, random.Random):
        return "random"
    if module.startswith("numpy"):
        np = sys.modules["numpy"]
        if isinstance(obj, np.ndarray):
            return "array"
        if isinstance(obj, np.random.Generator):
            return "np_generator"
        if isinstance(obj, np.random.RandomState):
            return "np_randomstate"
        return None
    if module.startswith("torch"):
        torch = sys.modules["torch"]
        if isinstance(obj, torch.Tensor):
            return "tensor"
        if isinstance(obj, torch.Generator):
            return "torch_generator"
        return None
    if _plain_object(obj):
        return "object"
    return None


def _anchor_state(kind: str, obj: Any) -> Any:
    if kind == "module":
        return obj.state_dict(), [(name, m.training) for name, m in obj.named_modules()]
    if kind == "state_dict":
        return obj.state_dict()
    if kind == "random":
        return obj.getstate()
    if kind == "array":
        return obj.view()  # a new object over the same data: pickled as data, not as the anchor
    if kind == "np_generator":
        return obj.bit_generator.state
    if kind == "np_randomstate":
        return obj.get_state()
    if kind == "tensor":
        return obj.detach(), obj.grad
    if kind == "torch_generator":
        return obj.get_state()
    return obj.__dict__


def _apply_anchor(kind: str, current: Any, state: Any, what: str) -> None:
    if _anchor_kind(current) != kind:
        raise CheckpointError(f"cannot resume: `{what}` is now a {type(current).__name__}, "
                              "not what was saved")
    if kind == "module":
        weights, flags = state
        current.load_state_dict(weights)
        modes = dict(flags)
        for name, m in current.named_modules():
            if name in modes:
                m.training = modes[name]
    elif kind == "state_dict":
        current.load_state_dict(state)
    elif kind == "random":
        current.setstate(state)
    elif kind == "array":
        if current.shape != state.shape or current.dtype != state.dtype:
            raise CheckpointError(f"cannot resume: array `{what}` is now {current.shape} "
                                  f"{current.dtype}, it was saved as {state.shape} {state.dtype}")
        current[...] = state
    elif kind == "np_generator":
        current.bit_generator.state = state
    elif kind == "np_randomstate":
        current.set_state(state)
    elif kind == "tensor":
        import torch

        data, grad = state
        with torch.no_grad():
            if current.shape != data.shape:
                current.data = data.clone()
            else:
                current.copy_(data)
        current.grad = grad
    elif kind == "torch_generator":
        current.set_state(state)
    else:
        current.__dict__.clear()
        current.__dict__.update(state)


def _update_container(current: Any, saved: Any) -> bool:
    """Restore a list, dict or set in place (keeping the object others hold); False if not one."""
    if type(current) is not type(saved):
        return False
    if isinstance(current, list):
        current[:] = saved
    elif isinstance(current, dict | set):
        current.clear()
        current.update(saved)
    elif isinstance(current, bytearray):
        current[:] = saved
    else:
        return False
    return True


# --------------------------------------------------------------------------- the resume state


class _State:
    """A resume state read from disk: the header now, the values when the walk needs them."""

    def __init__(self, header: dict[str, Any], data: bytes) -> None:
        self.header = header
        self.data = data
        self.region: str = header["region"]
        self.entry: int = header["entry"]
        self.hint: int = header["hint"]
        self.payload: dict[str, Any] | None = None


def _read_state(path: Path, source: str) -> _State | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    what = f"{path} is not a resume state this program can use"
    if not raw.startswith(_MAGIC):
        raise CheckpointError(f"{what} (unknown format); remove it to start over")
    rest = raw[len(_MAGIC):]
    newline = rest.find(b"\n")
    try:
        header = json.loads(rest[:newline])
    except ValueError:
        raise CheckpointError(f"{what} (damaged header); remove it to start over") from None
    data = rest[newline + 1:]
    if header.get("format") != _FORMAT:
        raise CheckpointError(f"{what} (format {header.get('format')}); remove it to start over")
    if hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise CheckpointError(f"{path} is damaged (checksum mismatch): it is never loaded; remove "
                              "it to start over")
    if header.get("program") != source:
        raise CheckpointError(f"{path} was written by a different version of this program; "
                              "remove it to start over (or run the version that wrote it)")
    return _State(header, data)


def _directory(file: str, configured: str | None) -> Path:
    env = os.environ.get("ECRL_CKPT_DIR")
    if env:
        return Path(env)
    if configured:
        return Path(configured)
    return Path(DEFAULT_ROOT) / Path(file).stem


# --------------------------------------------------------------------------- program, regions


class Program:
    """One transformed program: its plan, its resume state, its regions' entries."""

    def __init__(self, file: str, plan: Mapping[str, Any]) -> None:
        self.file = file
        self.plan = plan
        self.hints: Mapping[int, Mapping[str, Any]] = plan["hints"]
        self.sites: Mapping[int, frozenset[int]] = {
            k: frozenset(v) for k, v in plan["sites"].items()}
        self.ranges = frozenset(plan.get("ranges", ()))
        self.settle: Mapping[int, Mapping[int, int]] = plan.get("settle", {})
        self.slots: dict[int, dict[str, Any]] = {}
        for slot, rule in plan["slots"].items():
            rule = dict(rule)
            rule["occurrences"] = frozenset(rule.get("occurrences", ()))
            self.slots[slot] = rule
        self.directory = _directory(file, plan.get("ckpt_dir"))
        self.path = self.directory / STATE_FILE
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.entries: dict[str, int] = {}
        self.pending = _read_state(self.path, plan["source"])
        self.walking: list[Activation] = []
        self.saves = 0
        self.kill_at = _parse_kill(os.environ.get(KILL_ENV))
        _ExitWatch.install(self)

    def enter(self, region: str) -> Activation:
        entry = self.entries.get(region, 0) + 1
        self.entries[region] = entry
        state = self.pending
        if state is not None and state.region == region and state.entry == entry:
            self.pending = None
            return Activation(self, region, entry, state, sys._getframe(1))
        return Activation(self, region, entry, None, sys._getframe(1))

    # -- writing
    def write(self, header: dict[str, Any], data: bytes) -> None:
        self.saves += 1
        hook: Callable[[str], None] | None = None
        kill = self.kill_at
        if kill is not None and kill[0] == self.saves and kill[1] != "after":
            point = kill[1]

            def hook(step: str) -> None:
                if step == point:
                    os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == 0:
            head = json.dumps(header, sort_keys=True).encode()
            atomic_write_bytes(self.path, _MAGIC + head + b"\n" + data, hook=hook)
        if kill is not None and kill == (self.saves, "after"):
            os.kill(os.getpid(), signal.SIGKILL)

    def complete(self) -> None:
        """The program ended normally: its resume state is spent."""
        if self.rank != 0:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)
        for stale in self.directory.glob(f".{STATE_FILE}.*.tmp"):
            stale.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # only when nothing else lives there
            if self.directory.parent.name == DEFAULT_ROOT:
                self.directory.parent.rmdir()


def _parse_kill(value: str | None) -> tuple[int, str] | None:
    if not value:
        return None
    count, _, point = value.partition(":")
    return int(count), point or "after"


class _ExitWatch:
    """Removes the resume state when the process ends normally, and only then.

    Normal: no uncaught exception (``sys.excepthook``) and no ``sys.exit`` with a failing status.
    A walk that never arrived is a bug worth a loud exit, never a silent success.
    """

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
        for program in cls.programs:
            stuck = [a for a in program.walking if not a.run]
            if stuck:
                a = stuck[0]
                line = program.hints[a.target]["line"]
                sys.stderr.write(f"ecrl-transform: {program.file}: resuming never reached the "
                                 f"checkpoint at line {line}; the output of this run is not "
                                 "valid (please report this with the program)\n")
                sys.stderr.flush()
                os._exit(70)
        if cls.failed:
            return
        for program in cls.programs:
            program.complete()


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
                 "pending")

    SKIP = SKIP

    def __init__(self, program: Program, region: str, entry: int, state: _State | None,
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
        self.subjects: dict[int, Any] = {}
        self.marked: dict[int, dict[int, int]] = {}
        self.pending = False
        self.values: dict[str, Any] | None = None
        self.is_module = region == "<module>"
        info = program.plan["regions"].get(region, {})
        scope = frame.f_locals
        # The parameters' objects as the caller passed them: saved values identical to these
        # are restored in place on resume, into the objects the caller rebuilds.
        self.entry_objects = {name: scope[name] for name in info.get("params", ())
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
            if site not in self.program.ranges:
                # The iterable may draw random numbers when it is created or iterated (a
                # shuffling loader): a fast-forward replays them from this state.
                self.entry_rng[site] = _rng_state()
            return lambda iterable: self._track(site, iterable, 0, iter(iterable))
        if self.target not in self.program.sites.get(site, ()):
            return lambda iterable: iter(())
        payload = self._payload()
        start = payload["loops"][site]
        entry_state = payload["entry_rng"].get(site)
        if entry_state is not None:
            _set_rng_state(entry_state)
            self.entry_rng[site] = entry_state
        return lambda iterable: self._track(site, iterable, start, self._seek(site, iterable,
                                                                              start))

    def _seek(self, site: int, iterable: Iterable[Any], start: int) -> Iterator[Any]:
        if isinstance(iterable, range | list | tuple | str | bytes):
            return iter(iterable[start:])
        iterator = iter(iterable)
        skipped = sum(1 for _ in itertools.islice(iterator, start))
        if skipped < start:
            raise CheckpointError(
                f"cannot resume: the loop of site {site} yields {skipped} items before the saved "
                f"position {start}; iterables other than range and sequences are fast-forwarded "
                "and must give the same items on every run")
        return iterator

    def _track(self, site: int, iterable: Iterable[Any], start: int,
               iterator: Iterator[Any]) -> Iterator[Any]:
        index = self.index
        for i, item in enumerate(iterator, start):
            index[site] = i
            yield item

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
            self.marked[site] = {s: counters.get(s, 0) for s in self.program.settle[site]}

    def settle(self, site: int) -> None:
        """After the branch: count every position the model gives its slots, whichever arm
        ran; a checkpoint the schedule placed on a position the run skipped is taken at the
        next chosen hint instead."""
        if not self.run:
            return
        before = self.marked.pop(site, None)
        if before is None:
            return
        for slot, positions in self.program.settle[site].items():
            want = before[slot] + positions
            have = self.counters.get(slot, 0)
            if have < want:
                rule = self.program.slots[slot]
                if any(fires(rule, o) for o in range(have + 1, want + 1)):
                    self.pending = True
                self.counters[slot] = want

    # -- restoring
    def restoring(self, hint: int) -> bool:
        return not self.run and self.target == hint

    def restore(self, hint: int) -> tuple[Any, ...]:
        """The saved values of the hint's always-bound names, in the plan's order."""
        values = self._values(sys._getframe(1))
        try:
            return tuple(values[name] for name in self.program.hints[hint]["save"])
        except KeyError as exc:
            raise CheckpointError(f"cannot resume: {exc} was not saved (please report this "
                                  "with the program)") from None

    def saved(self, name: str) -> bool:
        return self.values is not None and name in self.values

    def value(self, name: str) -> Any:
        assert self.values is not None
        return self.values[name]

    def _payload(self) -> dict[str, Any]:
        state = self.state
        assert state is not None
        if state.payload is None:
            raise CheckpointError("cannot resume: the saved values are needed before they can "
                                  "be loaded (please report this with the program)")
        return state.payload

    def _values(self, frame: types.FrameType) -> dict[str, Any]:
        if self.values is not None:
            return self.values
        state = self.state
        assert state is not None
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
        payload = _loads(header["kind"], state.data, current)
        state.payload = payload
        for token_list, saved in payload["anchor_states"]:
            token = tuple(token_list)
            _apply_anchor(header["anchors"][json.dumps(token_list)], current[token], saved,
                          token[1])
        values: dict[str, Any] = dict(payload["values"])
        global_names = set(payload["global_names"])
        replaced: dict[int, Any] = {}
        for name, saved in list(values.items()):
            holder = frame.f_globals if name in global_names else scope
            if name in holder and holder[name] is not saved and \
                    _update_container(holder[name], saved):
                replaced[id(saved)] = holder[name]
                values[name] = holder[name]
        for name, saved in list(values.items()):
            values[name] = replaced.get(id(saved), saved)
        for name in payload["extra_globals"]:
            frame.f_globals[name] = values.pop(name)
        self.counters = dict(payload["counters"])
        self.marked = {site: dict(m) for site, m in payload["marked"].items()}
        self.pending = payload["pending"]
        self.index.update(payload["loops"])
        self.values = values
        return values

    # -- checkpoints
    def checkpoint(self, hint: int) -> bool:
        """After a chosen hint: save when the schedule says so; True where a walk arrives."""
        if not self.run:
            if hint != self.target:
                return False
            frame = sys._getframe(1)
            self._values(frame)
            _set_rng_state(self._payload()["rng"])
            self.run = True
            self.program.walking.remove(self)
            return True
        info = self.program.hints[hint]
        slot = info["slot"]
        occurrence = self.counters.get(slot, 0) + 1
        self.counters[slot] = occurrence
        if fires(self.program.slots[slot], occurrence) or self.pending:
            self.pending = False
            self._save(hint, info, sys._getframe(1))
        return False

    def _save(self, hint: int, info: Mapping[str, Any], frame: types.FrameType) -> None:
        program = self.program
        _check_nesting(self, frame)
        scope = frame.f_globals if self.is_module else frame.f_locals
        region = program.plan["regions"].get(self.region, {})
        declared = set(region.get("declared", ()))
        values: dict[str, Any] = {}
        global_names: list[str] = []
        extra_globals: list[str] = []
        for name in (*info["save"], *info["maybe"]):
            holder = frame.f_globals if name in declared else scope
            if name in holder:
                values[name] = holder[name]
                if name in declared:
                    global_names.append(name)
        if not self.is_module:
            # Module globals the function may read or change: the module rebuilds them before
            # the function runs again, so they are restored in place (or rebound) on resume.
            for name in region.get("globals", ()):
                if name in frame.f_globals and name not in values:
                    values[name] = frame.f_globals[name]
                    global_names.append(name)
                    extra_globals.append(name)
        anchors, anchor_states = self._anchors(values, set(global_names))
        payload = {
            "values": values,
            "global_names": global_names,
            "extra_globals": extra_globals,
            "anchor_states": anchor_states,
            "rng": _rng_state(),
            "loops": {site: self.index[site] for site in info["loops"] if site in self.index},
            "entry_rng": {site: self.entry_rng[site] for site in info["loops"]
                          if site in self.entry_rng},
            "subjects": {site: self.subjects[site] for site in info["subjects"]
                         if site in self.subjects},
            "counters": dict(self.counters),
            "marked": dict(self.marked),
            "pending": self.pending,
        }
        try:
            kind, data = _dumps(payload, anchors)
        except Exception as exc:
            raise _unsaveable(program, hint, info, values, anchors, exc) from None
        header = {
            "format": _FORMAT, "program": program.plan["source"], "region": self.region,
            "entry": self.entry, "hint": hint, "kind": kind,
            "sha256": hashlib.sha256(data).hexdigest(),
            "anchors": {json.dumps(list(t)): k for t, k in _token_kinds(anchors, values)},
        }
        program.write(header, data)

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
            kind = _anchor_kind(obj)
            if kind is None or id(obj) in anchors:
                continue
            token = (where, name)
            anchors[id(obj)] = token
            states.append((list(token), _anchor_state(kind, obj)))
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
            kind = _anchor_kind(by_name[token[1]])
            assert kind is not None
            yield token, kind
        else:
            yield token, "sub"


def _check_nesting(activation: Activation, frame: types.FrameType) -> None:
    outer = frame.f_back
    while outer is not None:
        if outer.f_code.co_name == "<module>":
            other = outer.f_globals.get("_ecrl")
        else:
            other = outer.f_locals.get("_ecrl")
        if isinstance(other, Activation) and other is not activation:
            raise CheckpointError(
                f"{activation.program.file}: a checkpoint in {activation.region} while "
                f"{other.region}, which checkpoints too, is running: a resumed program can "
                "continue only one of them; keep the hints of one of the two")
        outer = outer.f_back


def _unsaveable(program: Program, hint: int, info: Mapping[str, Any], values: Mapping[str, Any],
                anchors: dict[int, tuple[str, ...]], exc: Exception) -> CheckpointError:
    """Name the value that could not be saved (the payload failed as a whole)."""
    line = info["line"]
    for name, obj in values.items():
        try:
            _dumps({"value": obj}, anchors)
        except Exception as inner:
            kind = type(obj).__name__
            advice = ("define it with `def` inside the function (definitions are re-created on "
                      "resume)" if isinstance(obj, types.FunctionType) else
                      "create it after the checkpoint, or move the hint to where it is not "
                      "live")
            return CheckpointError(f"{program.file}:{line}: cannot save `{name}` (a {kind}) at "
                                   f"this checkpoint: {inner}; {advice}")
    return CheckpointError(f"{program.file}:{line}: cannot save the live values at this "
                           f"checkpoint: {type(exc).__name__}: {exc}")
