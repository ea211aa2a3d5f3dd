"""Test support for the transformer, kept apart from what a transformed program or the CLI
imports: :mod:`~transform.testing.drive` (run a program in its own process, timing its work
from the end of its imports — the kill-and-resume harness and ``ecrl bench`` use it),
:mod:`~transform.testing.naive` (CheckHint's O(m·n²) recurrence, the reference the solvers are
checked against) and :mod:`~transform.testing.snapshots` (``python -m
transform.testing.snapshots [--update]``: the generated code of every fixture, pinned)."""
