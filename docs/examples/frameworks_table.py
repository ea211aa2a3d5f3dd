"""The measured table of docs/library.md ("Frameworks"): each framework's own resume, judged.

For every case: one launch killed after step ``--fail-at`` (every rank exits 137), a second launch
that resumes the framework's documented way (at world size 2, or 1), then ``ecrl-verify``.

    python docs/examples/frameworks_table.py lightning --out runs/table-lightning
    python docs/examples/frameworks_table.py accelerate --out runs/table-accelerate
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"lightning": HERE / "lightning_train.py", "accelerate": HERE / "accelerate_train.py"}
# 64 samples, global batch 8: 8 steps per epoch; 24 steps. Checkpoints every 3 steps (resume
# from step 11: epoch 1, cursor 3) or every 8 (resume from step 7: the end of epoch 0).
WHERE = {"mid-epoch": (3, 12), "epoch end": (8, 9)}


def launcher(framework: str, devices: int) -> list[str]:
    """The framework's own launcher for ``devices`` processes, up to the script's flags."""
    if framework == "lightning":  # Lightning starts its ranks itself
        return [sys.executable, str(SCRIPTS[framework]), "--devices", str(devices)]
    several = ["--multi_gpu"] if devices > 1 else []  # torchrun; the script asks for the CPU
    return [sys.executable, "-m", "accelerate.commands.launch", *several, "--num_processes",
            str(devices), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
            "no", str(SCRIPTS[framework])]


def case(framework: str, out: Path, *, exact: bool, where: str, devices: int,
         workers: int) -> dict[str, object]:
    every, fail = WHERE[where]
    flags = ["--out", str(out), "--ckpt-every", str(every), "--workers", str(workers)] + (
        ["--exact"] if exact else [])
    first = subprocess.run([*launcher(framework, 2), *flags, "--fail-at", str(fail)],
                           capture_output=True, text=True)
    second = subprocess.run([*launcher(framework, devices), *flags], capture_output=True,
                            text=True)
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(out), "--format",
                              "json"], capture_output=True, text=True)
    report = json.loads(verdict.stdout)["runs"][0]
    return {"mode": "exact" if exact else "audit", "where": where, "world": f"2→{devices}",
            "workers": workers, "exits": [first.returncode, second.returncode],
            "verdict": report["verdict"], "anomalies": report["anomaly_counts"],
            "windows_checked": report["windows_checked"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=sorted(SCRIPTS))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    for n, (exact, where, devices, workers) in enumerate(itertools.product(
            (False, True), WHERE, (2, 1), (0, 2))):
        row = case(args.framework, args.out / f"case-{n:02d}", exact=exact, where=where,
                   devices=devices, workers=workers)
        print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
