"""``ecrl launch``: the supervisor around a user's own training script (torch-free).

``ecrl launch [options] -- python train.py ARGS`` runs ``train.py`` under torchrun on every rank of
every attempt, exactly as ``ecrl run`` runs the built-in trainer (which is ``ecrl launch`` of
``-m ecrl.runtime.trainer``): world-size schedule, injected failures, relaunch from the last
durable checkpoint, Ctrl-C and continue with ``ecrl launch --out SAME``, ``supervisor.json`` and
the same summary. The script learns its attempt from the ``ECRL_*`` environment
(:mod:`ecrl.runtime.launchenv`) through the library (:class:`ecrl.StepLog`,
:class:`ecrl.Checkpointer`), so its own arguments stay its own.

What differs from ``ecrl run``: the data set, the model, the global batch and the number of steps
are the script's business. The script's :class:`ecrl.StepLog` writes ``run.json`` on the first
attempt; the supervisor reads the target step from it once it exists. The supervisor's own
settings (world sizes, checkpoint strategy and interval, failures) are kept in
``supervisor.json`` under ``launch``, so that ``ecrl launch --out DIR`` alone continues a run.

The checkpoint settings (:class:`ecrl.runtime.settings.CheckpointSettings`) follow one precedence:
a flag given (now or by the launch this one continues) > the script's own ``Checkpointer``
argument > the default. The supervisor passes the ranks only the flags that were given (kept
under ``launch.given``); the script's Checkpointer resolves the rest and rank 0 records the result
with each value's source, which the summary prints.

Several nodes: one ``ecrl launch`` per node, all with the same ``--nnodes``, ``--rdzv-endpoint``,
``--rdzv-id`` and ``--out`` on a file system every node shares; ``--node-rank 0`` on exactly one of
them, which keeps ``supervisor.json`` (the others keep ``supervisor-node-K.json``). Every rank
resumes from the checkpoint global rank 0's supervisor chose (the checkpointer broadcasts it).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import (
    AttemptRecord,
    CheckpointEvent,
    JsonlReader,
    RunManifest,
    RunPaths,
    SupervisorState,
    read_json_record,
)
from ecrl.runtime.manifest import build_manifest
from ecrl.runtime.runconfig import LAUNCH_KEYS, RunConfig
from ecrl.runtime.runlock import held_elsewhere, in_use
from ecrl.runtime.supervision.events import (
    Reporter,
    RunAlreadyComplete,
    RunCompleted,
    RunOpened,
    RunResumed,
    ScriptEndedShort,
    Silent,
)
from ecrl.runtime.supervision.policy import Outcome
from ecrl.runtime.supervision.rundir import with_strays
from ecrl.runtime.supervision.supervisor import LOCK_FILE, Supervisor

__all__ = ["LAUNCH_KEYS", "LaunchSupervisor", "launch_config", "normalize_program", "run_launch"]

_SAME_RUN_KEYS = ("world_sizes", "ckpt_every", "strategy", "fail_at")
_PYTHONS = ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")


# Launchers that start processes themselves: under ecrl launch each of torchrun's ranks would
# start a whole job of its own (W x W processes, each group a run of its own world size), which
# writes logs that end "completed" and then fail verification. Command (basename, subcommand or
# None) and module run with `python -m`, each with what it does.
_LAUNCHERS = {("torchrun", None): "torchrun", ("accelerate", "launch"): "accelerate launch",
              ("accelerate-launch", None): "accelerate launch",
              ("lightning", "run"): "lightning run", ("fabric", "run"): "fabric run",
              ("deepspeed", None): "deepspeed"}
_LAUNCHER_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                     "accelerate.commands.launch": "accelerate launch",
                     "accelerate.commands.accelerate_cli": "accelerate launch",
                     "lightning_fabric.cli": "fabric run", "lightning.fabric.cli": "fabric run",
                     "deepspeed.launcher.runner": "deepspeed"}


_PROCESS_FLAGS = ("--num_processes", "--num-processes", "--nproc-per-node", "--nproc_per_node",
                  "--devices")


def _launcher_refusal(launcher: str, rest: Sequence[str]) -> ConfigError:
    """The one line for a launcher given as the program, with the command to write instead: the
    launcher's script and its arguments, its process count as ``--nproc`` (else ``N``)."""
    at = next((i for i, a in enumerate(rest) if a.endswith(".py")), None)
    script = " ".join(rest[at:]) if at is not None else "train.py ARGS"
    nproc = "N"
    for i, arg in enumerate(rest[:at]):
        name, _, value = arg.partition("=")
        if name in _PROCESS_FLAGS:
            value = value or (rest[i + 1] if i + 1 < len(rest) else "")
            nproc = value if value.isdigit() else nproc
    return ConfigError(
        f"`{launcher}` starts processes itself, and ecrl launch already starts every rank with "
        f"torchrun: write `ecrl launch --nproc {nproc} -- python {script}` instead (Lightning "
        "and Accelerate take their process count from torchrun's environment)")


