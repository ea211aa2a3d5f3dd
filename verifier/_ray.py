"""``ecrl-verify --ray [ADDRESS]``: the rank logs scanned as Ray tasks.

The same scan as ``--jobs`` (:func:`verifier._parallel.scan_file`, one task per rank log), sent
to a Ray cluster instead of a local process pool; the parent judges the batches the tasks return
exactly as it judges a local scan, so the report is the same. The tasks open the logs by the
paths the parent sees: on a cluster, the run directory must be on a file system every node
mounts at the same path (where the run wrote it), and ``verifier`` importable on every node.

Ray is optional (``pip install 'ecrl[ray]'``); this module imports it only when called.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from ecrl.contract.extras import require
from verifier._parallel import ScannedFile, ScanTask, Submit, scan_file

__all__ = ["ray_workers", "LOCAL"]

LOCAL = "local"
"""``--ray`` without an address: a Ray instance started on this machine for the verification."""


@contextmanager
def ray_workers(address: str, *, jobs: int) -> Iterator[Submit]:
    """Submit scans as Ray tasks: on the cluster at ``address`` (``auto``: the one this machine
    belongs to), or with :data:`LOCAL` on a Ray started here with ``jobs`` CPUs and stopped
    after."""
    require("ray", what="--ray")
    import ray

    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                               "logging_level": logging.ERROR, "configure_logging": False}
    if address == LOCAL:
        options["num_cpus"] = jobs
    else:
        options["address"] = address
    started = not ray.is_initialized()
    if started:
        ray.init(**options)
    task = ray.remote(num_cpus=1)(scan_file)

    def submit(scan: ScanTask) -> Future[ScannedFile]:
        future: Future[ScannedFile] = task.remote(scan).future()
        return future

    try:
        yield submit
    finally:
        if started:
            ray.shutdown()
