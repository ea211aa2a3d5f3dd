"""Supervision: the supervisor that launches torchrun, relaunches after failures and records
every attempt.

``supervisor`` (the coordinator, ``ecrl run``) and ``launcher`` (``ecrl launch``) use one module
per concern: ``command`` (the torchrun command line and environment), ``progress`` (following the
step logs), ``policy`` (classifying an exit; relaunch or stop), ``rundir`` (``--out``, the planned
``run.json``, atomic writes), ``_lock``, ``signals``, ``standby`` (the warm standby), ``events``
(what the supervisor reports to its reporter, as data) and ``summary`` (the run's account).
"""
