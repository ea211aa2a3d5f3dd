"""ECRL inside the frameworks people train with: their own hooks write the step logs.

One module per framework, each importing its framework only when imported itself (``import
ecrl`` stays framework-free): :mod:`.lightning` (PyTorch Lightning), :mod:`.accelerate` (HF
Accelerate), :mod:`.transformers` (the transformers ``Trainer``). Shared pieces are in
:mod:`._hooks`. The public path is ``ecrl.integrations.<framework>`` (docs/library.md).
"""
