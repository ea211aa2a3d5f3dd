"""PyTorch Lightning: ``ECRLCallback`` (:mod:`ecrl.runtime.integrations.lightning`)."""

from ecrl.runtime.integrations.lightning import ECRLCallback

__all__ = ["ECRLCallback"]
