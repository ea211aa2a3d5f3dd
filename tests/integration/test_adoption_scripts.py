"""The short adoption scripts docs/frameworks.md counts, run for real: each framework's plain
script with ECRL's exact mode adopted (docs/examples/adoption/*_exact.py, at most five lines
more), under ``ecrl launch`` with two injected failures. The script is unchanged otherwise: the
framework's own checkpoints and documented resume, ECRL's sampler and step log through the
integration."""

from __future__ import annotations

import json

import pytest
from framework_runs import ROOT, ecrl_launch, framework_env

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from verifier import render_text, verify_run

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
    assert f"resumed by the script from {framework}'s own checkpoint" in stdout, stdout
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == STEPS
    state = json.loads((run / "supervisor.json").read_text())
    # Each resume is the framework's own, from its newest checkpoint before the failure (every
    # 3 steps: after steps 5 and 14).
    assert [a["resumed_from_step"] for a in state["attempts"]] == [None, 5, 14]
    assert [f["global_step"] for f in state["injected_failures"]] == [7, 16]
    # The last attempt recorded itself completed, though the script never closes the step log
    # (the integration does: at the end of training, or at the process's exit).
    last = read_json_record(RunPaths.of(run).attempt_record(2), AttemptRecord)
    assert last.status == "completed"
