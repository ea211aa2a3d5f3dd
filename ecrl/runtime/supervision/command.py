"""The torchrun command line of an attempt, its environment, and starting it."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ecrl.contract.runformat import LatestPointer, RunPaths
from ecrl.runtime._proc import (
    ChildProcess,
    ForkedProcess,
    can_fork_safely,
    fork_process,
    name_process,
    signal_on_parent_death,
)
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.settings import SupervisorSettings, TrainerSettings
from ecrl.runtime.supervision.standby import STANDBY_DIR
from ecrl.runtime.trainer.agent import (
    AGENT_MODULE,
    RANK_NAME,
    forked_torchrun,
    import_torchrun,
    preload,
)

__all__ = ["TORCHRUN_LOG", "TRAINER", "torchrun_command", "attempt_env", "environment",
           "rank_pids", "start_torchrun"]

TORCHRUN_LOG = "torchrun.log"
TRAINER = ("-m", "ecrl.runtime.trainer")
"""What ``ecrl run`` has torchrun run on every rank."""
TORCHRUN_MODULE = "torch.distributed.run"
AGENT_NAME = "ecrl agent"
"""A forked agent's process name (``ps``, ``/proc/PID/comm``)."""


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
    return [sys.executable, "-m", TORCHRUN_MODULE, *launch, *program]


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


def _torchrun_alone() -> Callable[..., None]:
    """Import torchrun (then freeze what the import made); its ``main``."""
    torchrun_main = import_torchrun()
    gc.freeze()
    return torchrun_main


_PRELOADS: dict[str, Callable[[], Callable[..., None]]] = {
    AGENT_MODULE: preload,  # ecrl run: torchrun and the trainer its ranks fork from
    TORCHRUN_MODULE: _torchrun_alone,  # ecrl launch: torchrun, whose ranks start the script
}
_preloaded: dict[str, Callable[..., None]] = {}
"""torchrun's ``main`` per agent module, once this process imported it."""


def _start_forked(command: Sequence[str], env: Mapping[str, str],
                  log_path: Path) -> ForkedProcess | None:
    """Start the agent ``command`` (``python -m MODULE ARGS``, MODULE torchrun or the trainer's
    agent, with ``--standalone``) as a fork of this process, the agent's imports made here the
    first time; None when it is another command or this process cannot fork safely."""
    if len(command) < 3 or list(command[:2]) != [sys.executable, "-m"] \
            or command[2] not in _PRELOADS or not can_fork_safely():
        return None
    if "--standalone" not in command:
        # Only with a private rendezvous. A forked agent starts within milliseconds, and on
        # several nodes it can reach the rendezvous store of the previous attempt while that
        # store's host, another node's old agent, is still exiting: seen with two nodes on one
        # machine, the new agent dropped and the nodes' attempt numbers parted for good.
        return None
    module = command[2]
    if module not in _preloaded:
        _preloaded[module] = _PRELOADS[module]()
        if not can_fork_safely():  # the imports started a thread: never seen, but not forked
            return None
    torchrun_main, args = _preloaded[module], list(command[3:])

    def run_agent() -> None:
        name_process(AGENT_NAME)
        torchrun_main(args)

    return fork_process(run_agent, env=env, output=log_path)


def start_torchrun(command: Sequence[str], env: Mapping[str, str],
                   log_path: Path) -> ChildProcess:
    """Start torchrun with its output appended to ``log_path``: as a fork of this process, its
    imports made once per process, where it can (every attempt's agent of a run then starts
    without an interpreter's start-up or ``import torch``), else as a new process."""
    forked = _start_forked(command, env, log_path)
    if forked is not None:
        return forked
    with open(log_path, "ab") as log:
        # A session of its own keeps the terminal's Ctrl-C away from torchrun (the supervisor
        # decides how to stop it); the parent-death signal stops it if we are killed outright.
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env),
                                start_new_session=True, preexec_fn=_torchrun_preexec)


_STANDBY_LOG = re.compile(r"attempt-(\d+)\.torchrun\.log")
_ATTEMPT_DIR = re.compile(r"attempt-(\d+)")
_RANK_PREFIX = RANK_NAME.format("")


def rank_pids(root: Path) -> dict[tuple[int, int], int]:
    """``(attempt, rank) → pid`` of the built-in trainer's live ranks of the run in ``root`` on
    this host (Linux ``/proc``; elsewhere none), a standby's waiting ranks included.

    A rank is forked from its attempt's agent without ``exec`` (:mod:`ecrl.runtime.trainer.agent`),
    and the agent may itself be a fork of the supervisor, so ``/proc`` shows the command line and
    initial environment of whichever process last started an interpreter. The rank is known by
    its name, and its run and attempt by its standard output, the agent's torchrun log that it
    inherits: ``RUN/logs/attempt-N/torchrun*.log``, or a standby's ``RUN/.standby/attempt-N.
    torchrun.log`` (a standby's log, moved into the attempt's folder when the standby is used,
    is found under its new name)."""
    found: dict[tuple[int, int], int] = {}
    root = root.resolve()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                name = Path(entry.path, "comm").read_text().rstrip("\n")
                if not name.startswith(_RANK_PREFIX):
                    continue
                output = Path(os.readlink(Path(entry.path, "fd", "1")))
            except OSError:
                continue  # gone, or not ours to read
            attempt = _attempt_of(output, root)
            rank = name.removeprefix(_RANK_PREFIX)
            if attempt is not None and rank.isdigit():
                found[(attempt, int(rank))] = int(entry.name)
    return found


def _attempt_of(output: Path, root: Path) -> int | None:
    """The attempt whose torchrun log ``output`` is, in the run ``root``; None if it is not."""
    if output.parent.parent == RunPaths.of(root).logs and output.name.startswith("torchrun") \
            and output.name.endswith(".log"):
        match = _ATTEMPT_DIR.fullmatch(output.parent.name)
    elif output.parent == root / STANDBY_DIR:
        match = _STANDBY_LOG.fullmatch(output.name)
    else:
        return None
    return None if match is None else int(match.group(1))
