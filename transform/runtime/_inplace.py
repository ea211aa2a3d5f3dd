"""Anchors restored in place: the objects the resumed program rebuilt take the saved state.

``load_state_dict`` for modules (with their ``train()``/``eval()`` flags, gradients and plain
attributes), optimizers and schedulers; element-wise for NumPy arrays and torch tensors (with
``.grad``); ``setstate`` for generators; ``__dict__`` for plain objects; lists, dicts and sets
keep their identity.
"""

from __future__ import annotations

import random
import sys
import types
from typing import Any

from transform.runtime._arrays import ArrayContent
from transform.runtime._exit import CheckpointError

__all__ = ["anchor_kind", "anchor_state", "apply_anchor", "update_container"]


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


def anchor_kind(obj: Any) -> str | None:
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


def anchor_state(kind: str, obj: Any) -> Any:
    if kind == "module":
        # state_dict leaves out the gradients; between backward() and step() they are state.
        grads = [(name, p.grad) for name, p in obj.named_parameters() if p.grad is not None]
        # ... and every plain attribute (lists a policy appends to each step, counters): saved
        # with the rest, or the save is refused; never dropped.
        attributes = [(name, _plain_attributes(m)) for name, m in obj.named_modules()]
        return (obj.state_dict(), [(name, m.training) for name, m in obj.named_modules()],
                grads, attributes)
    if kind == "state_dict":
        return obj.state_dict()
    if kind == "random":
        return obj.getstate()
    if kind == "array":
        # Its values, by value: the anchor itself (and a view of it) is written as a reference
        # to the rebuilt array.
        return ArrayContent(obj)
    if kind == "np_generator":
        return obj.bit_generator.state
    if kind == "np_randomstate":
        return obj.get_state()
    if kind == "tensor":
        return obj.detach(), obj.grad
    if kind == "torch_generator":
        return obj.get_state()
    return obj.__dict__


def apply_anchor(kind: str, current: Any, state: Any, what: str) -> None:
    if anchor_kind(current) != kind:
        raise CheckpointError(f"cannot resume: `{what}` is now a {type(current).__name__}, "
                              "not what was saved")
    if kind == "module":
        if len(state) != 4:  # written before plain attributes were saved: it holds none
            raise CheckpointError(f"cannot resume: the saved state of `{what}` lacks its "
                                  "attributes (an older ecrl-transform wrote it); remove the "
                                  "resume state to start over")
        weights, flags, grads, attributes = state
        current.load_state_dict(weights)
        modes = dict(flags)
        saved_attributes = dict(attributes)
        for name, m in current.named_modules():
            if name in modes:
                m.training = modes[name]
            if name in saved_attributes:
                for key in _plain_attributes(m).keys() - saved_attributes[name].keys():
                    del m.__dict__[key]  # set after the checkpoint by the rebuilt program
                m.__dict__.update(saved_attributes[name])
        saved_grads = dict(grads)
        for name, p in current.named_parameters():
            _restore_grad(p, saved_grads.get(name))
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
        _restore_grad(current, grad)
    elif kind == "torch_generator":
        current.set_state(state)
    else:
        current.__dict__.clear()
        current.__dict__.update(state)


_MODULE_INTERNALS: frozenset[str] | None = None


def _plain_attributes(module: Any) -> dict[str, Any]:
    """A module's attributes that ``state_dict`` does not cover: everything in its ``__dict__``
    but torch's own bookkeeping (parameters, buffers, submodules and hooks live there).

    Nothing for torch's own module classes: their plain attributes are their constructor's
    settings, which the rebuilt program sets again, and some hold process resources that
    cannot be saved (``DistributedDataParallel``'s process group and reducer)."""
    if type(module).__module__.split(".")[0] == "torch":
        return {}
    global _MODULE_INTERNALS
    if _MODULE_INTERNALS is None:
        import torch

        _MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)
    return {k: v for k, v in module.__dict__.items() if k not in _MODULE_INTERNALS}


def update_container(current: Any, saved: Any) -> bool:
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


def _restore_grad(tensor: Any, grad: Any) -> None:
    """The saved gradient, into the tensor's own ``.grad`` when it has one of the same layout
    (an optimizer or a hook may hold it), else as a new one."""
    current = tensor.grad
    if grad is None:
        tensor.grad = None
    elif current is not None and current.shape == grad.shape and current.dtype == grad.dtype \
            and current.device == grad.device:
        import torch

        with torch.no_grad():
            current.copy_(grad)
    else:
        tensor.grad = grad.to(tensor.device)