def _refuse_launchers(args: Sequence[str]) -> None:
    """A framework's launcher, or torchrun, as the program: refused before anything starts."""
    head = os.path.basename(args[0])
    sub = args[1] if len(args) > 1 else None
    for (name, needs), what in _LAUNCHERS.items():
        if head == name and needs in (None, sub):
            raise _launcher_refusal(what, args[1:])


def normalize_program(argv: Sequence[str]) -> tuple[str, ...]:
    """What torchrun runs: ``python train.py A`` → ``train.py A`` (torchrun's own interpreter,
    the one ECRL runs in), ``python -m pkg A`` → ``-m pkg A``, another program → ``--no-python``.
    A launcher (``torchrun``, ``accelerate launch``, ``fabric run`` …) is refused in one line.
    """
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        return ()
    _refuse_launchers(args)
    head = args[0]
    if os.path.basename(head) in _PYTHONS or head == sys.executable:
        args = args[1:]
        if not args:
            raise ConfigError("ecrl launch: `python` needs a script or -m MODULE to run")
        if args[0] == "-m":
            if len(args) < 2:
                raise ConfigError("ecrl launch: `python -m` needs a module name")
            if args[1] in _LAUNCHER_MODULES:
                raise _launcher_refusal(_LAUNCHER_MODULES[args[1]], args[2:])
            return ("-m", *args[1:])
        if args[0].startswith("-"):
            raise ConfigError(f"ecrl launch: python option {args[0]} is not supported: run "
                              "`python SCRIPT ARGS` or `python -m MODULE ARGS`")
        head, args = args[0], args[1:]
    elif not head.endswith(".py"):
        return ("--no-python", *args)
    else:
        args = args[1:]
    script = Path(head)
    if not script.is_file():
        raise ConfigError(f"ecrl launch: {head}: no such script")
    return (str(script.resolve()), *args)


def launch_config(flags: Mapping[str, Any], *, default_out: str) -> RunConfig:
    """The supervisor's settings for ``ecrl launch`` (flags given: values that are not None).

    They are validated by :class:`RunConfig`, whose checks the launch shares; its data-set and
    model fields are not used. The global batch is the script's: here it is the least common
    multiple of the world sizes, so that :class:`RunConfig` does not refuse a world size on its
    behalf (the script's :class:`ecrl.GlobalBatchSampler` checks ``B % W`` with the real B).
    """
    given = {k: v for k, v in flags.items() if v is not None}
    unknown = sorted(set(given) - set(LAUNCH_KEYS) - {"out"})
    if unknown:
        raise ConfigError(f"ecrl launch has no setting {unknown[0]!r}")
    explicit = frozenset(given)
    values = {"out": default_out, **given}
    return _config(values, explicit)


def _config(values: Mapping[str, Any], explicit: frozenset[str]) -> RunConfig:
    from ecrl.runtime.runconfig import parse_int_list

    worlds = parse_int_list("--world-sizes", values.get("world_sizes", (1,)))
    batch = math.lcm(*worlds) if worlds and all(w > 0 for w in worlds) else 1
    values = dict(values)
    if "parallel" not in explicit and ("tp" in explicit or "replicate" in explicit):
        # --tp or --replicate given, --parallel not: the script's own scheme applies
        # (ecrl.init_mesh), unknown here; check the given ones against the scheme they need
        # (the ranks are passed only what was given).
        values["parallel"] = "hsdp" if values.get("replicate", 1) != 1 else "fsdp"
    return RunConfig.from_dict({**values, "global_batch": batch}, explicit=explicit)


def _stored(config: RunConfig) -> dict[str, Any]:
    data = config.to_dict()
    return {k: data[k] for k in LAUNCH_KEYS}


def _given(config: RunConfig) -> list[str]:
    """The launch settings the user gave (flags), kept so that a continuation passes them on."""
    return sorted(config.explicit & set(LAUNCH_KEYS))


