"""The torch runtime, one room per concern.

- ``sampling``: the global-batch sampler, sample IDs carried with the samples, the step log.
- ``checkpoint``: the checkpointer, its strategies and their registry, the commit protocol, the
  state pack, the background writer, the deadline and the hang watchdog.
- ``supervision``: the supervisor around ``torchrun``, ``ecrl launch``, warm standby, the summary.
- ``trainer``: the built-in trainer of ``ecrl run``, its data sets and models.

The modules at this level are what the rooms share: the run settings (``runconfig``), the
environment a supervisor hands each attempt (``launchenv``), failure injection and the markers
of how an attempt ended. Modules that need torch import it themselves; the supervisor, the
background writer and the commit protocol (``checkpoint.persist``) stay torch-free so that they
start fast.
"""
