"""``--verify-follow``: ``ecrl-verify --follow`` beside a real ``ecrl run`` with an injected
failure ends with the offline verdict, and the supervisor's summary says it."""

from __future__ import annotations

from pathlib import Path

from conftest import TINY, ecrl

from verifier import verify


def test_verify_follow_beside_a_run_with_a_failure(tmp_path: Path) -> None:
    root = tmp_path / "run"
    out = ecrl("run", "--out", str(root), *TINY, "--world-sizes", "2", "--strategy", "blocking",
               "--fail-at", "9", "--verify-follow")
    assert out.returncode == 0, out.stdout + out.stderr
    offline = verify(root)
    assert offline.verdict == "PASS"
    assert f"verify:       {offline.verdict} (ecrl-verify --follow" in out.stdout, out.stdout
    # The follower saw the run while it trained, not only at its end.
    progress = [line for line in out.stderr.splitlines()
                if line.startswith("[ecrl-verify --follow] running")]
    assert progress, out.stderr
    assert "[ecrl-verify --follow] completed" in out.stderr
