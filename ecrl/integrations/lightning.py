"""PyTorch Lightning: ``ECRLCallback`` (:mod:`ecrl.runtime.integrations.lightning`), with
``WithSampleIds`` and ``GlobalBatchSampler`` (one import line adopts ECRL)."""

from ecrl.runtime.integrations.lightning import ECRLCallback, GlobalBatchSampler, WithSampleIds

__all__ = ["ECRLCallback", "GlobalBatchSampler", "WithSampleIds"]
