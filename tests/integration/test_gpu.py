"""On a CUDA machine: a failure-injected run at world size 2 is bit-identical on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, ecrl
from lineage_check import check_exactly_once, load_run

pytestmark = [pytest.mark.gpu, pytest.mark.torchrun]


def test_cuda_run_with_a_failure_matches_the_uninterrupted_one(tmp_path: Path) -> None:
    world = "2"  # with one GPU its two ranks share it over gloo (ecrl.runtime.trainer.placement)
    common = [*TINY, "--world-sizes", world, "--log-ids"]
    ref = ecrl("run", "--out", str(tmp_path / "ref"), *common, "--strategy", "none")
    assert ref.returncode == 0, ref.stderr
    failed = ecrl("run", "--out", str(tmp_path / "ovl"), *common, "--strategy", "overlapped",
                  "--fail-at", "13")
    assert failed.returncode == 0, failed.stderr
    a, b = load_run(tmp_path / "ref"), load_run(tmp_path / "ovl")
    check_exactly_once(b)
    assert a.final_digest() == b.final_digest()
    assert a.losses() == b.losses(committed_only=False)
