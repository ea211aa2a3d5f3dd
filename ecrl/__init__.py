"""ECRL: fault-tolerant PyTorch DDP training with exact, verifiable recovery.

Importing ``ecrl`` does not import torch. Three layers, one subpackage each: ``ecrl.contract``
(torch-free: what the verifier and the transformer share), ``ecrl.runtime`` (the torch runtime)
and ``ecrl.apps`` (command line, demo, benchmarks: the only layer importing verifier and transform).
"""

from __future__ import annotations

from ecrl.contract.errors import ConfigError, EcrlError, RunFormatError, SemanticsError

__all__ = ["ConfigError", "EcrlError", "RunFormatError", "SemanticsError", "__version__"]
__version__ = "0.1.0"
