"""Tests of ``verifier._testing`` share the verifier tests' helpers (``verifier_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path

_HELPERS = str(Path(__file__).resolve().parent.parent)
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)
