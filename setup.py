"""The compiled part of the build: optional C kernels (pyproject.toml holds everything else).

- ``ecrl.contract._native`` (``ecrl/contract/_native.c``): the epoch permutation and the shard
  hash of ``ecrl/contract/semantics.py``, element by element in one pass;
- ``verifier._native`` (``verifier/_native.c``): the scan's proof of a block of step records
  (``verifier/_scan.py``), one pass per line.

Where they cannot be built (no C compiler), the install goes on without them and the numpy
versions of the same functions run, with the same results (property tests hold the two equal)
and about half the verifier's speed.
"""

from setuptools import Extension, setup


def _kernel(name: str, source: str) -> Extension:
    return Extension(name, [source], optional=True, extra_compile_args=["-O2"])


setup(ext_modules=[_kernel("ecrl.contract._native", "ecrl/contract/_native.c"),
                   _kernel("verifier._native", "verifier/_native.c")])
