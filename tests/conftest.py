"""Shared test settings: hypothesis profiles, the gpu marker, collection without the cyclic
collector, and loader workers shut down with the test that started them."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings

from ecrl.contract.gcpause import collection_paused

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


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Collection imports every test module, and with them torch, Lightning, transformers and
    Ray's client: millions of objects and next to no garbage. With the cyclic collector held off
    it takes a third less CPU in each worker, and frozen afterwards (``gc.freeze``) those objects
    are no longer walked by the collections the tests themselves set off."""
    with collection_paused():
        yield
    gc.freeze()


@pytest.fixture(autouse=True)
def _loader_workers_end_with_their_test() -> Iterator[None]:
    """A DataLoader iterator left with its workers running (a loop that breaks, a test that takes
    a few batches) and caught in a reference cycle is shut down only by a later collection, in
    whichever test that lands, and torch's shutdown from the cyclic collector can wait 5 s per
    worker (three such iterators once stalled an unrelated test for 30 s; the cycle was the
    transform runtime's, fixed there). Collected here, at the end of the test that made it, and
    only when worker processes are alive, so such a stall shows in that test's own teardown."""
    yield
    if multiprocessing.active_children():
        gc.collect()


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
