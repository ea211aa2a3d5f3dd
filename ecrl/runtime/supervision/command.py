"""The torchrun command line of an attempt, its environment, and starting it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ecrl.contract.runformat import LatestPointer, RunPaths
from ecrl.runtime._proc import signal_on_parent_death
from ecrl.runtime.launchenv import GO_VARIABLE, AttemptEnv
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.settings import SupervisorSettings, TrainerSettings
from ecrl.runtime.supervision.standby import STANDBY_DIR
from ecrl.runtime.trainer.agent import RANK_NAME, forked_torchrun

__all__ = ["TORCHRUN_LOG", "TRAINER", "torchrun_command", "attempt_env", "environment",
           "rank_pids", "start_torchrun"]

TORCHRUN_LOG = "torchrun.log"
TRAINER = ("-m", "ecrl.runtime.trainer")
"""What ``ecrl run`` has torchrun run on every rank."""


def torchrun_command(settings: SupervisorSettings, paths: RunPaths, attempt: int, world: int,
                     program: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run … PROGRAM`` for ``attempt`` at world size ``world``."""
    c = settings
    if c.nnodes == 1 and not c.rdzv_endpoint:
        # --standalone: a private rendezvous on a free port, so parallel runs never collide.
        launch = ["--standalone", "--nnodes", "1"]
    else:
        launch = ["--nnodes", str(c.nnodes), "--rdzv-backend", c.rdzv_backend or "c10d",
                  "--rdzv-endpoint", str(c.rdzv_endpoint),
                  # One rendezvous per attempt: an agent of a dead attempt still up on another
                  # node can never join the next one.
                  "--rdzv-id", f"{c.rdzv_id or 'ecrl-' + paths.root.name}-{attempt}"]
        if c.rdzv_conf:
            launch += ["--rdzv-conf", c.rdzv_conf]
    # torchrun polls its ranks every monitor interval: a failed rank is noticed (and the attempt
    # ended) that much later, time every recovery loses; 0.1 s costs no measurable CPU.
    launch += ["--nproc-per-node", str(world // c.nnodes), "--max-restarts", "0",
               "--monitor-interval", "0.1"]
    if tuple(program) == TRAINER:
        return forked_torchrun(launch)  # the trainer imported once, its ranks forked from it
    return [sys.executable, "-m", "torch.distributed.run", *launch, *program]


def attempt_env(config: RunConfig, paths: RunPaths, attempt: int, pointer: LatestPointer | None,
                fail_at: Sequence[int], world_sizes: Sequence[int],
                deadline: float | None) -> AttemptEnv:
    """What the ranks of ``attempt`` learn from their environment (``ecrl.runtime.launchenv``)."""
    return AttemptEnv(
        run_dir=str(paths.root), attempt=attempt,
        resume_step=None if pointer is None else pointer.global_step,
        resume_path=None if pointer is None else pointer.path,
        resume_checksum=None if pointer is None else pointer.checksum,
        fail_at=tuple(fail_at), fail_rank=config.fail_rank,
        # Only the checkpoint settings the user gave: the script's own choices stand for the
        # others (ecrl.runtime.settings; the built-in trainer passes its configuration).
        checkpoint=config.checkpoint_given, world_sizes=tuple(world_sizes), deadline=deadline,
        # The mesh settings likewise: given ones only (ecrl.init_mesh: given > script > default).
        **{name: getattr(config, name) for name in ("parallel", "replicate", "tp")
           if name in config.explicit})


def environment(trainer: TrainerSettings, ranks_per_node: int,
                variables: Mapping[str, str]) -> dict[str, str]:
    """torchrun's environment: ours, plus the attempt's ``variables`` and deterministic math."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(trainer.threads_per_rank(ranks_per_node)))
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    env["PYTHONUNBUFFERED"] = "1"
    env.update(variables)
    return env


def _torchrun_preexec() -> None:
    signal_on_parent_death(signal.SIGTERM)


def start_torchrun(command: Sequence[str], env: Mapping[str, str],
                   log_path: Path) -> subprocess.Popen[bytes]:
    """Start torchrun with its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        # A session of its own keeps the terminal's Ctrl-C away from torchrun (the supervisor
        # decides how to stop it); the parent-death signal stops it if we are killed outright.
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env),
                                start_new_session=True, preexec_fn=_torchrun_preexec)


_STANDBY_GO = re.compile(r"attempt-(\d+)\.go")
_RANK_PREFIX = RANK_NAME.format("")


def rank_pids(root: Path) -> dict[tuple[int, int], int]:
    """``(attempt, rank) → pid`` of the built-in trainer's live ranks of the run in ``root`` on
    this host (Linux ``/proc``; elsewhere none), a standby's waiting ranks included.

    A rank is forked from its attempt's agent without ``exec`` (:mod:`ecrl.runtime.trainer.agent`),
    so ``/proc`` shows the agent's command line and initial environment for it: the rank is known
    by its name, and its run and attempt by that environment (the attempt's variables, or a
    standby's go file)."""
    found: dict[tuple[int, int], int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                name = Path(entry.path, "comm").read_text().rstrip("\n")
                if not name.startswith(_RANK_PREFIX):
                    continue
                raw = Path(entry.path, "environ").read_bytes()
            except OSError:
                continue  # gone, or not ours to read
            env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                       if "=" in item)
            attempt = _attempt_of(env, root)
            rank = name.removeprefix(_RANK_PREFIX)
            if attempt is not None and rank.isdigit():
                found[(attempt, int(rank))] = int(entry.name)
    return found


def _attempt_of(env: Mapping[str, str], root: Path) -> int | None:
    if env.get("ECRL_RUN_DIR") == str(root) and env.get("ECRL_ATTEMPT", "").isdigit():
        return int(env["ECRL_ATTEMPT"])
    go = Path(env.get(GO_VARIABLE, "/"))
    match = _STANDBY_GO.fullmatch(go.name)
    if match is not None and go.parent == root / STANDBY_DIR:
        return int(match.group(1))
    return None
