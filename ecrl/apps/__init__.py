"""Applications over the runtime: the ``ecrl`` command line, the demo, advice and benchmarks.

The only layer of ``ecrl`` that may import ``verifier`` and ``transform``.
"""
