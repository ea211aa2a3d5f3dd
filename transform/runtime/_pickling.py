"""Anchored pickling: one serialization of the saved values, with anchors by reference.

Anchors are values the resumed program rebuilds by itself (a function's parameters, module
globals): the payload refers to them by a token, and unpickling gives the rebuilt object, so other
saved values that referred to them (an optimizer holding a model's parameters) refer to the
rebuilt ones.
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types
from typing import Any

from transform.runtime._exit import CheckpointError

__all__ = ["dumps", "loads", "describe"]

# While one payload is written or read: anchors by object id (dump) and their current objects
# by token (load). Module-level because torch.save builds its own pickler from our class.
_DUMP_ANCHORS: dict[int, tuple[str, ...]] = {}
_LOAD_ANCHORS: dict[tuple[str, ...], Any] = {}


def _anchor(token: tuple[str, ...]) -> Any:
    """Unpickling an anchor gives the object the resumed program rebuilt."""
    try:
        return _LOAD_ANCHORS[token]
    except KeyError:
        raise CheckpointError(f"cannot resume: {describe(token)} no longer exists in the "
                              "rebuilt program") from None


def describe(token: tuple[str, ...]) -> str:
    if len(token) == 2:
        return f"`{token[1]}`"
    kind = {"p": "parameter", "b": "buffer", "m": "submodule"}[token[2]]
    return f"{kind} `{token[3]}` of `{token[1]}`"


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


class _Pickler(pickle.Pickler):
    def __init__(self, file: Any, protocol: int | None = None, **kwargs: Any) -> None:
        super().__init__(file, protocol, **kwargs)
        self.protocol = pickle.DEFAULT_PROTOCOL if protocol is None else protocol

    def reducer_override(self, obj: Any) -> Any:
        token = _DUMP_ANCHORS.get(id(obj))
        if token is not None:
            return _anchor, (token,)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(obj, torch.Tensor):
            return NotImplemented
        if obj.grad_fn is not None:
            # torch would save it as a leaf: backward() after the resume would silently stop
            # reaching the parameters it came from.
            raise pickle.PicklingError(
                f"it is part of an autograd graph (grad_fn {type(obj.grad_fn).__name__}), which "
                "cannot be saved; keep a detached value (`.detach()`, `.item()`) across the "
                "checkpoint")
        if obj.grad is not None:
            # Accumulated gradients (a checkpoint between backward() and step()) are state.
            reduced = obj.__reduce_ex__(self.protocol)
            own = reduced[2] if len(reduced) > 2 else None
            return reduced[0], reduced[1], (own, obj.grad), None, None, _set_state_and_grad
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


def dumps(payload: Any, anchors: dict[int, tuple[str, ...]]) -> tuple[str, bytes]:
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


def loads(kind: str, data: bytes, anchors: dict[tuple[str, ...], Any]) -> Any:
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
