"""HF Accelerate: ``ECRLTracker`` (:mod:`ecrl.runtime.integrations.accelerate`), with
``WithSampleIds`` and ``GlobalBatchSampler`` (one import line adopts ECRL)."""

from ecrl.runtime.integrations.accelerate import ECRLTracker, GlobalBatchSampler, WithSampleIds

__all__ = ["ECRLTracker", "GlobalBatchSampler", "WithSampleIds"]
