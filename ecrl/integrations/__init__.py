"""ECRL inside the frameworks people train with (docs/library.md, "Frameworks").

``ecrl.integrations.lightning``: PyTorch Lightning (``ECRLCallback``);
``ecrl.integrations.accelerate``: HF Accelerate (``ECRLTracker``);
``ecrl.integrations.transformers``: the transformers ``Trainer`` (``ECRLCallback``). Each module
imports its framework when it is imported itself; ``import ecrl`` and ``import
ecrl.integrations`` import none of them, nor torch.
"""
