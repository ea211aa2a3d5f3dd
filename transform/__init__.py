"""``ecrl-transform``: turn ``_checkpoint()`` hints into real checkpoints (never imports torch).

``from transform import _checkpoint`` gives the hint; untransformed, it does nothing.
"""

from __future__ import annotations

__all__ = ["_checkpoint"]


def _checkpoint() -> None:
    """A possible checkpoint place; ``ecrl-transform`` decides whether it becomes one."""
