"""Sampling: the global-batch sampler, sample IDs that travel with the samples, and the step log."""
