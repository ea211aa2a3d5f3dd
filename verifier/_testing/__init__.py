"""Test support for the verifier, off its product surface: a run generator that writes run
directories as the runtime does (:mod:`verifier._testing.generate`), used by the tests and
``ecrl bench verify``. Internal: it may change with the tests that use it. (The mutation
catalogue the tests also use is part of the product's ``--self-test``:
:mod:`verifier._mutations`, :mod:`verifier.selftest`.)"""
