"""Random states and process-wide settings (numeric, working directory), captured and restored.

``random`` always; NumPy's global state and torch's CPU (and, once initialised, CUDA) states only
when the program imported those libraries itself — this module never imports them to look.

torch's process-wide settings travel too: a resumed program skips the statements that set them,
and each changes results (the default dtype; the thread count changes the order of reductions,
so the low bits of every sum; deterministic algorithms; float32 matmul precision).
"""

from __future__ import annotations

import array
import os
import random
import sys
from collections.abc import Mapping
from typing import Any

from transform.runtime._exit import CheckpointError

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """Every global random state the program can have touched (numpy, torch only if loaded)."""
    # The working directory too: the walk skips the os.chdir that set it.
    version, words, gauss = random.getstate()
    # The Mersenne Twister's 625 words as bytes: one item to pickle (and to scan), not 625.
    state: dict[str, Any] = {"random": (version, array.array("Q", words).tobytes(), gauss),
                             "cwd": os.getcwd()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        state["torch_settings"] = {
            "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
            "num_threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "matmul_precision": torch.get_float32_matmul_precision(),
        }
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, words, gauss = state["random"]
    random.setstate((version, tuple(array.array("Q", words)), gauss))
    if "cwd" in state and os.getcwd() != state["cwd"]:
        try:
            os.chdir(state["cwd"])
        except OSError as exc:
            raise CheckpointError(f"cannot resume: the saved working directory {state['cwd']} "
                                  f"cannot be entered ({exc.strerror}); restore it, or remove "
                                  "the resume state to start over") from None
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state:
            torch.cuda.set_rng_state_all(state["cuda"])
        settings = state.get("torch_settings")
        if settings is not None:
            torch.set_default_dtype(getattr(torch, settings["default_dtype"]))
            if torch.get_num_threads() != settings["num_threads"]:
                torch.set_num_threads(settings["num_threads"])
            torch.use_deterministic_algorithms(settings["deterministic"])
            torch.set_float32_matmul_precision(settings["matmul_precision"])
