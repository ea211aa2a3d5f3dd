"""The optional dependencies: which extra installs each, and the one line when one is missing.

``pip install ecrl`` installs what the verifier, the transformer and this contract import; the
runtime (torch) comes with ``ecrl[train]`` and the plots (matplotlib) with ``ecrl[plots]``, which
``train`` includes, and Ray (``ecrl-verify --ray``) with ``ecrl[ray]`` (pyproject.toml). A
command or name that needs one checks here first, before it starts any work, so that a missing
package is one actionable line instead of a traceback from deep inside a launched process.
"""

from __future__ import annotations

import importlib.util

from ecrl.contract.errors import EcrlError

__all__ = ["EXTRAS", "MissingExtraError", "missing", "require"]

EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("PyTorch", "train"),
    "torchvision": ("torchvision", "train"),
    "matplotlib": ("matplotlib", "plots"),
    "ray": ("Ray", "ray"),
}
"""import name -> (what a person calls it, the extra of pyproject.toml that installs it)."""


class MissingExtraError(EcrlError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    An :class:`ImportError` too, so ``try: from ecrl import Checkpointer except ImportError``
    keeps working.
    """


def missing(module: str) -> str | None:
    """``None`` if ``module`` can be imported, else why not and what to install, e.g.
    ``PyTorch is not installed: pip install 'ecrl[train]'``.

    Looks the module up without importing it, so the check costs no torch import.
    """
    label, extra = EXTRAS[module]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"{label} is not installed: pip install 'ecrl[{extra}]'"


def require(module: str, *, what: str | None = None) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported.

    ``what`` names the command or name that needs it (``ecrl.Checkpointer``); leave it out where
    the caller already prefixes the message with the command, as the command lines do.
    """
    reason = missing(module)
    if reason is None:
        return
    if what is None:
        raise MissingExtraError(reason, name=module)
    label, extra = EXTRAS[module]
    raise MissingExtraError(f"{what} needs {label}, which is not installed: "
                            f"pip install 'ecrl[{extra}]'", name=module)
