"""End to end: a TINY matrix of real `ecrl run` units, killed midway and resumed (issue 14).

One matrix (2 suites: generated data and a CIFAR-10-format set written by the tool, × the tiny
CNN × one failure schedule; variants reference and overlapped: each unit is a real run, so one
strategy keeps the matrix small) is made once per module:

1. ``ecrl matrix`` is SIGKILLed while a unit is running, after some units finished;
2. the rerun is stopped with SIGINT while its first unit runs (exit 130);
3. a third invocation finishes only what is missing;
4. a fourth finds everything finished, runs nothing and rewrites identical tables.

The tests then hold the result to the issue's "must hold" list, reading the run directories
themselves rather than trusting the matrix's own table.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RUN_TIMEOUT_S, RunCache, shared

from verifier import render_text, verify

pytestmark = pytest.mark.torchrun

TINY = """
[matrix]
reference = "none"
strategies = ["overlapped"]

[run]
steps = 20
global-batch = 8
world-sizes = [1]
ckpt-every = 4
threads = 1
seed = 3

[datasets.fake]
dataset-size = 128

[datasets.cifar]
dataset = "cifar10"
generate = 96

[models.tiny]
model = "tiny-cnn"

[schedules.one]
fail-at = [9]
"""
FAIL_AT = [9]
UNITS = ["fake-tiny/reference-seed3", "fake-tiny-one/overlapped-seed3",
         "cifar-tiny/reference-seed3", "cifar-tiny-one/overlapped-seed3"]
OUTPUTS = ["summary.csv", "summary.md", "summary.json", "units.csv", "figures/goodput.png",
           "figures/gain.png", "figures/stall_vs_gain.png"]


@dataclass(frozen=True)
class Matrix:
    out: Path
    config: Path
    killed_records: dict[str, bytes]
    """Unit records that existed when the first invocation was SIGKILLed."""
    killed_running: str
    interrupted: subprocess.CompletedProcess[str]
    interrupted_unit: str
    after_interrupt: dict[str, bytes]
    """Unit records after the SIGINT."""
    resumed: subprocess.CompletedProcess[str]
    noop: subprocess.CompletedProcess[str]
    before_noop: dict[str, bytes]


def _command(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "ecrl.apps.cli", "matrix", str(config), "--out", str(out)]


def _running_unit(out: Path) -> str | None:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    running = [u["uid"] for u in manifest["units"] if u["state"] == "running"]
    return running[0] if running else None


def _records(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out / "units"))[:-5]: p.read_bytes()
            for p in (out / "units").rglob("*.json")}


def _wait_mid_unit(proc: subprocess.Popen[str], out: Path, *, finished: int) -> str:
    """Wait until ``finished`` units have records and a later unit's run (one this invocation
    started, not a leftover) has begun training."""
    since = time.time()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ecrl matrix ended before it could be interrupted"
        uid = _running_unit(out)
        if uid and len(_records(out)) >= finished:
            log = out / "runs" / uid / "logs" / "attempt-000" / "rank-000.jsonl"
            try:
                fresh = log.stat().st_size > 0 and log.stat().st_mtime > since and json.loads(
                    (out / "runs" / uid / "supervisor.json").read_text()
                )["attempts"][0]["start_time"] > since
            except (OSError, ValueError, KeyError, IndexError):
                fresh = False
            if fresh:
                return uid
        time.sleep(0.2)
    raise AssertionError("no unit started in time")


@pytest.fixture(scope="module")
def matrix(runs: RunCache) -> Matrix:
    # Made once for the session: every xdist worker that runs a test of this module shares it.
    return shared(runs, "matrix", _make_matrix)


def _make_matrix(root: Path) -> Matrix:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "tiny.toml"
    config.write_text(TINY)
    out = root / "out"

    # 1. SIGKILL mid-unit, after two units finished.
    first = subprocess.Popen(_command(config, out), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        running = _wait_mid_unit(first, out, finished=2)
        killed = _records(out)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()

    # 2. SIGINT while the rerun's first unit trains.
    second = subprocess.Popen(_command(config, out), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        interrupted_unit = _wait_mid_unit(second, out, finished=len(killed))
        second.send_signal(signal.SIGINT)
        stdout, stderr = second.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if second.poll() is None:
            second.kill()
    interrupted = subprocess.CompletedProcess(second.args, second.returncode, stdout, stderr)
    after_interrupt = _records(out)

    # 3. Finish; 4. nothing left to do.
    resumed = subprocess.run(_command(config, out), capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
    before = {name: (out / name).read_bytes() for name in OUTPUTS if (out / name).exists()}
    noop = subprocess.run(_command(config, out), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return Matrix(out=out, config=config, killed_records=killed, killed_running=running,
                  interrupted=interrupted, interrupted_unit=interrupted_unit,
                  after_interrupt=after_interrupt, resumed=resumed,
                  noop=noop, before_noop=before)


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_resumed_matrix_finishes_every_unit(matrix: Matrix) -> None:
    assert matrix.resumed.returncode == 0, matrix.resumed.stderr
    units = _table(matrix.out / "units.csv")
    assert [u["uid"] for u in units] == UNITS
    assert all(u["verdict"] == "PASS" for u in units), units
    for name in OUTPUTS:
        assert (matrix.out / name).stat().st_size > 0, name
    assert (matrix.out / "figures/goodput.png").read_bytes().startswith(b"\x89PNG")


def test_every_unit_passes_the_verifier(matrix: Matrix) -> None:
    for uid in UNITS:
        result = verify(matrix.out / "runs" / uid)
        assert result.verdict == "PASS", render_text(result)


def test_failure_variants_show_exactly_the_configured_restarts(matrix: Matrix) -> None:
    for uid in UNITS:
        supervisor = json.loads((matrix.out / "runs" / uid / "supervisor.json").read_text())
        expected = 0 if "reference" in uid else len(FAIL_AT)
        assert supervisor["restarts"] == expected, uid
        fired = [f["global_step"] for f in supervisor.get("injected_failures", [])]
        assert fired == ([] if "reference" in uid else FAIL_AT), uid
    rows = _table(matrix.out / "summary.csv")
    assert {(r["variant"], r["restarts"], r["expected_restarts"]) for r in rows} == {
        ("reference", "0", "0"), ("overlapped", "1", "1")}


def test_failure_variants_end_bit_identical_to_their_reference(matrix: Matrix) -> None:
    def digest(uid: str) -> str:
        summary = json.loads((matrix.out / "runs" / uid / "final" / "summary.json").read_text())
        return str(summary["params_digest"])

    for suite in ("fake-tiny", "cifar-tiny"):
        reference = digest(f"{suite}/reference-seed3")
        assert digest(f"{suite}-one/overlapped-seed3") == reference, suite
    # The two data sets train differently: equal digests above are not a vacuous match.
    assert digest("fake-tiny/reference-seed3") != digest("cifar-tiny/reference-seed3")
    rows = [r for r in _table(matrix.out / "summary.csv") if r["variant"] != "reference"]
    assert {r["bit_identical_to_reference"] for r in rows} == {"yes"}
    assert {float(r["loss_max_abs_diff"]) for r in rows} == {0.0}


def test_the_generated_cifar_set_is_in_the_real_format(matrix: Matrix) -> None:
    base = matrix.out / "data" / "cifar" / "cifar-10-batches-py"
    assert sorted(p.name for p in base.iterdir()) == [
        "batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
        "data_batch_5", "test_batch"]
    run = json.loads((matrix.out / "runs/cifar-tiny/reference-seed3/run.json").read_text())
    assert (run["dataset"]["name"], run["dataset"]["size"]) == ("cifar10", 96)


def test_sigkill_keeps_finished_units_and_redoes_the_half_done_one(matrix: Matrix) -> None:
    assert len(matrix.killed_records) >= 2
    after = _records(matrix.out)
    for uid, data in matrix.killed_records.items():
        assert after[uid] == data, f"{uid} was run again"
    # The unit killed mid-run was redone from scratch: one attempt per failure, no more.
    supervisor = json.loads((matrix.out / "runs" / matrix.killed_running /
                             "supervisor.json").read_text())
    assert all(a["status"] != "stopped" for a in supervisor["attempts"])
    resumed_log = matrix.interrupted.stderr
    assert f"{len(matrix.killed_records)} finished before" in resumed_log


def test_sigint_stops_the_matrix_with_130_and_records_nothing_for_that_unit(
        matrix: Matrix) -> None:
    assert matrix.interrupted.returncode == 130, matrix.interrupted.stderr
    assert "interrupted" in matrix.interrupted.stderr
    assert "Traceback" not in matrix.interrupted.stderr
    assert matrix.interrupted_unit not in matrix.after_interrupt
    # The resumed invocation ran exactly what had no record after the interruption.
    started = [line.split("] ", 1)[1].split(":", 1)[0]
               for line in matrix.resumed.stderr.splitlines() if ": running" in line]
    assert matrix.interrupted_unit in started
    assert sorted(started) == sorted(set(UNITS) - set(matrix.after_interrupt))
    for uid, data in matrix.after_interrupt.items():
        assert (matrix.out / "units" / f"{uid}.json").read_bytes() == data, uid


def test_rerunning_a_finished_matrix_runs_nothing_and_rewrites_identical_tables(
        matrix: Matrix) -> None:
    assert matrix.noop.returncode == 0, matrix.noop.stderr
    assert f"{len(UNITS)} finished before, 0 to run" in matrix.noop.stderr
    assert ": running" not in matrix.noop.stderr
    for name, data in matrix.before_noop.items():
        assert (matrix.out / name).read_bytes() == data, name


def test_a_matrix_folder_refuses_another_config(matrix: Matrix, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(matrix.config.read_text().replace("fail-at = [9]", "fail-at = [10]"))
    done = subprocess.run(_command(other, matrix.out), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "holds the results of another matrix" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_advise_reads_the_matrix_and_its_runs(matrix: Matrix) -> None:
    done = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "advise", "--from-matrix",
                           str(matrix.out), "--mtbf", "3600", "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {r["label"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {f"{w} overlapped" for w in ("fake-tiny", "cifar-tiny")}
    for row in rows.values():
        assert row["units"] == 1 and row["measured"]["step_s"] > 0
        assert row["measured"]["ckpt_stall_s"] is not None and row["ckpt_every_steps"] >= 1
    one = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "advise", "--from-run",
                          str(matrix.out / "runs" / UNITS[1]), "--mtbf", "3600"],
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    assert "1 restart" in one.stdout and "--ckpt-every" in one.stdout


def test_the_resumed_table_is_the_one_an_uninterrupted_matrix_gives(matrix: Matrix) -> None:
    # Everything in the unit table that does not measure time is fixed by the config: what an
    # uninterrupted matrix writes. (Timings differ between any two runs of a unit.)
    units = _table(matrix.out / "units.csv")
    digests = {u["suite"]: u["params_digest"] for u in units if u["variant"] == "reference"}
    fixed = [(u["uid"], u["verdict"], u["exit_code"], u["committed_steps"], u["restarts"],
              u["expected_restarts"], u["world_sizes"], u["params_digest"]) for u in units]
    expected = []
    for uid in UNITS:
        failures = 0 if "reference" in uid else len(FAIL_AT)
        workload = "-".join(uid.split("/")[0].split("-")[:2])
        expected.append((uid, "PASS", "0", "20", str(failures), str(failures),
                         " ".join(["1"] * (failures + 1)), digests[workload]))
    assert fixed == expected
