"""Checkpoints: the checkpointer, its strategies and their registry, the commit protocol,
the state pack and its digests, the snapshot pipeline, the background writer, deadline and
watchdog."""
