"""``ecrl launch`` around a user's own script (docs/examples/ddp_train.py), real torchrun runs.

The must-hold of issue 15: the example under two injected failures and world sizes 2 → 1 ends
with parameters and per-step losses bit-identical to its uninterrupted run at the same world
sizes, and ecrl-verify says PASS with windows checked. "The same world sizes": a world-size change
needs a relaunch, so the reference changes from 2 to 1 at the same step boundary (a failure right
after the checkpoint of step 7, nothing replayed) and then runs uninterrupted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLE_JIT, RUN_TIMEOUT_S, Run, RunCache, ecrl

pytestmark = pytest.mark.torchrun

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ddp_train.py"
COMMON = ["--strategy", "blocking", "--ckpt-every", "4", "--world-sizes", "2,1"]
SCRIPT = ["--", "python", str(EXAMPLE), "--steps", "30"]


def _made(run: Run) -> Run:
    assert run.returncode == 0, f"ecrl exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def failed_run(runs: RunCache) -> Run:
    return _made(runs.get("launch-failed", [*COMMON, "--fail-at", "9,21", *SCRIPT],
                          command="launch"))


@pytest.fixture(scope="module")
def reference_run(runs: RunCache) -> Run:
    return _made(runs.get("launch-reference", [*COMMON, "--fail-at", "7", *SCRIPT],
                          command="launch"))


def committed_losses(root: Path) -> dict[tuple[int, int], float]:
    """(step, rank) → loss over the committed lineage (supervisor.json's resume points)."""
    attempts = json.loads((root / "supervisor.json").read_text())["attempts"]
    out: dict[tuple[int, int], float] = {}
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1]["resumed_from_step"] if i + 1 < len(attempts) else None
        limit = 10**9 if i + 1 == len(attempts) else (-1 if nxt is None else nxt)
        for path in sorted((root / "logs" / f"attempt-{a['attempt']:03d}").glob("rank-*.jsonl")):
            for line in path.read_text().splitlines():
                r = json.loads(line)
                if r["global_step"] <= limit:
                    out[(r["global_step"], r["rank"])] = r["loss"]
    return out


def verify_json(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "verifier.cli", "--format", "json", str(root)],
                          capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)


def test_failed_run_is_what_it_claims(failed_run: Run, reference_run: Run) -> None:
    state = json.loads((failed_run.root / "supervisor.json").read_text())
    assert [a["world_size"] for a in state["attempts"]] == [2, 1, 1]
    assert [f["global_step"] for f in state["injected_failures"]] == [9, 21]
    assert [a["resumed_from_step"] for a in state["attempts"]] == [None, 7, 19]
    ref = json.loads((reference_run.root / "supervisor.json").read_text())
    assert [(a["world_size"], a["resumed_from_step"]) for a in ref["attempts"]] == [
        (2, None), (1, 7)]
    assert "Traceback" not in failed_run.stdout + failed_run.stderr


def test_example_with_two_failures_2_to_1_is_bit_identical(failed_run: Run,
                                                           reference_run: Run) -> None:
    ours, ref = committed_losses(failed_run.root), committed_losses(reference_run.root)
    assert len(ours) == 8 * 2 + 22  # steps 0..7 on 2 ranks, 8..29 on 1
    assert ours == ref
    mine = torch.load(failed_run.root / "final.pt")
    theirs = torch.load(reference_run.root / "final.pt")
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_example_verifies_pass_with_windows_checked(failed_run: Run) -> None:
    manifest = json.loads((failed_run.root / "run.json").read_text())
    assert manifest["sampler"]["kind"] == "ecrl"
    assert manifest["target_steps"] == 30 and manifest["world_sizes"] == [2, 1]
    report = verify_json(failed_run.root)
    assert report["verdict"] == "PASS", report
    checked = report["runs"][0]["checked"]
    # Every committed record's shard was compared with its window.
    assert checked["shards"] == checked["committed_records"] == 38


def test_bad_use_stops_with_one_line_and_no_relaunch(runs: RunCache) -> None:
    run = runs.get("launch-bad-batch", ["--world-sizes", "2", "--", "python", str(EXAMPLE),
                                        "--steps", "6", "--batch", "7"], command="launch")
    assert run.returncode == 1
    assert "global batch 7 is not divisible by world size 2" in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    state = json.loads((run.root / "supervisor.json").read_text())
    assert len(state["attempts"]) == 1 and state["status"] == "failed"


