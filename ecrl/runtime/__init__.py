"""The torch runtime: sampler, checkpoints, failure injection, trainer and supervisor.

Modules that need torch import it themselves; the supervisor, the background writer and the
commit protocol (``persist``) stay torch-free so that they start fast.
"""
