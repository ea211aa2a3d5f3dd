"""``--strategy jit`` with real torchrun ranks, real SIGKILL and SIGSTOP (issue 13).

Every interrupted run must resume with at most one replayed step per failure, end with parameters
and per-step losses bit-identical to its uninterrupted twin, and verify PASS. The moments drawn
at random (an external SIGKILL of rank 1 at a random time inside a random step) are 2 by default;
``-m slow`` runs the 10 the issue asks for (``ECRL_JIT_DRAWS`` overrides either).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Run, RunCache, _made, shared
from lineage_check import load_run

from ecrl.contract.runformat import RunPaths, SupervisorState, read_json_record
from ecrl.runtime.checkpoint.jit import logged_through
from ecrl.runtime.supervision.command import rank_pids

# conftest's TINY at world size 2 (40 steps): the uninterrupted twin is conftest's reference_run,
# made once for the session (the strategy does not change the trajectory, test_trajectory.py).
JIT = ["--dataset-size", "256", "--global-batch", "8", "--steps", "40", "--seed", "7",
       "--world-sizes", "2", "--strategy", "jit"]
JIT_LONG = [("96" if a == "40" else a) for a in JIT]


def _verify(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _state(root: Path) -> SupervisorState:
    return read_json_record(RunPaths.of(root).supervisor, SupervisorState)


def _replayed_per_failure(root: Path) -> list[int]:
    """For each attempt that a later one resumed: steps it logged after that resume point."""
    paths, state = RunPaths.of(root), _state(root)
    out = []
    for a, nxt in zip(state.attempts, state.attempts[1:], strict=False):
        last = max((s for r in range(a.world_size)
                    if (s := logged_through(paths.rank_log(a.attempt, r))) is not None),
                   default=-1)
        resumed = -1 if nxt.resumed_from_step is None else nxt.resumed_from_step
        out.append(max(0, last - resumed))
    return out


def _same_as(run: Path, reference: Path) -> None:
    ours, ref = load_run(run), load_run(reference)
    assert ours.final_digest() == ref.final_digest()
    assert ours.losses() == ref.losses()


@pytest.fixture(scope="session")
def jit_reference(reference_run: Run) -> Run:
    """The uninterrupted twin of the 40-step jit runs: the same settings under ``none``."""
    return reference_run


@pytest.fixture(scope="session")
def jit_reference_long(runs: RunCache) -> Run:
    """The uninterrupted twin of the random-kill runs (96 steps: room for 10 rescues)."""
    return _made(runs.get("jit-reference-96", [*JIT_LONG, "--ckpt-every", "0"]))


@pytest.fixture(scope="session")
def jit_phases(runs: RunCache) -> Run:
    """Rank 1 SIGKILLs itself in step 5's forward (attempt 0, before it logged 5), at the start
    of step 8's backward (attempt 1: logged, its gradients not yet in the all-reduce), just
    before step 11's optimizer step (attempt 2) and just after step 17's (attempt 3)."""
    kills = "5:forward:1:0,8:backward:1:1,11:pre-optimizer:1:2,17:post-optimizer:1:3"
    return _made(runs.get("jit-phases", [*JIT, "--ckpt-every", "0", "--max-restarts", "5"],
                          env={"ECRL_JIT_KILL": kills}))


def test_jit_phases_replay_at_most_one_step_and_match_the_uninterrupted_run(
        jit_phases: Run, jit_reference: Run) -> None:
    state = _state(jit_phases.root)
    assert [a.status for a in state.attempts] == ["jit", "jit", "jit", "jit", "completed"]
    resumed = [a.resumed_from_step for a in state.attempts]
    # Every record is written before its rank's gradients enter the step's all-reduce. Killed
    # before its all-reduce of 5 or 8 (logged or not), rank 1 leaves rank 0 in that all-reduce,
    # with the state after 4 or 7. Killed after its all-reduce of 11 or 17, it logged the step
    # before: rank 0 completes the step, fails in the next one and saves its live state of 11 or
    # 17. No copy of the state is ever taken: every rescue saves the live state.
    assert resumed == [None, 4, 7, 11, 17]
    jits = [state.extra["endings"][str(a)]["jit"] for a in range(4)]
    assert [(j["saved"], j["source"], j["rank"]) for j in jits] == [(True, "live", 0)] * 4
    # Rank 0 logged the step it was in when it learnt of the death (its forward had run): one
    # replayed step per failure, never more.
    assert _replayed_per_failure(jit_phases.root) == [1, 1, 1, 1]
    _same_as(jit_phases.root, jit_reference.root)
    report = _verify(jit_phases.root)
    assert report["verdict"] == "PASS"
    metrics = report["runs"][0]["metrics"]
    assert metrics["replayed_per_failure"] == [1, 1, 1, 1] and metrics["endings"] == {"jit": 4}


# tiny-cnn-bn has BatchNorm: its running statistics change in the forward pass, so by the time a
# survivor saves, the next step's forward has moved them (and DDP broadcast rank 0's into rank 1
# at that forward's start).
def test_jit_rescues_keep_batchnorm_statistics_exact(bn_jit_rescued_run: Run,
                                                     bn_reference_run: Run) -> None:
    # Forward of 3 (rank 0 saves its live state of 2, its buffers as step 3's forward found
    # them), after 9's update (rank 0 fails in DDP's broadcast of its buffers at step 10's
    # forward and saves its live state of 9), rank 0 in the forward of 11 (rank 1 saves its
    # live state of 10 with the buffers DDP broadcast from rank 0 at 11's start): each state's
    # running statistics must be those the next step's forward started from (rank 0's), not
    # the ones it left.
    rescued = bn_jit_rescued_run
    state = _state(rescued.root)
    assert [a.resumed_from_step for a in state.attempts] == [None, 2, 9, 10]
    assert [state.extra["endings"][str(a)]["jit"]["rank"] for a in range(3)] == [0, 0, 1]
    _same_as(rescued.root, bn_reference_run.root)
    assert _verify(rescued.root)["verdict"] == "PASS"


def test_verifier_warns_when_an_ending_replays_more_than_it_promises(
        jit_phases: Run, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(jit_phases.root, copy)
    data = json.loads((copy / "supervisor.json").read_text())
    data["attempts"][1]["status"] = "deadline"  # a deadline stop replays nothing
    (copy / "supervisor.json").write_text(json.dumps(data))
    report = _verify(copy)
    messages = [w["message"] for w in report["runs"][0]["warnings"] if w["kind"] == "ending"]
    assert messages == ["attempt 1 stopped at its deadline, yet 1 of its steps were replayed "
                        "(its final checkpoint should be its last step)"]


def _rank_pids(root: Path, attempt: int) -> dict[int, int]:
    """Rank → pid of this run's trainer processes of ``attempt`` (from /proc)."""
    return {rank: pid for (a, rank), pid in rank_pids(root).items() if a == attempt}


