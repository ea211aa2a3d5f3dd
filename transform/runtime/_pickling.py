"""Anchored pickling: one serialization of the saved values, and a restricted way back.

One pickle holds every saved value, so objects shared between variables stay shared. Around
Python's pickle protocol:

* **Anchors** — values the resumed program rebuilds by itself (a function's parameters, module
  globals) — are written as a token; unpickling gives the rebuilt object, so saved values that
  referred to them (an optimizer holding a model's parameters) refer to the rebuilt ones.
* **Functions and classes** the program defines at its top level are written by name and come
  back as the program's own re-created definitions; closures and lambdas are written by value
  with ``cloudpickle``, their globals bound to the running program's namespace. Their code must
  be the program's own, or that of the imported module they were made in (a library's closures,
  such as micrograd's ``Value._backward``, bound to that module's namespace): on load every code
  object is checked against the compiled source of the program or of an imported module, so a
  resume state cannot bring code of its own.
* **torch tensors** go through their own reduction, with ``.grad`` added (a checkpoint between
  ``backward()`` and ``step()`` holds accumulated gradients); their storages, large NumPy arrays
  and large strings are *blobs*: raw bytes kept apart, named by their SHA-256 (see
  :mod:`transform.runtime._statefile`, which writes each distinct blob once).
* **NumPy arrays** (:mod:`transform.runtime._arrays`): a view is written as a reference to the
  array that owns its memory, which is written once, so views come back sharing memory as they
  did; a large list or tuple of arrays, numbers, or tuples and lists of them is one *table*,
  written in a few vectorized passes instead of element by element.
* **Loading is restricted**: only the globals recorded at save time (in the checksummed
  header), never one from :data:`_DENIED` (process, file, import and eval primitives), whatever
  the header says. A value whose save would need one of those is refused at its first save.

A tensor inside an autograd graph is refused (torch would save it as a leaf, and a
``backward()`` after the resume would silently reach nothing).
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import pickletools
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import cloudpickle

from transform.runtime._arrays import TABLE_MIN, ArrayContent, Raw, TableReader, TableWriter
from transform.runtime._exit import CheckpointError
from transform.runtime._resources import reduce_resource

__all__ = ["BlobMemo", "Dumped", "dumps", "loads", "describe", "BLOB_MIN_BYTES"]

BLOB_MIN_BYTES = 64 * 1024
"""Arrays and strings at least this large are kept apart and saved once while unchanged."""

# Module prefixes and globals a resume state never loads: each runs code, a process, or reads
# and writes files given the right arguments.
_DENIED_MODULES = ("os", "posix", "nt", "subprocess", "sys", "shutil", "pty", "socket",
                   "importlib", "runpy", "code", "codeop", "ctypes", "multiprocessing", "pickle",
                   "_pickle", "marshal", "webbrowser", "tempfile", "shelve", "dbm", "signal",
                   "threading", "_thread", "pdb", "bdb", "inspect", "gc", "_posixsubprocess",
                   "pydoc", "platform", "asyncio", "select", "urllib", "http", "ftplib")
_DENIED = frozenset({
    ("builtins", n) for n in ("eval", "exec", "compile", "__import__", "open", "getattr",
                              "setattr", "delattr", "globals", "locals", "vars", "breakpoint",
                              "input", "exit", "quit", "help", "__build_class__")
} | {
    ("torch", "load"), ("torch.serialization", "load"), ("torch.storage", "_load_from_bytes"),
    ("torch.hub", "load"), ("numpy", "load"), ("numpy", "loadtxt"), ("numpy", "fromfile"),
    ("numpy.lib.npyio", "load"), ("numpy", "genfromtxt"), ("numpy.lib.format", "read_array"),
})


def denied(module: str, name: str) -> bool:
    """A global a resume state may not import; with ``name`` empty, a module it may not hold
    (``builtins`` itself: its attributes are eval and exec)."""
    if not name and module == "builtins":
        return True
    return (module, name) in _DENIED or module.split(".")[0] in _DENIED_MODULES


class _Context:
    """What one payload's writing or reading needs to know (module-level: reconstructors are
    plain functions that pickle finds by name)."""

    dump_anchors: ClassVar[dict[int, tuple[str, ...]]] = {}
    load_anchors: ClassVar[dict[tuple[str, ...], Any]] = {}
    program_globals: ClassVar[dict[str, Any] | None] = None
    program_codes: ClassVar[frozenset[types.CodeType] | None] = None
    program_file: ClassVar[str] = ""


def set_program(namespace: dict[str, Any], file: str) -> None:
    """The running program's globals: definitions are found there, closures bound to it."""
    _Context.program_globals = namespace
    _Context.program_file = file
    _Context.program_codes = None


