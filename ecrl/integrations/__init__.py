"""ECRL inside the frameworks people train with (docs/library.md, "Frameworks").

``ecrl.integrations.lightning``: PyTorch Lightning (``ECRLCallback``);
``ecrl.integrations.accelerate``: HF Accelerate (``ECRLTracker``). Each module imports its
framework when it is imported itself; ``import ecrl`` and ``import ecrl.integrations`` import
neither it nor torch.
"""
