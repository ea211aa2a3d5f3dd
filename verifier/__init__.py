"""``ecrl-verify``: prove exactly-once data consumption from ECRL run logs (never imports torch)."""

from __future__ import annotations

__all__: list[str] = []
