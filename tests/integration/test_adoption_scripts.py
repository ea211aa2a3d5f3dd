"""The short adoption scripts docs/frameworks.md counts, run for real: each framework's plain
script with ECRL's exact mode adopted (docs/examples/adoption/*_exact.py, at most five lines
more), under ``ecrl launch`` with two injected failures. The script is unchanged otherwise: the
framework's own checkpoints and documented resume, ECRL's sampler and step log through the
integration."""

from __future__ import annotations

import pytest
from framework_runs import ROOT, assert_resumed_by_the_framework, ecrl_launch, framework_env

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record

pytestmark = pytest.mark.torchrun

ADOPTION = ROOT / "docs" / "examples" / "adoption"
STEPS = 24  # the scripts' default: 64 samples, global batch 8, 3 epochs; checkpoints every 3


ENVIRONMENTS = {
    "lightning": framework_env("PL_"),
    "accelerate": framework_env("ACCELERATE_"),
    "transformers": framework_env("ACCELERATE_", HF_HUB_OFFLINE="1",
                                  TRANSFORMERS_VERBOSITY="error"),
}


@pytest.mark.parametrize("framework", list(ENVIRONMENTS))
def test_the_exact_adoption_passes_through_two_failures(tmp_path_factory: pytest.TempPathFactory,
                                                       framework: str) -> None:
    pytest.importorskip(framework)
    run = tmp_path_factory.mktemp(f"adopted-{framework}") / "run"
    run, stdout = ecrl_launch(run, ["--world-sizes", "2", "--fail-at", "7,16"],
                              ADOPTION / f"{framework}_exact.py", [str(run)],
                              ENVIRONMENTS[framework])
    # Each resume is the framework's own, from its newest checkpoint before the failure (every
    # 3 steps: after steps 5 and 14).
    assert_resumed_by_the_framework(run, stdout, framework, steps=STEPS,
                                    attempts=[(2, None), (2, 5), (2, 14)], failures=[7, 16])
    # The last attempt recorded itself completed, though the script never closes the step log
    # (the integration does: at the end of training, or at the process's exit).
    last = read_json_record(RunPaths.of(run).attempt_record(2), AttemptRecord)
    assert last.status == "completed"
