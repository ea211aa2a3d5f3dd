"""The torch-free contract that the runtime, the verifier and the transformer share.

``semantics`` (which samples each step and rank consume), ``runformat`` (the run directory),
``ckptfile`` (the checkpoint file format), ``atomicio`` (durable writes), ``goodput`` (the one
definition ``ecrl run`` and ``ecrl-verify`` print), ``cli`` (how the three command lines end:
one-line errors, Ctrl-C, a closed pipe) and ``errors`` (the exception root). Nothing here imports
torch, and nothing here imports the layers above it.
"""