def _drive(root: Path, args: list[str], actions: list[Callable[[Path, int], bool]],
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``ecrl run`` in the background; ``actions[i]`` acts on attempt i once it returns
    True (polled while the attempt runs)."""
    proc = subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", "run", "--out", str(root),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    pending = list(enumerate(actions))
    while pending and proc.poll() is None and time.monotonic() < deadline:
        attempt, action = pending[0]
        if action(root, attempt):
            pending.pop(0)
        else:
            time.sleep(0.002)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    launcher = sorted(f"{k}={v}" for k, v in os.environ.items()
                      if any(t in k for t in ("RANK", "WORLD", "MASTER", "TORCH", "ECRL", "OMP")))
    assert not pending, (f"the run ended before every action fired (what the first waiting "
                         f"one saw: {getattr(pending[0][1], 'seen', None)}; this process's "
                         f"launcher variables: {launcher})\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _first_logged(path: Path) -> int | None:
    try:
        with path.open("rb") as handle:
            line = handle.readline()
        return int(json.loads(line)["global_step"]) if line.endswith(b"\n") else None
    except (OSError, ValueError, KeyError):
        return None


def _stopped(pid: int, timeout: float = 2.0) -> None:
    """Wait until ``pid`` is in the stopped state (a SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("T", "t"):
                return
        time.sleep(0.001)


def _ecrl_processes() -> list[tuple[int, str, str]]:
    """(pid, name, standard output) of the processes named ``ecrl …``: what a scan that found no
    rank saw (a diagnostic)."""
    out: list[tuple[int, str, str]] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                name = (entry / "comm").read_text().strip()
                if name.startswith("ecrl"):
                    out.append((int(entry.name), name, os.readlink(entry / "fd" / "1")))
    return out[:8]


def _signal_when(ready: Callable[[int, int], bool], delay: float, ranks: tuple[int, ...],
                 sig: int, *, into_attempt: bool = False,
                 landed: Callable[[int], bool] | None = None) -> Callable[[Path, int], bool]:
    """Signal ``ranks`` ``delay`` s after ``ready(done, first)`` holds: ``done`` the last step
    rank 1 logged, ``first`` the first step it logged in the attempt (``into_attempt``; else
    0). With ``landed`` (a SIGSTOP of rank 1): once stopped, the rank's last logged step must
    satisfy it, else the rank is continued and the next chance taken. Polls on a loaded machine
    come tens of milliseconds apart, several steps: where a stop lands is read, not guessed."""
    pids: dict[int, int] = {}
    scanned = [0.0]
    seen: dict[str, object] = {"scans": 0}

    def action(root: Path, attempt: int) -> bool:
        if not pids:
            # /proc is scanned until the ranks are found, then each poll only reads the log:
            # a scan per poll let fast steps run several past the one drawn. Scans are 50 ms
            # apart: one every poll (2 ms) kept a core busy while the ranks started.
            if time.monotonic() - scanned[0] < 0.05:
                return False
            scanned[0] = time.monotonic()
            every = rank_pids(root)
            seen["scans"] = int(str(seen["scans"])) + 1
            if every:
                seen["last scan"] = every
            else:
                seen["ecrl processes"] = _ecrl_processes()
            found = {rank: pid for (a, rank), pid in every.items() if a == attempt}
            if not all(r in found for r in ranks):
                return False
            pids.update(found)
        log = RunPaths.of(root).rank_log(attempt, 1)
        done = logged_through(log)
        seen["steps"] = [*list(seen.get("steps", [])), done][-12:]  # type: ignore[call-overload]
        first = _first_logged(log) if into_attempt else 0
        if done is None or first is None or not ready(done, first):
            return False
        time.sleep(delay)
        for r in ranks:
            os.kill(pids[r], sig)
        if landed is not None:
            _stopped(pids[1])
            where = logged_through(log)
            if where is None or not landed(where):
                for r in ranks:
                    os.kill(pids[r], signal.SIGCONT)
                return False
        return True
    action.seen = seen  # type: ignore[attr-defined]
    return action


def _kill_at(step: int, delay: float, ranks: tuple[int, ...], sig: int = signal.SIGKILL,
             *, into_attempt: bool = False) -> Callable[[Path, int], bool]:
    """Signal ``ranks`` ``delay`` s after rank 1 logged global step ``step`` (``into_attempt``:
    the attempt's ``step``-th step, counted from its first, 0 being the first)."""
    return _signal_when(lambda done, first: done >= first + step, delay, ranks, sig,
                        into_attempt=into_attempt)


def _draws() -> int:
    given = os.environ.get("ECRL_JIT_DRAWS")
    return int(given) if given else 2


def _random_kills(tmp_path: Path, jit_reference: Run, draws: int, seed: int) -> None:
    rng = random.Random(seed)
    actions = []
    for _ in range(draws):
        # One or two steps into the attempt (counted from the step it logged first, wherever
        # the previous rescue resumed it), then a random moment inside the next step: forward,
        # all-reduce, update, logging, boundary. 10 draws stay well inside the run's 96 steps
        # (a kill drawn past its last step would hit the shutdown, not a step).
        actions.append(_kill_at(rng.randint(1, 2), rng.uniform(0.0, 0.03), (1,),
                                into_attempt=True))
    root = tmp_path / "run"
    proc = _drive(root, [*JIT_LONG, "--ckpt-every", "0", "--max-restarts", str(draws + 2)],
                  actions)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = _state(root)
    assert state.attempts[-1].status == "completed"
    assert len(state.attempts) == draws + 1
    assert all(a.status == "jit" for a in state.attempts[:-1])
    replayed = _replayed_per_failure(root)
    assert all(n <= 1 for n in replayed), replayed
    _same_as(root, jit_reference.root)
    assert _verify(root)["verdict"] == "PASS"


# A kill drawn before the attempt's first step (start-up is slow on a loaded 2-core machine)
# ends the attempt without a rescue: flaky in the default suite, so it runs in `make test-long`.
@pytest.mark.slow
def test_jit_sigkill_of_rank_1_at_random_moments(tmp_path: Path,
                                                 jit_reference_long: Run) -> None:
    _random_kills(tmp_path, jit_reference_long, _draws(), seed=1234)


@pytest.mark.slow
def test_jit_sigkill_of_rank_1_at_ten_random_moments(tmp_path: Path,
                                                     jit_reference_long: Run) -> None:
    _random_kills(tmp_path, jit_reference_long, int(os.environ.get("ECRL_JIT_DRAWS", "10")),
                  seed=99)


HUNG_EVERY = 8
"""The periodic checkpoints of the hung-rank run: after steps 7, 15, 23, …"""


def _early_in_an_interval(done: int, first: int) -> bool:
    """Rank 1 logged a step early in a checkpoint interval of the first three after the first
    commit (steps 9-13, 17-21, 25-29): time to stop it. Where the stop landed is checked by
    :func:`_landed_before_a_commit`; a stop drawn at a fixed step could land after the next
    commit when the ranks were found late (steps are ~6 ms here)."""
    return HUNG_EVERY < done <= 3 * HUNG_EVERY + 5 and done % HUNG_EVERY <= 5


def _landed_before_a_commit(done: int) -> bool:
    """Rank 1 stopped after a step that no periodic commit covers (not 7, 15, 23 …: the survivor
    has something to rescue) and early enough that attempt 1 reaches a periodic commit 9 steps
    into it before the run's 40 steps end."""
    return HUNG_EVERY < done <= 3 * HUNG_EVERY + 5 and done % HUNG_EVERY != HUNG_EVERY - 1


def _stopped_then_all_killed(directory: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = directory / "run"
    proc = _drive(root, [*JIT, "--ckpt-every", str(HUNG_EVERY),
                         "--hang-timeout-s", str(HANG_BOUND_S)],
                  [_signal_when(_early_in_an_interval, 0.0, (1,), signal.SIGSTOP,
                                landed=_landed_before_a_commit),
                   _kill_at(9, 0.005, (0, 1), into_attempt=True)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, proc


@pytest.fixture(scope="session")
def stopped_then_all_killed(runs: RunCache) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One run (made once for the session) for two endings: rank 1 SIGSTOPped early in a
    checkpoint interval of attempt 0 (hung: the survivor's rescue), then in attempt 1 every rank
    SIGKILLed at once 9 steps into it (no survivor: the periodic checkpoints, every 8 steps, are
    all there is)."""
    return shared(runs, "jit-hung-then-killed", _stopped_then_all_killed)


HANG_BOUND_S = 3.0


def test_jit_every_rank_killed_at_once_falls_back_to_the_periodic_checkpoint(
        stopped_then_all_killed: tuple[Path, subprocess.CompletedProcess[str]],
        jit_reference: Run) -> None:
    root, _ = stopped_then_all_killed
    state = _state(root)
    assert [a.status for a in state.attempts] == ["hung", "failed", "completed"]
    assert not (RunPaths.of(root).attempt_dir(1) / "jit.json").exists()
    resumed = state.attempts[2].resumed_from_step
    assert resumed is not None and (resumed + 1) % HUNG_EVERY == 0  # a periodic checkpoint
    # of attempt 1 (not attempt 0's rescue, where attempt 1 began)
    began = state.attempts[1].resumed_from_step
    assert began is not None and resumed > began
    taken = {json.loads(line)["global_step"]
             for line in RunPaths.of(root).checkpoint_log(1).read_text().splitlines()}
    # A blocking commit writes its event after publishing (docs/strategies.md): a kill between
    # the two leaves attempt 1's last periodic checkpoint without its event, the supervisor's
    # resume point testifying for it instead.
    assert resumed in taken or (
        resumed == max(taken) + HUNG_EVERY == state.attempts[1].last_step), (
        resumed, taken)
    _same_as(root, jit_reference.root)
    assert _verify(root)["verdict"] == "PASS"


def test_a_stopped_rank_is_detected_as_hung_and_the_run_completes(
        stopped_then_all_killed: tuple[Path, subprocess.CompletedProcess[str]],
        jit_reference: Run) -> None:
    root, proc = stopped_then_all_killed
    bound = HANG_BOUND_S
    state = _state(root)
    assert [a.status for a in state.attempts][:1] == ["hung"]
    assert state.attempts[-1].status == "completed"
    ending = state.extra["endings"]["0"]
    assert ending["stopped_ranks"] == [1]
    # once the survivor had saved and gone, the supervisor killed the stopped rank (torchrun's
    # SIGTERM cannot reach a stopped process: its 30 s grace was part of every such recovery)
    assert ending["hung_ranks_killed"] == 1
    seen = ending["hung"]["0"]
    # Detected within the bound (plus the watchdog's polling step, bound / 20).
    assert seen["bound_s"] == bound and seen["waited_s"] <= bound * 1.05 + 0.1
    assert ending["jit"]["saved"] is True
    assert "rank 1 stopped stepping" in proc.stdout
    _same_as(root, jit_reference.root)
    assert _verify(root)["verdict"] == "PASS"
