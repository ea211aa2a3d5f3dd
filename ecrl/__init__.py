"""ECRL: fault-tolerant PyTorch DDP training with exact, verifiable recovery.

Importing ``ecrl`` does not import torch; the torch-free modules (``ecrl.semantics``,
``ecrl.runformat``, ``ecrl.atomicio``) are what the verifier and the transformer share.
"""

from __future__ import annotations

from ecrl.errors import ConfigError, EcrlError, RunFormatError, SemanticsError

__all__ = ["ConfigError", "EcrlError", "RunFormatError", "SemanticsError", "__version__"]
__version__ = "0.1.0"
