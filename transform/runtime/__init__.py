"""What a program written by ``ecrl-transform`` imports: checkpoints, and resuming from them.

A transformed program carries a *plan* (:class:`transform.planspec.Plan` as a literal: the chosen
hints, what each saves, the firing rules) and calls this package at a few places:

* ``_ECRL = Program(__file__, plan, lines=...)`` once (``lines``: the generator's map from the
  program's lines to the original's, for tracebacks), and ``_ecrl = _ECRL.enter(region)`` at the
  start of the module's top level and of each function that checkpoints. ``enter`` counts the
  region's entries; the entry that a saved resume state belongs to comes back *walking*:
  ``_ecrl.run`` is False, and the generated guards skip every statement before the saved point.
* While walking, the headers on the way to the saved point steer: ``_ecrl.loop(k)(iterable)``
  restarts a ``for`` loop at the saved iteration (``range`` and sequences by index, any other
  iterable fast-forwarded after restoring the random state it was created under),
  ``_ecrl.into(k)`` enters the ``if`` arm / ``while`` body / ``match`` case that holds the saved
  point, ``with`` statements are re-entered. ``_ecrl.restore(h)`` (just before the outermost
  statement holding the saved point, and again at the point) binds the saved values.
* ``_ecrl.checkpoint(h)`` after each chosen ``_checkpoint()``: counts the slot's executions and,
  when the schedule says so, saves; when walking, it is where the walk arrives (random states are
  restored last, so nothing the walk does disturbs them).

One module per concern: ``_rng`` (random states), ``_pickling`` (anchored serialization),
``_inplace`` (anchors restored in place), ``_statefile`` (the file on disk), ``_writer`` (the
background writer), ``_exit`` (one-line refusals, the state kept or removed at exit),
``_program`` (:class:`Program`, :class:`Activation`), ``_observe`` (:func:`observe`: each save's
time on the training thread and each write's bytes, for benchmarks and monitoring). torch is
imported only when the program has imported it itself. Of ``transform`` the package imports only
:mod:`transform.planspec` (the plan's data, shared with the generator): never the analysis or the
code generator.
"""

from __future__ import annotations

from transform.runtime._exit import CheckpointError
from transform.runtime._observe import Event, Saved, Written, observe
from transform.runtime._program import KILL_ENV, SKIP, Activation, Program
from transform.runtime._statefile import DEFAULT_ROOT, STATE_FILE

__all__ = ["Program", "Activation", "CheckpointError", "STATE_FILE", "DEFAULT_ROOT", "KILL_ENV",
           "SKIP", "observe", "Saved", "Written", "Event"]
