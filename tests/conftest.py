"""Shared test settings: hypothesis profiles and the gpu marker."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# ci: derandomized and small enough for `make test`; long: `make test-long`.
settings.register_profile(
    "ci", max_examples=60, derandomize=True, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=2000, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
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
