"""HF Accelerate: ``ECRLTracker`` (:mod:`ecrl.runtime.integrations.accelerate`)."""

from ecrl.runtime.integrations.accelerate import ECRLTracker

__all__ = ["ECRLTracker"]
