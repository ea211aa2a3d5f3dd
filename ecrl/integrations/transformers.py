"""transformers ``Trainer``: ``ECRLCallback`` (:mod:`ecrl.runtime.integrations.transformers`),
with ``GlobalBatchSampler`` (one import line adopts ECRL)."""

from ecrl.runtime.integrations.transformers import (
    ECRLCallback,
    GlobalBatchSampler,
    SampleIdCollator,
)

__all__ = ["ECRLCallback", "GlobalBatchSampler", "SampleIdCollator"]
