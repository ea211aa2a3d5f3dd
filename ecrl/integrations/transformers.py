"""transformers ``Trainer``: ``ECRLCallback`` (:mod:`ecrl.runtime.integrations.transformers`)."""

from ecrl.runtime.integrations.transformers import ECRLCallback, SampleIdCollator

__all__ = ["ECRLCallback", "SampleIdCollator"]
