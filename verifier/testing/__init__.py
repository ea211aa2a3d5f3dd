"""Test support for the verifier, off its product surface: a run generator that writes run
directories as the runtime does (:mod:`verifier.testing.generate`) and a catalogue of known ways to
break them (:mod:`verifier.testing.mutations`), used by the tests, ``ecrl bench verify`` and the
report's mutation self-test."""
