"""``ecrl faults``: the crash campaign. Every case is a real ``ecrl run`` (supervisor, torchrun,
two gloo ranks, real files and fsyncs) that something goes wrong in, on purpose:

- ``kill``: rank 0 or rank 1 exits with 137 right after a step (the runtime's injected failure);
- ``sigkill``: the campaign sends a real SIGKILL to rank 0 or rank 1 while it trains (at a random
  phase of the step: loading, forward, backward, all-reduce or update);
- ``crash``: a process dies (``os._exit(137)``) at one point of the write protocol of the 2nd
  checkpoint (``ECRL_CRASH_AT``: temporary write, fsync, rename, directory fsync, pointer update;
  for ``overlapped`` inside the background writer; for the sharded strategies before or after the
  parts, during or after DCP's metadata write, before the rename, before or after the pointer
  update, during the background persist, on rank 0 or on rank 1);
- ``damage``: a stopped run's newest checkpoint gets a bit flipped, is truncated (each of its
  files) or deleted, or ``latest.json`` is made stale, dangling, garbage or deleted; then the run
  is continued;
- ``enospc``: the checkpoint's write call fails with ``OSError(ENOSPC)``; once refused, the run is
  continued as a user would after freeing space;
- ``hang``: rank 1 is stopped (SIGSTOP) mid-run; the collective timeout must end the attempt;
- ``forge``: an attacker with write access to the run directory: a stopped run's newest checkpoint
  is replaced by a forged one whose pickle payload would create a marker file (format 2, chunks
  ``torch.save``'d; for the blocking strategies planted as a ``.dcp`` that ``latest.json`` is
  pointed at), or a sharded one's ``.metadata`` places its chunk in the previous checkpoint's part
  (``relative_path`` ``../…``), every checksum recomputed; then the run is continued. Or, while a
  sharded run trains, ``checkpoints/.recycled.dcp`` is replaced by a link to a directory outside
  the run, which must come out untouched. Or a stopped run's rank log or checkpoint log is
  replaced by a FIFO before it is continued: ``ecrl run --out`` and ``ecrl-verify`` must each
  refuse in one line, without waiting for a writer, and change nothing.

A case is *safe* when it ends in a completed run that ``ecrl-verify`` passes with parameters
bit-identical to the same run without faults (and, for damaged checkpoints, resumed from the newest
valid earlier one), or in a clear one-line refusal that leaves a valid checkpoint behind; a forged
case must also have run no code and touched nothing outside the run; a FIFO log must be refused
by both commands, in time, with the run directory left as it was. Anything else — above all a
wrong resume that exits 0 — is ``UNSAFE``. ``ecrl faults`` exits 0 when every
case is safe.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract.runformat import LatestPointer, RunPaths, write_json_record
from ecrl.contract.semantics import Geometry
from ecrl.contract.shardfile import MANIFEST
from ecrl.runtime.checkpoint.registry import periodic_strategies, strategy_entry
from ecrl.runtime.supervision.command import rank_pids

__all__ = ["FaultCase", "CaseResult", "cases", "run_campaign", "render_markdown", "forge_checksums",
           "main"]

STRATEGIES = periodic_strategies()
"""Every periodic strategy (the registry's): each meets every fault case."""
STEPS, EVERY = 12, 3
"""Checkpoints after steps 2, 5 and 8."""
BASE = ["--dataset-size", "256", "--global-batch", "8", "--steps", str(STEPS), "--ckpt-every",
        str(EVERY), "--seed", "7", "--world-sizes", "2", "--threads", "1"]
STOP_AT = 10
"""Damage cases start from a run stopped after this step: checkpoints 5 and 8 kept."""
HANG_TIMEOUT_S = 8
NO_CHECKPOINT_LEFT = "no valid checkpoint is left"
"""The supervisor's refusal when committed progress has no valid checkpoint (persist.py)."""
CASE_TIMEOUT_S = 420
REFUSAL_TIMEOUT_S = 120
"""A FIFO log is refused before anything is launched: a command still running after this long
is waiting on the FIFO."""
FIFO_LOGS = ("rank-001.jsonl", "checkpoint_rank0.jsonl")
"""Logs of the stopped run's attempt 0 that a forger replaces by a FIFO (``fifo:NAME``)."""

_FILE_CRASH_POINTS = ("before-write", "before-fsync", "before-rename", "before-dir-fsync", "done")
_LATEST_CRASH_POINTS = ("before-rename", "done")
_SHARD_BOTH = ("before-parts", "after-parts")
_SHARD_RANK0 = ("during-metadata", "after-metadata", "before-rename", "before-pointer",
                "after-pointer")


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultCase:
    """One fault, injected into one run."""

    name: str
    strategy: str
    kind: str
    """kill, sigkill, crash, damage, latest, enospc, hang or forge."""
    rank: int = 0
    env: tuple[tuple[str, str], ...] = ()
    fail_at: int | None = None
    damage: str | None = None
    """damage: ``flip:FILE``, ``truncate:FILE``, ``delete``; latest: stale, dangling, garbage,
    delete; forge: pickle, relative-path, recycled-link, ``fifo:LOG``."""
    expect: str | None = None
    """The checkpoint the continued run must resume from (damage cases): ``newest`` (the one
    the stopped run's latest.json named) or ``previous`` (the one before it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """What happened; rendering is separate (:func:`render_markdown`)."""

    case: str
    strategy: str
    outcome: str
    checkpoint_used: str
    replayed: int | None
    verdict: str
    seconds: float
    detail: str = ""


def _crash_cases(strategy: str) -> list[FaultCase]:
    out = []
    if not strategy_entry(strategy).sharded:
        where = "writer process" if strategy == "overlapped" else "rank 0"
        for target, points in (("checkpoint", _FILE_CRASH_POINTS),
                               ("latest", _LATEST_CRASH_POINTS)):
            for point in points:
                out.append(FaultCase(
                    name=f"crash {target}:{point} ({where})", strategy=strategy, kind="crash",
                    env=(("ECRL_CRASH_AT", f"{target}:{point}:2:0"),)))
        return out
    both = (*_SHARD_BOTH, *(("during-persist",) if strategy == "sharded-async" else ()))
    for point in both:
        for rank in (0, 1):
            out.append(FaultCase(name=f"crash sharded:{point} (rank {rank})", strategy=strategy,
                                 kind="crash", rank=rank,
                                 env=(("ECRL_CRASH_AT", f"sharded:{point}:2:0"),
                                      ("ECRL_CRASH_RANK", str(rank)))))
    for point in _SHARD_RANK0:
        out.append(FaultCase(name=f"crash sharded:{point} (rank 0)", strategy=strategy,
                             kind="crash", env=(("ECRL_CRASH_AT", f"sharded:{point}:2:0"),
                                                ("ECRL_CRASH_RANK", "0"))))
    return out


def _files_of(strategy: str) -> tuple[str, ...]:
    if not strategy_entry(strategy).sharded:
        return ("",)  # the .ckpt file itself
    return ("__0_0.distcp", "__1_0.distcp", ".metadata", MANIFEST)


def _forge_cases(strategy: str) -> list[FaultCase]:
    sharded = strategy_entry(strategy).sharded
    out = [FaultCase(name="forged checkpoint with a pickle payload" + (
        "" if sharded else " (a .dcp latest.json is pointed at)"), strategy=strategy,
        kind="forge", damage="pickle", expect="previous")]
    if sharded:
        out.append(FaultCase(name="forged .metadata: relative_path ../ (previous part)",
                             strategy=strategy, kind="forge", damage="relative-path",
                             expect="previous"))
        out.append(FaultCase(name="checkpoints/.recycled.dcp replaced by a link out of the run",
                             strategy=strategy, kind="forge", damage="recycled-link"))
    for log in FIFO_LOGS:
        out.append(FaultCase(name=f"logs/attempt-000/{log} replaced by a FIFO", strategy=strategy,
                             kind="forge", damage=f"fifo:{log}"))
    return out


def cases(*, quick: bool) -> list[FaultCase]:
    """The campaign (``quick``: a small subset that still covers every kind of damage)."""
    if quick:
        return [
            FaultCase(name="kill after step 7 (rank 1)", strategy="sharded-async", kind="kill",
                      rank=1, fail_at=7),
            FaultCase(name="crash sharded:during-metadata (rank 0)", strategy="sharded",
                      kind="crash", env=(("ECRL_CRASH_AT", "sharded:during-metadata:2:0"),
                                         ("ECRL_CRASH_RANK", "0"))),
            FaultCase(name="flip a bit of __1_0.distcp", strategy="sharded", kind="damage",
                      damage="flip:__1_0.distcp", expect="previous"),
            FaultCase(name="latest.json dangling", strategy="sharded", kind="latest",
                      damage="dangling", expect="newest"),
        ]
    per: dict[str, list[FaultCase]] = {}
    for strategy in STRATEGIES:
        out = per.setdefault(strategy, [])
        for rank in (0, 1):
            out.append(FaultCase(name=f"kill after step 7 (rank {rank})", strategy=strategy,
                                 kind="kill", rank=rank, fail_at=7))
            out.append(FaultCase(name=f"SIGKILL mid-step (rank {rank})", strategy=strategy,
                                 kind="sigkill", rank=rank))
        out += _crash_cases(strategy)
        for file in _files_of(strategy):
            label = file or "the checkpoint file"
            for how in ("flip", "truncate"):
                out.append(FaultCase(name=f"{'flip a bit of' if how == 'flip' else 'truncate'} "
                                          f"{label}", strategy=strategy, kind="damage",
                                     damage=f"{how}:{file}", expect="previous"))
        out.append(FaultCase(name="delete the newest checkpoint", strategy=strategy,
                             kind="damage", damage="delete", expect="previous"))
        for how, which in (("stale", "previous"), ("dangling", "newest"),
                           ("garbage", "newest"), ("delete", "newest")):
            out.append(FaultCase(name=f"latest.json {how if how != 'delete' else 'deleted'}",
                                 strategy=strategy, kind="latest", damage=how, expect=which))
        out.append(FaultCase(name="ENOSPC at the checkpoint write", strategy=strategy,
                             kind="enospc", env=(("ECRL_CRASH_AT", (
                                 "checkpoint" if not strategy_entry(strategy).sharded
                                 else "sharded") + ":enospc:2:0"),)))
        out.append(FaultCase(name="hung rank 1 (SIGSTOP)", strategy=strategy, kind="hang",
                             rank=1))
        out += _forge_cases(strategy)
    # Interleaved (one case of each strategy in turn), so that any prefix of the campaign covers
    # every strategy alike; then in the table, grouped by strategy.
    width = max(len(v) for v in per.values())
    return [v[i] for i in range(width) for v in per.values() if i < len(v)]


# --- running ----------------------------------------------------------------------------------


def _ecrl_run(root: Path, args: Sequence[str], env: dict[str, str] | None = None,
              watch: Callable[[subprocess.Popen[str], Path], None] | None = None,
              timeout: float = CASE_TIMEOUT_S) -> tuple[int, str]:
    """``ecrl run --out root ARGS``; returns (exit code, stderr); 124 when it ran past
    ``timeout`` (then it was killed)."""
    full = {**os.environ, **(env or {})}
    with subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", "run", "--out", str(root),
                           *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=full, start_new_session=True) as proc:
        if watch is not None:
            watch(proc, root)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            return 124, err + "\n(timed out)"
        return proc.returncode, err


def _signal_rank_at(rank: int, step: int, sig: int) -> Callable[[subprocess.Popen[str], Path],
                                                                  None]:
    """A watcher: once rank ``rank`` of attempt 0 logged ``step``, send it ``sig``."""

    def watch(proc: subprocess.Popen[str], root: Path) -> None:
        log = RunPaths.of(root).rank_log(0, rank)
        deadline = time.monotonic() + CASE_TIMEOUT_S / 2
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if log.exists() and log.read_bytes().count(b"\n") > step:
                    pid = rank_pids(root).get((0, rank))
                    if pid is not None:
                        time.sleep(0.01)  # into the next step
                        os.kill(pid, sig)
                        return
            time.sleep(0.005)

    return watch


def _verify(root: Path) -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-m", "verifier.cli", str(root)],
                          capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    head = (proc.stdout.strip().splitlines() or [proc.stderr.strip()])[0]
    return proc.returncode == 0 and head.startswith("PASS"), head


def _state(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / "supervisor.json").read_text()))


def _used(state: dict[str, Any]) -> tuple[str, list[int]]:
    # supervisor.json carries the state's extra keys at its top level
    points = state.get("resume_points") or state.get("extra", {}).get("resume_points", {})
    steps, words = [], []
    for attempt in state["attempts"][1:]:
        point = points.get(str(attempt["attempt"]))
        if point is None:
            words.append("fresh start")
            continue
        steps.append(int(point["global_step"]))
        reason = point.get("reason", "latest")
        words.append(f"{point['path']}" + ("" if reason == "latest" else f" ({reason})"))
    return ", ".join(words) or "none needed", steps


def _replayed(state: dict[str, Any]) -> int:
    attempts = state["attempts"]
    total = 0
    for before, after in itertools.pairwise(attempts):
        last, resumed = before.get("last_step"), after.get("resumed_from_step")
        if last is not None:
            total += last - (resumed if resumed is not None else -1)
    return total


def _digest(root: Path) -> str | None:
    try:
        return str(json.loads((root / "final" / "summary.json").read_text())["params_digest"])
    except (OSError, ValueError, KeyError):
        return None


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    return lines[-1].strip() if lines else ""


def _expected(root: Path, which: str | None) -> int | None:
    """The step of the stopped run's newest checkpoint, or of the one before it."""
    if which is None:
        return None
    from ecrl.runtime.checkpoint.persist import checkpoint_step

    latest = json.loads((root / "checkpoints" / "latest.json").read_text())
    if which == "newest":
        return int(latest["global_step"])
    older = [s for p in (root / "checkpoints").iterdir()
             if (s := checkpoint_step(p.name)) is not None and s < latest["global_step"]]
    return max(older) if older else None


def _damage(root: Path, case: FaultCase) -> None:
    checkpoints = root / "checkpoints"
    latest = json.loads((checkpoints / "latest.json").read_text())
    newest = checkpoints / latest["path"]
    how = case.damage or ""
    if case.kind == "latest":
        if how == "delete":
            (checkpoints / "latest.json").unlink()
        elif how == "garbage":
            (checkpoints / "latest.json").write_text('{"path": "step-000')
        elif how == "dangling":
            suffix = Path(latest["path"]).suffix
            write_json_record(checkpoints / "latest.json", LatestPointer(**{
                **{k: latest[k] for k in ("epoch", "cursor_step", "world_size", "time",
                                          "checksum")},
                "path": f"step-{STEPS - 1:08d}{suffix}", "global_step": STEPS - 1}))
        else:  # stale: the previous checkpoint, a whole and valid one
            from ecrl.runtime.checkpoint.persist import checkpoint_step, read_checkpoint

            older = sorted(p.name for p in checkpoints.iterdir()
                           if (s := checkpoint_step(p.name)) is not None
                           and s < latest["global_step"])[-1]
            checked = read_checkpoint(checkpoints / older)
            step = int(checked.meta["global_step"])
            epoch, cursor = Geometry(dataset_size=256, global_batch=8).locate(step)
            write_json_record(checkpoints / "latest.json", LatestPointer(
                path=older, global_step=step, epoch=epoch, cursor_step=cursor, world_size=2,
                time=time.time(), checksum=checked.checksum))
        return
    if how == "delete":
        if newest.is_dir():
            shutil.rmtree(newest)
        else:
            newest.unlink()
        return
    action, _, name = how.partition(":")
    target = newest / name if name else newest
    data = bytearray(target.read_bytes())
    if action == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    target.write_bytes(bytes(data))


PAYLOAD_MARKER = "FORGED-PAYLOAD-RAN"
"""Created (in the case's run directory) by the forged pickle, should anything unpickle it."""


class _RunsCode:
    """The forged pickle: loading it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch '{self.marker}'",))


def _outside(root: Path) -> Path:
    """The directory outside the run that a planted link points at (recycled-link)."""
    return root.parent / f"{root.name}-outside"


def forge_checksums(directory: Path, latest_path: Path, names: Sequence[str],
                       version: int | None = None) -> None:
    """Recompute the manifest's checksums of ``names`` and latest.json's of the manifest, and
    point latest.json at ``directory``: what a forger does (the campaign's forge cases and the
    loader's tests share it)."""
    from ecrl.contract.shardfile import file_checksum

    manifest = json.loads((directory / MANIFEST).read_text())
    for name in names:
        checksum, size = file_checksum(directory / name)
        manifest["parts"][name] = {"checksum": checksum, "size": size}
    if version is not None:
        manifest["version"] = version
    (directory / MANIFEST).write_text(json.dumps(manifest))
    latest = json.loads(latest_path.read_text())
    latest.update(path=directory.name, checksum=file_checksum(directory / MANIFEST)[0])
    latest_path.write_text(json.dumps(latest))


def _forge(root: Path, case: FaultCase) -> None:
    import io
    import pickle

    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
    )

    from ecrl.runtime.checkpoint.persist import read_checkpoint

    checkpoints = root / "checkpoints"
    latest_path = checkpoints / "latest.json"
    latest = json.loads(latest_path.read_text())
    newest = checkpoints / latest["path"]
    if case.damage == "pickle":
        meta = read_checkpoint(newest).meta
        buffer = io.BytesIO()
        torch.save(_RunsCode(root / PAYLOAD_MARKER), buffer)
        payload = buffer.getvalue()
        forged = checkpoints / f"{newest.name.rsplit('.', 1)[0]}.dcp"
        if forged.exists():
            shutil.rmtree(forged)
        forged.mkdir()
        (forged / "__0_0.distcp").write_bytes(payload)
        (forged / ".metadata").write_bytes(pickle.dumps(Metadata(
            state_dict_metadata={"c000": BytesStorageMetadata()},
            storage_data={MetadataIndex("c000"): _StorageInfo("__0_0.distcp", 0, len(payload))})))
        (forged / MANIFEST).write_text(json.dumps({
            "format": "ecrl-dcp", "version": 2, "meta": meta, "tree": {}, "tensors": [],
            "chunks": [{"key": "c000", "nbytes": len(payload)}], "parts": {}}))
        forge_checksums(forged, latest_path, ["__0_0.distcp", ".metadata"])
    elif (case.damage or "").startswith("fifo:"):
        log = RunPaths.of(root).attempt_dir(0) / (case.damage or "").split(":", 1)[1]
        log.unlink()
        os.mkfifo(log)
    elif case.damage == "relative-path":
        older = max(p.name for p in checkpoints.iterdir()
                    if p.name.endswith(".dcp") and p.name < newest.name)
        metadata = pickle.loads((newest / ".metadata").read_bytes())  # ECRL's own file
        metadata.storage_data = {index: _StorageInfo(f"../{older}/{info.relative_path}",
                                                     info.offset, info.length)
                                 for index, info in metadata.storage_data.items()}
        (newest / ".metadata").write_bytes(pickle.dumps(metadata))
        forge_checksums(newest, latest_path, [".metadata"])


def _link_recycled_at(step: int) -> Callable[[subprocess.Popen[str], Path], None]:
    """A watcher: once rank 0 of attempt 0 logged ``step``, replace ``checkpoints/.recycled.dcp``
    by a link to a directory outside the run holding a part and a file of its own."""

    def watch(proc: subprocess.Popen[str], root: Path) -> None:
        from ecrl.contract.shardfile import RECYCLED

        outside = _outside(root)
        outside.mkdir(parents=True, exist_ok=True)
        (outside / "__0_0.distcp").write_bytes(b"not ECRL's")
        (outside / "notes.txt").write_bytes(b"not ECRL's either")
        log = RunPaths.of(root).rank_log(0, 0)
        deadline = time.monotonic() + CASE_TIMEOUT_S / 2
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if log.exists() and log.read_bytes().count(b"\n") > step:
                    recycled = root / "checkpoints" / RECYCLED
                    shutil.rmtree(recycled, ignore_errors=True)
                    with contextlib.suppress(FileExistsError):
                        recycled.symlink_to(outside, target_is_directory=True)
                    return
            time.sleep(0.005)

    return watch


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` (links not followed) with its mode, size and modification
    time; the supervisor's lock file aside (taking it is not a change to the run)."""
    from ecrl.runtime.supervision.supervisor import LOCK_FILE

    out = {}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder) / name
            if path == root / LOCK_FILE:
                continue
            info = path.lstat()
            out[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return out


def _fifo_refusals(root: Path, log: str) -> tuple[str, str | None]:
    """Continue a run whose ``log`` is a FIFO, then verify it: (outcome, what went wrong or
    None). Both must refuse in one line naming the FIFO, in time, and the run directory must
    be left as it was."""
    before = _tree(root)
    code, err = _ecrl_run(root, [], timeout=REFUSAL_TIMEOUT_S)
    errors = [line for line in err.splitlines() if "error:" in line]
    if code == 124:
        return "ecrl run hung", "ecrl run waited on the FIFO"
    if code != 2 or len(errors) != 1 or "Traceback" in err or "FIFO" not in errors[0]:
        return f"ecrl run exit {code}", (f"ecrl run did not refuse in one line naming the FIFO "
                                         f"({_error_line(err) or err.strip()[-200:]})")
    if _tree(root) != before:
        return "ecrl run refused", "ecrl run changed the run directory before refusing"
    outcome = f"ecrl run refused in one line (exit {code})"
    try:
        proc = subprocess.run([sys.executable, "-m", "verifier.cli", str(root)],
                              capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return outcome + "; ecrl-verify hung", "ecrl-verify waited on the FIFO"
    said = proc.stdout + proc.stderr
    if proc.returncode != 2 or "FIFO" not in said or log not in said or "Traceback" in said:
        return (outcome + f"; ecrl-verify exit {proc.returncode}",
                f"ecrl-verify did not refuse naming the FIFO: {said.strip()[-200:]}")
    if _tree(root) != before:
        return outcome, "ecrl-verify changed the run directory"
    return outcome + "; ecrl-verify UNKNOWN (exit 2)", None


def _forge_damage(root: Path, case: FaultCase) -> str | None:
    """What a forged case left that it must not have (None: nothing)."""
    if (root / PAYLOAD_MARKER).exists():
        return "the forged pickle ran"
    outside = _outside(root)
    if case.damage == "recycled-link" and (
            sorted(p.name for p in outside.iterdir()) != ["__0_0.distcp", "notes.txt"]
            or (outside / "__0_0.distcp").read_bytes() != b"not ECRL's"
            or (outside / "notes.txt").read_bytes() != b"not ECRL's either"):
        return "files outside the run were written or deleted"
    links = [p.name for p in (root / "checkpoints").rglob("*") if p.is_symlink()]
    if links and case.damage == "recycled-link":
        return f"checkpoints hold links: {', '.join(links[:3])}"
    return None


@dataclass(slots=True)
class _Campaign:
    work: Path
    reference: str | None = None
    bases: dict[str, Path] = field(default_factory=dict)

    def base(self, strategy: str) -> Path:
        """A run of ``strategy`` stopped after step STOP_AT (made once)."""
        if strategy not in self.bases:
            root = self.work / "bases" / strategy
            shutil.rmtree(root, ignore_errors=True)
            # --max-inflight 1: a background writer is at most one checkpoint behind (the next
            # boundary waits for it), so the stopped run has an earlier committed checkpoint to
            # fall back to, whatever the machine's load.
            _ecrl_run(root, [*BASE, "--strategy", strategy, "--fail-at", str(STOP_AT),
                             "--max-restarts", "0", "--max-inflight", "1"])
            self.bases[strategy] = root
        return self.bases[strategy]

    def run_case(self, index: int, case: FaultCase) -> CaseResult:
        t0 = time.perf_counter()
        root = self.work / "cases" / f"{index:03d}"
        shutil.rmtree(root, ignore_errors=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        args = [*BASE, "--strategy", case.strategy]
        env = dict(case.env)
        watch = None
        outcome = ""
        if case.kind == "kill" and case.fail_at is not None:
            args += ["--fail-at", str(case.fail_at), "--fail-rank", str(case.rank)]
        elif case.kind == "sigkill":
            watch = _signal_rank_at(case.rank, 6, signal.SIGKILL)
        elif case.kind == "hang":
            args += ["--collective-timeout-s", str(HANG_TIMEOUT_S)]
            watch = _signal_rank_at(case.rank, 6, signal.SIGSTOP)
        elif case.kind == "forge" and case.damage == "recycled-link":
            shutil.rmtree(_outside(root), ignore_errors=True)
            watch = _link_recycled_at(9)  # checkpoint 8 retired 2: its parts wait for 11
        expect: int | None = None
        refusal_ok = False
        if case.kind in ("damage", "latest") or (case.kind == "forge"
                                                  and case.damage != "recycled-link"):
            shutil.copytree(self.base(case.strategy), root,
                            ignore=shutil.ignore_patterns(".supervisor.lock"))
            expect = _expected(root, case.expect)
            # No earlier checkpoint to fall back to: the one right answer is the refusal.
            refusal_ok = expect is None
            if case.kind == "forge":
                _forge(root, case)
            else:
                _damage(root, case)
            if (case.damage or "").startswith("fifo:"):
                outcome, harm = _fifo_refusals(root, (case.damage or "").split(":", 1)[1])
                return CaseResult(case=case.name, strategy=case.strategy, outcome=outcome,
                                  checkpoint_used="none (refused)", replayed=None,
                                  verdict="safe" if harm is None else "UNSAFE",
                                  seconds=round(time.perf_counter() - t0, 1),
                                  detail=harm or "")
            code, err = _ecrl_run(root, [])
        else:
            code, err = _ecrl_run(root, args, env, watch)
        if case.kind == "enospc":
            refusal = _error_line(err)
            if code == 0 or not refusal:
                return self._result(case, root, t0, code, err,
                                    unsafe="the full disk was not refused")
            from ecrl.contract.ckptfile import CheckpointError
            from ecrl.runtime.checkpoint.persist import read_checkpoint, read_latest

            paths = RunPaths.of(root)
            pointer = read_latest(paths)
            if pointer is None:
                return self._result(case, root, t0, code, err, unsafe="no checkpoint left")
            try:  # the full disk must have left latest.json naming a whole checkpoint
                read_checkpoint(paths.checkpoints / pointer.path,
                                expected_checksum=pointer.checksum)
            except CheckpointError as exc:
                return self._result(case, root, t0, code, err, unsafe=str(exc))
            outcome = f"refused ({refusal.split('error: ', 1)[-1][:60]}…), continued: "
            code, err = _ecrl_run(root, [])  # space freed: the same command again
        if case.kind == "forge" and (harm := _forge_damage(root, case)) is not None:
            return self._result(case, root, t0, code, err, unsafe=harm)
        if refusal_ok and code != 0 and NO_CHECKPOINT_LEFT in _error_line(err):
            return self._result(case, root, t0, code, err, refused=True)
        return self._result(case, root, t0, code, err, prefix=outcome, expect=expect)

    def _result(self, case: FaultCase, root: Path, t0: float, code: int, err: str, *,
                prefix: str = "", unsafe: str | None = None, expect: int | None = None,
                refused: bool = False) -> CaseResult:
        used, replayed = "—", None
        steps: list[int] = []
        with contextlib.suppress(OSError, ValueError, KeyError):
            state = _state(root)
            used, steps = _used(state)
            replayed = _replayed(state)
        if not refused and unsafe is None:
            if code != 0:
                unsafe = f"run ended with exit {code}: {_error_line(err) or err.strip()[-200:]}"
            else:
                ok, head = _verify(root)
                if not ok:
                    unsafe = f"ecrl-verify: {head}"
                elif _digest(root) != self.reference:
                    unsafe = "parameters differ from the run without faults"
                elif expect is not None and (not steps or steps[-1] != expect):
                    unsafe = (f"resumed from {steps[-1] if steps else 'nothing'}, expected the "
                              f"newest valid checkpoint, step {expect}")
        outcome = (f"refused: no valid checkpoint left (exit {code})" if refused
                   else prefix + ("completed" if code == 0 else f"exit {code}"))
        return CaseResult(case=case.name, strategy=case.strategy, outcome=outcome,
                          checkpoint_used=used, replayed=replayed,
                          verdict="safe" if unsafe is None else "UNSAFE",
                          seconds=round(time.perf_counter() - t0, 1), detail=unsafe or "")


def run_campaign(*, quick: bool, work: Path, jobs: int = 1,
                 progress: Callable[[str], None] | None = None,
                 only: Sequence[FaultCase] | None = None) -> list[CaseResult]:
    """Run every case (in ``work``); returns one result per case, in order."""
    work.mkdir(parents=True, exist_ok=True)
    campaign = _Campaign(work=work)
    todo = list(only if only is not None else cases(quick=quick))
    ref = work / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    code, err = _ecrl_run(ref, [*BASE, "--strategy", "blocking"])
    if code != 0:
        raise RuntimeError(f"the reference run failed: {_error_line(err) or err[-300:]}")
    campaign.reference = _digest(ref)
    for strategy in sorted({c.strategy for c in todo if c.kind in ("damage", "latest")
                            or (c.kind == "forge" and c.damage != "recycled-link")}):
        campaign.base(strategy)  # before the pool: bases are shared

    partial = work / "faults.partial.jsonl"
    partial.unlink(missing_ok=True)

    def one(item: tuple[int, FaultCase]) -> CaseResult:
        result = campaign.run_case(*item)
        with open(partial, "a") as handle:  # results so far survive an interrupted campaign
            handle.write(json.dumps({"index": item[0], **asdict(result)}) + "\n")
        if progress is not None:
            progress(f"[{item[0] + 1}/{len(todo)}] {result.strategy:13} {result.case}: "
                     f"{result.verdict} ({result.outcome}; {result.checkpoint_used})")
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, enumerate(todo)))
    order = {s: i for i, s in enumerate(STRATEGIES)}
    return sorted(results, key=lambda r: order.get(r.strategy, len(order)))  # stable


def render_markdown(results: Sequence[CaseResult]) -> str:
    lines = ["| case | strategy | outcome | checkpoint used | replayed steps | verdict |",
             "|---|---|---|---|---|---|"]
    for r in results:
        verdict = r.verdict + (f": {r.detail}" if r.detail else "")
        lines.append(f"| {r.case} | {r.strategy} | {r.outcome} | {r.checkpoint_used} | "
                     f"{'—' if r.replayed is None else r.replayed} | {verdict} |")
    safe = sum(r.verdict == "safe" for r in results)
    lines.append("")
    lines.append(f"{safe}/{len(results)} cases safe.")
    return "\n".join(lines) + "\n"


def main(*, quick: bool, out: str, jobs: int, fmt: str) -> int:
    work = Path(out).resolve()
    started = time.time()
    results = run_campaign(quick=quick, work=work, jobs=jobs,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))
    (work / "faults.json").write_text(json.dumps({
        "profile": "quick" if quick else "full", "started": started, "ended": time.time(),
        "cases": [asdict(r) for r in results]}, indent=2) + "\n")
    table = render_markdown(results)
    (work / "faults.md").write_text(table)
    if fmt == "json":
        print((work / "faults.json").read_text(), end="")
    else:
        print(table, end="")
    return 0 if all(r.verdict == "safe" for r in results) else 1