# --------------------------------------------------------------------------- reconstructors


def _anchor(token: tuple[str, ...]) -> Any:
    """Unpickling an anchor gives the object the resumed program rebuilt."""
    try:
        return _Context.load_anchors[token]
    except KeyError:
        raise CheckpointError(f"cannot resume: {describe(token)} no longer exists in the "
                              "rebuilt program") from None


def describe(token: tuple[str, ...]) -> str:
    if len(token) == 2:
        return f"`{token[1]}`"
    kind = {"p": "parameter", "b": "buffer", "m": "submodule"}[token[2]]
    return f"{kind} `{token[3]}` of `{token[1]}`"


def _module(name: str) -> types.ModuleType:
    """A module held in a variable: the one the program imported."""
    if denied(name, ""):
        raise pickle.UnpicklingError(f"a resume state may not hold the module {name}")
    module = sys.modules.get(name)
    if module is None:
        import importlib

        module = importlib.import_module(name)
    return module


def _attribute(obj: Any, name: str) -> Any:
    """``getattr`` for enum members and bound methods: never a private attribute (but
    ``__new__``), never one of the refused callables or modules."""
    if not isinstance(name, str) or (name.startswith("_") and name != "__new__"):
        raise pickle.UnpicklingError(f"it looks up the attribute {name!r}")
    found = getattr(obj, name)
    if isinstance(found, types.ModuleType):
        module, qual = found.__name__, ""
    elif isinstance(found, type | types.FunctionType | types.BuiltinFunctionType):
        module, qual = getattr(found, "__module__", None) or "", found.__qualname__
    else:
        return found
    if denied(module, qual):
        raise pickle.UnpicklingError(f"it refers to {module}.{qual}, which a resume state may "
                                     "not call")
    return found


def _program_definition(qualname: str) -> Any:
    """A function or class defined at the program's top level: its re-created definition."""
    namespace = _Context.program_globals or {}
    if qualname not in namespace:
        raise CheckpointError(f"cannot resume: `{qualname}` is not defined when the saved values "
                              "are restored")
    return namespace[qualname]


def _program_globals() -> dict[str, Any]:
    assert _Context.program_globals is not None
    return _Context.program_globals


