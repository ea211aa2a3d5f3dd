"""Shared test settings: hypothesis profiles and the gpu marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

# ci: derandomized and small enough for `make test`; long: `make test-long`; gpu: `make
# test-gpu`'s drawn failure schedules, each a real run of 2-3 attempts (about 25 s on a GPU
# machine): 4 per strategy (ECRL_GPU_EXAMPLES), the strategies in parallel, within 6 minutes on
# one GPU. No shrinking there: a failing schedule is reported as drawn, not re-run for minutes.
settings.register_profile(
    "ci", max_examples=60, derandomize=True, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=2000, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "gpu", max_examples=int(os.environ.get("ECRL_GPU_EXAMPLES", "4")), derandomize=True,
    print_blob=True, deadline=None, database=None,
    phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return  # importing torch costs seconds: only probe CUDA when a gpu test is collected
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