BUGGY_COLLATE = """
import torch
from torch.utils.data import DataLoader
import ecrl

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.zeros(2)

def my_collate(items):  # receives (id, item) pairs under WithSampleIds: ids are not tensors
    return torch.stack([x for x, _ in items])

sampler = ecrl.GlobalBatchSampler(16, 4, steps=4)
log = ecrl.StepLog(sampler=sampler, steps=4)
loader = DataLoader(ecrl.WithSampleIds(Rows()), batch_sampler=sampler, num_workers=1,
                    collate_fn=my_collate)
for ids in loader:
    pass
"""


def test_an_error_in_the_script_stops_at_once_with_the_workers_real_error(
        tmp_path: Path) -> None:
    """A TypeError raised in a DataLoader worker was relaunched once before being declared
    fatal, and its one line named only the wrapper (issue 25, item 7)."""
    script = tmp_path / "train.py"
    script.write_text(BUGGY_COLLATE)
    done = ecrl("launch", "--out", str(tmp_path / "run"), "--", "python", str(script))
    assert done.returncode == 1, done.stderr
    state = json.loads((tmp_path / "run" / "supervisor.json").read_text())
    assert len(state["attempts"]) == 1 and state["status"] == "failed", state
    assert "expected Tensor as element 0" in done.stderr, done.stderr
    assert "DataLoader worker process 0" in done.stderr and "my_collate" in done.stderr


LOG_ONLY = """
import ecrl

sampler = ecrl.GlobalBatchSampler(16, 4, steps=6)
log = ecrl.StepLog(sampler=sampler, steps=6)
for step, ids in zip(range(6), sampler):
    log.step(step, sample_ids=ids)
log.close()
"""


def test_failures_a_script_never_injects_do_not_end_the_run_0(tmp_path: Path) -> None:
    """A script with a step log but no Checkpointer (and no framework integration) cannot
    inject --fail-at: the run completes, and the launch says that nothing it asked was tried
    (it ended 0 with no recovery at all)."""
    script = tmp_path / "train.py"
    script.write_text(LOG_ONLY)
    done = ecrl("launch", "--out", str(tmp_path / "run"), "--fail-at", "2", "--", "python",
                str(script))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--fail-at 2 never fired: the script injects no failures" in done.stderr
    state = json.loads((tmp_path / "run" / "supervisor.json").read_text())
    assert state["status"] == "completed" and len(state["attempts"]) == 1


def test_ctrl_c_then_launch_again_continues_to_a_verified_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "ecrl.apps.cli", "launch", "--out", str(out), "--world-sizes",
           "1", "--strategy", "blocking", "--ckpt-every", "5", "--", "python", str(EXAMPLE),
           "--steps", "150", "--workers", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "logs" / "attempt-000" / "rank-000.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (log.exists() and log.read_text().count("\n") >= 12):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout
    assert json.loads((out / "supervisor.json").read_text())["status"] == "stopped"
    assert "ecrl launch --out" in stdout
    # Continue: no script, no settings: all of them come from the run directory.
    again = ecrl("launch", "--out", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    state = json.loads((out / "supervisor.json").read_text())
    assert state["status"] == "completed" and state["attempts"][1]["resumed_from_step"] >= 9
    assert verify_json(out)["verdict"] == "PASS"


def test_jit_rescues_a_loop_not_inside_with_ckpt(runs: RunCache, example_whole_run: Run) -> None:
    # docs/examples/ddp_train.py does not wrap its loop in `with ckpt:`: the survivor's rescue
    # comes from the exception hook the jit checkpointer installs, not from __exit__.
    rescued = _made(runs.get("launch-jit", ["--fail-at", "9", *EXAMPLE_JIT], command="launch"))
    whole = example_whole_run
    state = json.loads((rescued.root / "supervisor.json").read_text())
    assert [a["status"] for a in state["attempts"]] == ["jit", "completed"]
    assert state["attempts"][1]["resumed_from_step"] == 9  # nothing replayed
    assert verify_json(rescued.root)["verdict"] == "PASS"
    mine = torch.load(rescued.root / "final.pt")
    theirs = torch.load(whole.root / "final.pt")
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