@dataclass(slots=True)
class LaunchSupervisor(Supervisor):
    """:class:`Supervisor` of a user's script; one per node (``node_rank``)."""

    node_rank: int = 0

    # --- per-node files --------------------------------------------------------------------------

    @property
    def _state_path(self) -> Path:
        if self.node_rank == 0:
            return self.paths.supervisor
        return self.paths.root / f"supervisor-node-{self.node_rank}.json"

    def _save(self) -> None:
        # Through the base class's writer: a full disk keeps the previous file whole and ends
        # the run with one line, as for `ecrl run`.
        self._write(self._state_path, self.state)

    def _take_lock(self, name: str = LOCK_FILE, holder: str = "another ECRL process") -> None:
        # One lock per node: several nodes may share one --out.
        if self.node_rank:
            name = f".supervisor-node-{self.node_rank}.lock"
        if self.config.nnodes > 1:
            holder = f"{holder} (node {self.node_rank})"
        Supervisor._take_lock(self, name, holder)  # slots dataclass: no zero-argument super()

    def _torchrun_log(self, attempt: int) -> Path:
        if self.node_rank == 0:
            return Supervisor._torchrun_log(self, attempt)
        return self.paths.attempt_dir(attempt) / f"torchrun-node-{self.node_rank}.log"

    def _owns_logs(self) -> bool:
        return self.config.nnodes == 1

    def _next_attempt(self) -> int:
        if self.config.nnodes > 1:
            # The other nodes create attempt folders in the shared directory too: count our own
            # attempts only, so that every node numbers an attempt the same.
            numbers = [a.attempt for a in self.state.attempts]
            return max(numbers) + 1 if numbers else 0
        return Supervisor._next_attempt(self)

    # --- the run directory -----------------------------------------------------------------------

    def _open_run(self) -> bool:
        root = Path(self.config.out).resolve()
        self.paths = RunPaths.of(root)
        if self._state_path.exists():
            state = read_json_record(self._state_path, SupervisorState)
            stored = state.extra.get("launch", {})
            program = tuple(stored.get("program", ()))
            if self.program and program and tuple(self.program) != program:
                raise ConfigError(
                    f"{root} was launched with `{' '.join(program)}`, not "
                    f"`{' '.join(self.program)}`: continue it with `ecrl launch --out {root}` "
                    "alone, or use a new --out")
            self.program = tuple(self.program) or program
            old = stored.get("config", {})
            # A run launched before the flags given were kept: every stored value was passed on.
            old_given = frozenset(stored.get("given", old))
            given = {k: v for k, v in self.config.to_dict().items() if k in self.config.explicit}
            for key in _SAME_RUN_KEYS:
                if key in given and key in old_given and key in old and given[key] != old[key]:
                    raise ConfigError(
                        f"{root} was launched with --{key.replace('_', '-')} {old[key]}, not "
                        f"{given[key]}: continue it with its own settings or use a new --out")
            self.config = _config({**old, **given, "out": str(root)},
                                  self.config.explicit | (old_given & set(LAUNCH_KEYS)))
            self._take_lock()
            if state.status == "completed":
                self._report(RunAlreadyComplete(command=self.name, root=root,
                                                target_steps=None))
                return False
            strays = self._check_logs(state)
            attempts = [self._stale(a) if a.status == "running" else a for a in state.attempts]
            self.state = replace(state, attempts=attempts, status="running",
                                 extra=with_strays(state.extra, strays))
            self._report(RunResumed(command=self.name, root=root,
                                    earlier_attempts=len(attempts)))
            self._report_strays(strays)
        else:
            if not self.program:
                raise ConfigError("ecrl launch: name the script to run, e.g. `ecrl launch --out "
                                  "DIR -- python train.py`")
            foreign = sorted(entry.name for entry in root.iterdir()
                             if not (self.config.nnodes > 1 and _another_nodes(entry.name))
                             ) if root.exists() else []
            if foreign and LOCK_FILE in foreign and held_elsewhere(root):
                raise in_use(root)  # a launch into this --out started a moment ago
            if foreign:
                raise ConfigError(f"--out {root} exists and is not an ecrl launch run (it holds "
                                  f"{foreign[0]}): choose a new or empty directory")
            root.mkdir(parents=True, exist_ok=True)
            self._take_lock()
            self.state = SupervisorState(attempts=[], restarts=0, status="running", extra={
                "injected_failures": [],
                "launch": {"program": list(self.program), "config": _stored(self.config),
                           "given": _given(self.config), "node_rank": self.node_rank}})
        self._refresh_manifest()
        self._save()
        return True

    def _refresh_manifest(self) -> None:
        """``run.json`` once the script wrote it (else a placeholder naming no target); the
        supervisor's own settings always come from the launch. The checkpoint strategy and
        interval are the script's Checkpointer's, as it resolved them (run.json says them)."""
        c = self.config
        ours: dict[str, Any] = {"fail_at": sorted(set(c.fail_at)),
                                "world_sizes": list(c.world_sizes)}
        if self.paths.manifest.exists():
            self.manifest = replace(read_json_record(self.paths.manifest, RunManifest), **ours)
            return
        self.manifest = build_manifest(
            seed=0, dataset="(set by the script)", dataset_size=1, global_batch=1,
            steps_per_epoch=1, target_steps=0, log_ids=False, model="(set by the script)",
            strategy=c.strategy, ckpt_every=c.effective_ckpt_every, **ours)

    # --- attempts --------------------------------------------------------------------------------

    def _opened(self) -> RunOpened:
        return replace(Supervisor._opened(self), node_rank=self.node_rank)

    def _launch(self, attempt: int, world: int, pointer: Any, fail_at: list[int]) -> int:
        self._refresh_manifest()
        code = Supervisor._launch(self, attempt, world, pointer, fail_at)
        self._refresh_manifest()
        return code

    def _framework_checkpoints(self) -> tuple[int, str] | None:
        """The newest checkpoint the run's logs record, ``(step, framework)``, when it was a
        framework's own (the integrations log ``written_by``)."""
        newest: tuple[int, str] | None = None
        for a in self.state.attempts:
            try:
                for _, event in JsonlReader(self.paths.checkpoint_log(a.attempt), CheckpointEvent,
                                            torn_tail_ok=True, root=self.paths.root):
                    by = event.extra.get("written_by")
                    # A name, printed on the console: a string from a file anyone with write
                    # access to the run directory could forge (escape sequences) is not one.
                    if isinstance(by, str) and by.isidentifier() and (
                            newest is None or event.global_step >= newest[0]):
                        newest = (event.global_step, by)
            except (RunFormatError, OSError):
                continue
        return newest

    def _adopt_own_resume(self) -> None:
        """The attempt just ended resumed from a checkpoint the supervisor did not choose (no
        ECRL checkpoint: its framework loaded its own, ``fit(ckpt_path="last")``,
        ``load_state``): its rank 0 recorded which in ``attempt.json``, which ``supervisor.json``
        then says too, so that the committed lineage rests on the resume that happened."""
        last = self.state.attempts[-1]
        if last.resumed_from_step is not None:
            return
        try:
            own = read_json_record(self.paths.attempt_record(last.attempt), AttemptRecord,
                                   root=self.paths.root)
        except (RunFormatError, OSError):
            return
        if own.resumed_from_step is None:
            return
        point = {"global_step": own.resumed_from_step, "checksum": own.resumed_from_checksum,
                 "reason": "framework"}
        extra = dict(self.state.extra)
        extra["resume_points"] = {**extra.get("resume_points", {}), str(last.attempt): point}
        self.state = replace(self.state, extra=extra, attempts=[
            *self.state.attempts[:-1], replace(last, resumed_from_step=own.resumed_from_step)])
        self._save()

    def _attempt(self, pointer: Any) -> Outcome:
        outcome = Supervisor._attempt(self, pointer)
        self._adopt_own_resume()
        target = self.manifest.target_steps
        if (outcome.status == "failed" and outcome.fatal is None and outcome.fired is None
                and target and outcome.last_step == target - 1):
            # Every rank logged the last step, then a rank died on its way out (gloo aborts a
            # process that leaves while a peer still talks to it). The training is done, and
            # every node's supervisor sees the same logs: call it complete on all of them,
            # rather than relaunch on one node while the other has finished.
            outcome = replace(outcome, status="completed")
            last = replace(self.state.attempts[-1], status="completed")
            self.state = replace(self.state, attempts=[*self.state.attempts[:-1], last])
            self._save()
        return outcome

    def _conclude(self, outcome: Outcome, relaunches: int) -> int | None:
        if outcome.status == "failed" and outcome.exit_code == 0 and outcome.fatal is None:
            # The script ended normally short of its target: relaunching would do the same.
            self._report(ScriptEndedShort(wrote_log=self.paths.manifest.exists(),
                                          last_step=outcome.last_step,
                                          target_steps=self.manifest.target_steps))
            self._finish("failed")
            return 2
        return Supervisor._conclude(self, outcome, relaunches)

    def _report_completed(self) -> None:
        if self.node_rank != 0:  # the run's summary is node 0's
            self._report(RunCompleted(command=self.name, root=self.paths.root, summary=None,
                                      node_rank=self.node_rank))
            return
        Supervisor._report_completed(self)


def _another_nodes(name: str) -> bool:
    """What the other nodes' supervisors may have created before this one started."""
    # Their state files, locks and the temporaries of atomic writes; the logs folder.
    return name == "logs" or name.startswith(("supervisor", ".supervisor"))


def run_launch(config: RunConfig, program: Sequence[str], *, node_rank: int = 0,
               reporter: Reporter | None = None) -> int:
    """``ecrl launch``: supervise ``program`` (already normalized) until the run ends, telling
    ``reporter`` (default: nobody) what happens."""
    if node_rank < 0 or node_rank >= config.nnodes:
        raise ConfigError(f"--node-rank {node_rank} must be in 0..{config.nnodes - 1} "
                          f"(--nnodes {config.nnodes})")
    return LaunchSupervisor(config, reporter=reporter or Silent(), name="launch",
                            program=tuple(program), node_rank=node_rank).run()