class _ProgramGlobals:
    """Stands for the running program's namespace in a function saved by value."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _program_globals, ()


_PROGRAM_GLOBALS = _ProgramGlobals()


class _ModuleGlobals:
    """Stands for an imported module's namespace in a closure of that module saved by value
    (micrograd's ``Value._backward``): on resume, the module the program imported again."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return _module_globals, (self.name,)


def _module_globals(name: str) -> dict[str, Any]:
    return vars(_module(name))


def _set_program_function_state(func: Any, state: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """cloudpickle's function state, except that the program's globals are never overwritten
    with the values the function saw at save time (the resumed program has its own)."""
    own, slots = state
    slots = dict(slots)
    for name, value in slots.pop("__globals__").items():
        func.__globals__.setdefault(name, value)
    slots["__globals__"] = {}
    cloudpickle.cloudpickle._function_setstate(func, (own, slots))


def _set_state_and_grad(obj: Any, state: tuple[Any, Any]) -> None:
    """Unpickling a tensor that had a gradient: its own state as pickle would set it, then
    ``.grad`` (which a tensor's own reduction leaves out)."""
    own, grad = state
    if own is not None:
        setstate = getattr(obj, "__setstate__", None)
        if setstate is not None:
            setstate(own)
        else:
            obj.__dict__.update(own)
    obj.grad = grad


def _optimizer(cls: Any, groups: list[dict[str, Any]], kwargs: dict[str, Any],
               defaults: dict[str, Any], state: dict[str, Any]) -> Any:
    """A torch optimizer rebuilt on the restored parameters, then given its saved state.

    An optimizer is never pickled as an object: ``Optimizer.__getstate__`` keeps only
    ``defaults``, ``state`` and ``param_groups``, so what a subclass sets in its constructor
    (LBFGS's ``_params``) would be missing after a resume."""
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise pickle.UnpicklingError(f"{cls!r} is not a torch optimizer")
    optimizer = cls(groups, **kwargs)
    optimizer.load_state_dict(state)
    # exactly the saved defaults (load_state_dict adds ``differentiable`` to them)
    optimizer.defaults.clear()
    optimizer.defaults.update(defaults)
    return optimizer


def _code_objects_of(path: str) -> frozenset[types.CodeType]:
    """Every code object of the Python file ``path`` (compiled from its bytes: its own
    encoding), nested ones included; empty when it cannot be read or compiled."""
    codes: set[types.CodeType] = set()
    try:
        with open(path, "rb") as f:
            top = compile(f.read(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    stack = [top]
    while stack:
        code = stack.pop()
        codes.add(code)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(codes)


def _program_code_objects() -> frozenset[types.CodeType]:
    if _Context.program_codes is None:
        _Context.program_codes = _code_objects_of(_Context.program_file)
    return _Context.program_codes


_MODULE_CODES: dict[str, frozenset[types.CodeType]] = {}


def _module_code_objects(name: str) -> frozenset[types.CodeType]:
    """The code of the imported module ``name``, from its source file (none for a module a
    resume state may not hold, or one without a ``.py`` file)."""
    if name not in _MODULE_CODES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        _MODULE_CODES[name] = _code_objects_of(path) if isinstance(path, str) \
            and path.endswith(".py") and not denied(name, "") else frozenset()
    return _MODULE_CODES[name]


def _library_module_of(code: types.CodeType) -> str | None:
    """The imported module whose source contains ``code`` (found by its file name)."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == code.co_filename \
                and code in _module_code_objects(name):
            return name
    return None


def _checked_code(*args: Any) -> types.CodeType:
    """A code object from a resume state: only one the program itself contains, or one of a
    module it has imported (a library's closure): a resume state brings no code of its own."""
    code = types.CodeType(*args)
    if code not in _program_code_objects() and _library_module_of(code) is None:
        raise pickle.UnpicklingError(f"it holds code ({code.co_name}) that is not part of "
                                     "the program or of a module it imported")
    return code


def _builtin_type(name: str) -> Any:
    return _checked_code if name == "CodeType" else cloudpickle.cloudpickle._builtin_type(name)


# --------------------------------------------------------------------------- writing


class _Seen:
    __slots__ = ("owner", "digest", "content")

    def __init__(self, owner: Any, digest: str, content: bytes | None) -> None:
        self.owner = owner
        self.digest = digest
        self.content = content


@functools.cache
def _libc_memcmp() -> Callable[[int, bytes, int], int] | None:
    """libc's ``memcmp`` through ctypes, or None where there is no C library to load."""
    import ctypes

    try:
        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    return memcmp


def _same_bytes(data: bytes | memoryview, content: bytes) -> bool:
    """``data`` (a NumPy array's or a torch storage's memory) equals ``content``: libc's
    ``memcmp`` stops at the first difference and reads at memory speed, several times faster
    than NumPy's ``array_equal`` (which builds an array of booleans first) and many times
    cheaper than hashing."""
    if len(data) != len(content):
        return False
    import numpy as np

    mine = np.frombuffer(data, dtype=np.uint8)
    memcmp = _libc_memcmp()
    if memcmp is None:
        return bool(np.array_equal(mine, np.frombuffer(content, dtype=np.uint8)))
    # ``mine`` keeps ``data``'s memory alive across the call (ctypes releases the GIL)
    return memcmp(mine.ctypes.data, content, len(content)) == 0


class BlobMemo:
    """The blobs of the previous save, so that an unchanged one costs neither a hash nor a copy.

    Sound whatever the program did in between. An entry holds its object, so the key — the
    object's ``id``, or a torch storage's ``_cdata`` — names that object and no other while the
    entry lives. An immutable ``str`` or ``bytes`` found again is the same value. A buffer (NumPy
    array, torch storage) found again is compared byte for byte with an immutable copy of its
    content at the previous save: equal bytes, equal digest. No version counter is trusted
    (``.data``, NumPy views and ``torch.from_numpy`` write memory without bumping one). A buffer
    that changed keeps no copy (it is hashed at the next save, and keeps a copy again once it is
    seen unchanged), so the copies held are those of constant data. Entries of objects the last
    save did not hold are dropped.
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, ...], _Seen] = {}
        self.next: dict[tuple[Any, ...], _Seen] = {}
        self.tables: dict[int, Any] = {}
        """How the tables of the previous save were written (:mod:`._arrays`), by the list's
        ``id``: reused while a table holds the same objects."""
        self.next_tables: dict[int, Any] = {}

    def content(self, key: tuple[Any, ...], owner: Any, data: bytes | memoryview | str
                ) -> tuple[str, bytes]:
        """(digest, immutable bytes) of ``data``, the memory or value of ``owner`` now."""
        seen = self.next.get(key) or self.entries.get(key)
        if seen is not None and seen.content is not None and (
                isinstance(data, str | bytes) or _same_bytes(data, seen.content)):
            self.next[key] = seen
            return seen.digest, seen.content
        if isinstance(data, str):
            content = data.encode("utf-8", "surrogatepass")
        else:
            content = data if isinstance(data, bytes) else bytes(data)
        digest = hashlib.sha256(content).hexdigest()
        changed = seen is not None and seen.digest != digest
        self.next[key] = _Seen(owner, digest, None if changed else content)
        return digest, content

    def saved(self) -> None:
        """One save's payload is done: what it did not hold is forgotten."""
        self.entries, self.next = self.next, {}
        self.tables, self.next_tables = self.next_tables, {}

    def abandon(self) -> None:
        """A save that failed: the entries stay those of the last one."""
        self.next = {}
        self.next_tables = {}


class _Never:
    """Stands for ``numpy.ndarray`` while NumPy is not imported: no object is of this type."""


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: Any, protocol: int, blobs: dict[str, bytes] | None,
                 memo: BlobMemo | None = None) -> None:
        super().__init__(file, protocol=protocol)
        self.blobs = blobs
        """Digest → bytes of the blobs written so far; None: everything inline."""
        self.blob_memo = memo
        self.keys: dict[int, int] = {}
        self.keep: list[Any] = []  # objects keyed by id stay alive until the dump ends
        self.globals: set[tuple[str, str]] = set()
        """(module, name) of everything written by name: what loading may import."""
        numpy = sys.modules.get("numpy")
        self.tables = TableWriter(
            _Context.dump_anchors, self.keep, memo.tables if memo else None,
            memo.next_tables if memo else None) if numpy else None
        """NumPy arrays (owners and views), tables of many values, the sharing check."""
        self.ndarray: type = numpy.ndarray if numpy else _Never

    def _key(self, obj: Any, ident: int) -> int:
        key = self.keys.get(ident)
        if key is None:
            key = self.keys[ident] = len(self.keys)
            self.keep.append(obj)
        return key

    def _blob(self, data: bytes | memoryview | str, key: tuple[Any, ...] | None = None,
              owner: Any = None) -> tuple[str, bytes | str]:
        """A buffer inline or as a blob; ``key`` and ``owner`` name it for the memo (``owner``
        stays alive while its entry does, so ``key`` — an id — names only it)."""
        if self.blobs is None or len(data) < BLOB_MIN_BYTES:
            if isinstance(data, str):
                return "inline", data.encode("utf-8", "surrogatepass")
            return "inline", bytes(data)
        if self.blob_memo is not None and key is not None:
            digest, content = self.blob_memo.content(key, owner, data)
        else:
            content = data.encode("utf-8", "surrogatepass") if isinstance(data, str) \
                else data if isinstance(data, bytes) else bytes(data)
            digest = hashlib.sha256(content).hexdigest()
        self.blobs.setdefault(digest, content)
        return "blob", digest

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is list or kind is tuple or kind is self.ndarray:
            tables = self.tables
            if tables is not None:
                ident = id(obj)
                if tables.lookups:
                    item = tables.item(ident)
                    if item is not None:
                        return item  # written by a table
                if kind is not self.ndarray and len(obj) >= TABLE_MIN \
                        and ident not in tables.met:
                    table = tables.table(obj)
                    if table is not None:
                        return table
                tables.met.add(ident)  # pickled the ordinary way: in pickle's memo
            return None
        if kind is Raw:
            return ("raw", *self._blob(obj.data, obj.key, obj.owner))
        if kind is str or kind is bytes:
            if self.blobs is not None and len(obj) >= BLOB_MIN_BYTES:
                return ("str" if kind is str else "bytes",
                        *self._blob(obj, ("object", id(obj)), obj))
            return None
        if kind.__module__.startswith("torch"):
            torch = sys.modules["torch"]
            if isinstance(obj, torch.storage.TypedStorage):
                untyped, dtype = obj._untyped_storage, str(obj.dtype).removeprefix("torch.")
            elif isinstance(obj, torch.UntypedStorage):
                untyped, dtype = obj, "uint8"
            else:
                return None
            key = self._key(untyped, untyped._cdata)
            cpu = untyped.cpu() if untyped.device.type != "cpu" else untyped
            data = memoryview(torch.empty(0, dtype=torch.uint8).set_(cpu).numpy())
            return ("storage", key, dtype, str(untyped.device),
                    *self._blob(data, ("storage", untyped._cdata), untyped))
        return None

    def reducer_override(self, obj: Any) -> Any:
        reduced = self._reduce(obj)
        if reduced is NotImplemented:
            if isinstance(obj, type | types.FunctionType) or (
                    isinstance(obj, types.BuiltinFunctionType)
                    and (obj.__self__ is None or isinstance(obj.__self__, types.ModuleType))):
                self._by_name(obj, getattr(obj, "__qualname__", None) or obj.__name__)
                return NotImplemented
            # Reduce it here, as pickle would next, to see whether it is written by name.
            reducer = self.dispatch_table.get(type(obj))
            reduced = reducer(obj) if reducer is not None else obj.__reduce_ex__(self.proto)
            if isinstance(reduced, tuple) and reduced and reduced[0] is getattr:
                # An enum member, a bound method: looked up again by a checked getattr.
                reduced = (_attribute, *reduced[1:])
        if isinstance(reduced, str):
            self._by_name(obj, reduced)
        return reduced

    def _by_name(self, obj: Any, name: str) -> None:
        """``obj`` is written as a reference to ``module.name``: loading it imports that."""
        module = pickle.whichmodule(obj, name)  # type: ignore[attr-defined]
        if denied(module, name):
            raise pickle.PicklingError(f"restoring it would call {module}.{name}, which a "
                                       "resume state may not call (it could run any code)")
        self.globals.add((module, name))

    def _reduce(self, obj: Any) -> Any:
        token = _Context.dump_anchors.get(id(obj))
        if token is not None:
            return _anchor, (token,)
        if isinstance(obj, types.ModuleType):
            if denied(obj.__name__, ""):
                raise pickle.PicklingError(f"it holds the module {obj.__name__}, which a resume "
                                           "state may not hold")
            return _module, (obj.__name__,)
        namespace = _Context.program_globals
        qualname = getattr(obj, "__qualname__", "")
        if isinstance(obj, type | types.FunctionType) and namespace is not None \
                and isinstance(qualname, str) and namespace.get(qualname) is obj \
                and getattr(obj, "__module__", None) == namespace.get("__name__"):
            return _program_definition, (qualname,)
        if self.tables is not None and (isinstance(obj, self.ndarray)
                                        or type(obj) is ArrayContent):
            return self.tables.reduce(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if torch is not None and isinstance(obj, torch.optim.Optimizer):
            return _reduce_optimizer(obj)
        resource = reduce_resource(obj)
        if resource is not NotImplemented:
            return resource
        reduced = super().reducer_override(obj)
        if not isinstance(obj, types.FunctionType) or reduced is NotImplemented:
            return reduced
        # A function saved by value: its code must be the program's own or that of the module
        # it was made in (checked again on load), its globals that namespace.
        func, (code, _, *rest), state, *_ = reduced
        if obj.__code__ in _program_code_objects():
            if namespace is not None and obj.__globals__ is namespace:
                return func, (code, _PROGRAM_GLOBALS, *rest), state, None, None, \
                    _set_program_function_state
            return reduced
        # The module whose globals it runs in: ``__module__`` may name another (a decorator's
        # wrapper copies its function's, as torch.no_grad()'s does).
        module = obj.__globals__.get("__name__")
        if isinstance(module, str) and sys.modules.get(module) is not None \
                and obj.__globals__ is vars(sys.modules[module]) \
                and obj.__code__ in _module_code_objects(module):
            return func, (code, _ModuleGlobals(module), *rest), state, None, None, \
                _set_program_function_state
        raise pickle.PicklingError(
            f"it is a function made outside the program ({obj.__qualname__} of "
            f"{module or obj.__module__}), whose code is neither the program's own nor in the "
            "source of an imported module")

    def _tensor(self, obj: Any) -> Any:
        if obj.grad_fn is not None:
            # torch would save it as a leaf: backward() after the resume would silently stop
            # reaching the parameters it came from.
            raise pickle.PicklingError(
                f"it is part of an autograd graph (grad_fn {type(obj.grad_fn).__name__}), which "
                "cannot be saved; keep a detached value (`.detach()`, `.item()`) across the "
                "checkpoint")
        if obj.grad is None:
            return NotImplemented
        # Accumulated gradients (a checkpoint between backward() and step()) are state.
        reduced = obj.__reduce_ex__(self.proto)
        own = reduced[2] if len(reduced) > 2 else None
        return reduced[0], reduced[1], (own, obj.grad), None, None, _set_state_and_grad


_OPTIMIZER_INTERNALS: frozenset[str] | None = None


def _optimizer_internals() -> frozenset[str]:
    """What torch's ``Optimizer`` keeps in every instance's ``__dict__`` (its state, groups and
    hooks), and what an LR scheduler adds (its wrapper of ``step``)."""
    global _OPTIMIZER_INTERNALS
    if _OPTIMIZER_INTERNALS is None:
        import torch

        probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        _OPTIMIZER_INTERNALS = frozenset(vars(probe)) | {"step", "_opt_called"}
    return _OPTIMIZER_INTERNALS


def _reduce_optimizer(optimizer: Any) -> Any:
    """Save an optimizer as what rebuilds it: its class, its parameter groups (the parameters
    themselves, so the rebuilt one holds the restored ones), the defaults its constructor takes
    and its ``state_dict``. Refused at the save when the class cannot be called that way."""
    import inspect

    cls = type(optimizer)
    groups = [dict(group) for group in optimizer.param_groups]
    try:
        signature = inspect.signature(cls)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        # Some defaults are the base class's (``differentiable`` for LBFGS), not the
        # constructor's: only those it takes are passed; the groups' own values come back with
        # the state_dict.
        kwargs = {k: v for k, v in optimizer.defaults.items()
                  if takes_any or k in signature.parameters}
        signature.bind(groups, **kwargs)
    except (TypeError, ValueError) as exc:
        raise pickle.PicklingError(
            f"it is an optimizer ({cls.__qualname__}) that cannot be rebuilt from its "
            f"parameter groups and defaults ({exc}); create it at the program's top level, "
            "where it is restored in place") from None
    own = set(vars(optimizer)) - _optimizer_internals()
    if cls.__module__.split(".")[0] != "torch" and own:
        # A subclass's constructor set these: rebuilt, they would take the constructor's
        # defaults, not the values the program gave — a silent difference.
        raise pickle.PicklingError(
            f"it is an optimizer ({cls.__qualname__}) with attributes of its own "
            f"({', '.join(sorted(own))}) that its state_dict does not hold; create it at the "
            "program's top level, where it is restored in place")
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        raise pickle.PicklingError(
            f"it is an optimizer ({cls.__qualname__}) with step hooks, which a resume cannot "
            "re-register; create it at the program's top level, where it is restored in place")
    return _optimizer, (cls, groups, kwargs, dict(optimizer.defaults), optimizer.state_dict())


class Dumped:
    """One serialized payload: the pickle, the blobs it refers to, the globals it needs."""

    __slots__ = ("data", "blobs", "globals")

    def __init__(self, data: bytes, blobs: dict[str, bytes], globals_: list[list[str]]) -> None:
        self.data = data
        self.blobs = blobs
        self.globals = globals_


def dumps(payload: Any, anchors: dict[int, tuple[str, ...]], *, dedup: bool = True,
          memo: BlobMemo | None = None) -> Dumped:
    """Serialize; :class:`pickle.PicklingError` (or the error of the value) if it cannot be.

    With ``memo``, blobs unchanged since the memo's last save are neither hashed nor copied."""
    _Context.dump_anchors = anchors
    buf = io.BytesIO()
    blobs: dict[str, bytes] = {}
    try:
        pickler = _Pickler(buf, pickle.HIGHEST_PROTOCOL, blobs if dedup else None, memo)
        pickler.dump(payload)
        if pickler.tables is not None:
            pickler.tables.sharing.check()
    except BaseException:
        if memo is not None:
            memo.abandon()
        raise
    finally:
        _Context.dump_anchors = {}
    if memo is not None:
        memo.saved()
    return Dumped(buf.getvalue(), blobs, [list(g) for g in sorted(pickler.globals)])


_ARG_SIZE = {ord(op.code): (0 if op.arg is None else op.arg.n) for op in pickletools.opcodes}
"""Opcode → its argument's size: ``n ≥ 0`` bytes, or pickletools' markers for a newline-ended
argument (-1) and for a length prefix of 1, 4, 4 or 8 bytes (-2 … -5)."""
_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
           pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}
_STRINGS = {ord(pickle.SHORT_BINUNICODE), ord(pickle.BINUNICODE), ord(pickle.BINUNICODE8)}
_GLOBAL_OPS = {ord(pickle.GLOBAL), ord(pickle.INST)}
_STACK_GLOBAL = ord(pickle.STACK_GLOBAL)
_MEMOIZE = ord(pickle.MEMOIZE)
_PUTS = {ord(pickle.BINPUT), ord(pickle.LONG_BINPUT)}
_GETS = {ord(pickle.BINGET), ord(pickle.LONG_BINGET)}
_STOP = ord(pickle.STOP)


def globals_of(data: bytes) -> set[tuple[str, str]]:
    """Every (module, name) a pickle imports when loaded.

    A linear scan of the opcodes (what :func:`pickletools.genops` does, without decoding the
    arguments it does not need). ``STACK_GLOBAL`` takes its two names from the two items pushed
    just before it, literally or from the memo. A save records its globals as it pickles (much
    faster than a scan); the tests check the record against this scan.
    """
    found: set[tuple[str, str]] = set()
    memo: list[Any] = []
    memo_at: dict[int, Any] = {}
    last: Any = None
    before: Any = None
    i, end = 0, len(data)
    view = memoryview(data)
    while i < end:
        code = data[i]
        i += 1
        size = _ARG_SIZE.get(code)
        if size is None:
            raise pickle.PicklingError(f"an opcode the check does not know ({code})")
        value: Any = None
        if code in _GLOBAL_OPS:
            first = data.index(b"\n", i)
            second = data.index(b"\n", first + 1)
            found.add((data[i:first].decode(), data[first + 1:second].decode()))
            i = second + 1
        elif size >= 0:
            if code in _PUTS:
                memo_at[int.from_bytes(view[i:i + size], "little")] = last
            elif code in _GETS:
                value = memo_at.get(int.from_bytes(view[i:i + size], "little"))
            i += size
        elif size == pickletools.UP_TO_NEWLINE:
            newline = data.index(b"\n", i)
            if code == ord(pickle.GET):
                value = memo_at.get(int(data[i:newline]))
            elif code == ord(pickle.PUT):
                memo_at[int(data[i:newline])] = last
            i = newline + 1
        else:
            width = _PREFIX[size]
            length = int.from_bytes(view[i:i + width], "little")
            i += width
            if code in _STRINGS:
                value = bytes(view[i:i + length]).decode("utf-8", "surrogatepass")
            i += length
        if code == _STACK_GLOBAL:
            if not (isinstance(before, str) and isinstance(last, str)):
                raise pickle.PicklingError("an import the check cannot follow")
            found.add((before, last))
        elif code == _MEMOIZE:
            memo_at[len(memo)] = last
            memo.append(last)
            continue  # MEMOIZE leaves the stack as it was
        elif code in _PUTS or code == ord(pickle.PUT):
            continue
        elif code == _STOP:
            break
        before, last = last, value
    return found


# --------------------------------------------------------------------------- reading


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, allowed: frozenset[tuple[str, str]],
                 blob: Callable[[str], bytes]) -> None:
        super().__init__(file)
        self.allowed = allowed
        self.blob = blob
        self.objects: dict[tuple[str, int], Any] = {}
        self.tables = TableReader()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed or denied(module, name):
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which this program's "
                                         "saved state does not use")
        if (module, name) == ("cloudpickle.cloudpickle", "_builtin_type"):
            return _builtin_type
        found = super().find_class(module, name)
        if found is types.CodeType:
            return _checked_code
        return found

    def _data(self, where: str, ref: bytes | str) -> bytes:
        if where == "inline" and isinstance(ref, bytes):
            return ref
        if where == "blob" and isinstance(ref, str):
            return self.blob(ref)
        raise pickle.UnpicklingError("a damaged reference to saved data")

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("a damaged reference to saved data")
        kind = pid[0]
        if kind == "raw" and len(pid) == 3:
            return self._data(pid[1], pid[2])
        if kind == "item" and len(pid) == 3:
            return self.tables.item(pid[1], pid[2])
        if kind == "table" and len(pid) == 4:
            return self.tables.table(pid[1], pid[2], pid[3])
        if kind in ("str", "bytes") and len(pid) == 3:
            data = self._data(pid[1], pid[2])
            return data.decode("utf-8", "surrogatepass") if kind == "str" else data
        if kind == "storage" and len(pid) == 6:
            key = ("storage", int(pid[1]))
            if key not in self.objects:
                import torch

                raw = self._data(pid[4], pid[5])
                untyped = torch.UntypedStorage.from_buffer(raw, dtype=torch.uint8) if raw \
                    else torch.UntypedStorage(0)
                if pid[3] != "cpu":
                    untyped = untyped.to(device=torch.device(pid[3]))
                dtype = getattr(torch, str(pid[2]))
                if not isinstance(dtype, torch.dtype):
                    raise pickle.UnpicklingError("a damaged reference to saved data")
                self.objects[key] = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype,
                                                               _internal=True)
            return self.objects[key]
        if kind == "ndarray" and len(pid) == 6:  # written by an ecrl-transform before tables
            key = ("ndarray", int(pid[1]))
            if key not in self.objects:
                import numpy as np

                raw = self._data(pid[4], pid[5])
                # A copy owns its data (base None): saved as a blob again next time.
                array = np.frombuffer(raw, dtype=np.dtype(str(pid[2]))).reshape(tuple(pid[3]))
                self.objects[key] = array.copy()
            return self.objects[key]
        raise pickle.UnpicklingError("a damaged reference to saved data")


def loads(data: bytes, anchors: Mapping[tuple[str, ...], Any], allowed: Iterable[Iterable[str]],
          blob: Callable[[str], bytes]) -> Any:
    """The payload back; :class:`CheckpointError` (one line) for one this program cannot load."""
    _Context.load_anchors = dict(anchors)
    try:
        pairs = frozenset((str(m), str(n)) for m, n in allowed)
        return _Unpickler(io.BytesIO(data), pairs, blob).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"cannot resume: the resume state is refused: {exc}; remove it "
                              "to start over") from None
    finally:
        _Context.load_anchors = {}
