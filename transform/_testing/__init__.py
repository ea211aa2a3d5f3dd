"""Internal support for the transformer's tests and benchmarks (``ecrl bench``), kept apart from
what a transformed program or the CLI imports, and from the public surface:
:mod:`~transform._testing.drive` (run a program in its own process, timing its work from the end
of its imports — the kill-and-resume harness and ``ecrl bench transform`` use it) and
:mod:`~transform._testing.naive` (CheckHint's O(m·n²) recurrence, the reference the solvers are
checked against, and ``ecrl bench schedule``'s baseline). The fixture snapshots are a test rig
only: ``tests/transform/snapshots.py``."""
