"""The measured table of docs/frameworks.md: each framework's own resume, judged.

For every case: one launch killed after step ``--fail-at`` (every rank exits 137), a second launch
that resumes the framework's documented way (at world size 2, or 1), then ``ecrl-verify``.

    python docs/examples/frameworks_table.py lightning --out runs/table-lightning
    python docs/examples/frameworks_table.py accelerate --out runs/table-accelerate
    python docs/examples/frameworks_table.py transformers --out runs/table-transformers

Each case prints one JSON line: the verdict, the anomaly counts and the verifier's own lines (for
a FAIL, each kind's line and its first witness; for a PASS, what it proved). ``--markdown FILE``
also writes the rows as the table of docs/frameworks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"lightning": HERE / "lightning_train.py", "accelerate": HERE / "accelerate_train.py",
           "transformers": HERE / "transformers_train.py"}
# The same run for every framework (the transformers example's own defaults are smaller).
SIZE = ["--steps", "24", "--dataset-size", "64", "--batch", "8"]
# 64 samples, global batch 8: 8 steps per epoch; 24 steps. Checkpoints every 3 steps (resume
# from step 11: epoch 1, cursor 3) or every 8 (resume from step 7: the end of epoch 0).
WHERE = {"mid-epoch": (3, 12), "epoch end": (8, 9)}


def launcher(framework: str, devices: int) -> list[str]:
    """The framework's own launcher for ``devices`` processes, up to the script's flags."""
    if framework == "lightning":  # Lightning starts its ranks itself
        return [sys.executable, str(SCRIPTS[framework]), "--devices", str(devices)]
    if framework == "transformers":  # the Trainer's documented launcher for several processes
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(devices), str(SCRIPTS[framework])]
    several = ["--multi_gpu"] if devices > 1 else []  # torchrun; the script asks for the CPU
    return [sys.executable, "-m", "accelerate.commands.launch", *several, "--num_processes",
            str(devices), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
            "no", str(SCRIPTS[framework])]


def case(framework: str, out: Path, *, exact: bool, where: str, devices: int,
         workers: int) -> dict[str, object]:
    every, fail = WHERE[where]
    flags = ["--out", str(out), "--ckpt-every", str(every), "--workers", str(workers), *SIZE] + (
        ["--exact"] if exact else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # generated data and models: nothing to fetch
    first = subprocess.run([*launcher(framework, 2), *flags, "--fail-at", str(fail)],
                           capture_output=True, text=True, env=env)
    second = subprocess.run([*launcher(framework, devices), *flags], capture_output=True,
                            text=True, env=env)
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(out), "--format",
                              "json"], capture_output=True, text=True)
    report = json.loads(verdict.stdout)["runs"][0]
    text = subprocess.run([sys.executable, "-m", "verifier.cli", str(out)], capture_output=True,
                          text=True).stdout
    return {"mode": "exact" if exact else "audit", "where": where, "world": f"2→{devices}",
            "workers": workers, "exits": [first.returncode, second.returncode],
            "verdict": report["verdict"], "anomalies": report["anomaly_counts"],
            "windows_checked": report["windows_checked"], "lines": verifier_lines(text)}


def verifier_lines(text: str) -> list[str]:
    """The verifier's own lines that say the verdict: each anomaly kind's line and its first
    witness (FAIL), or the first thing it proved (PASS)."""
    lines = text.splitlines()
    kept: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("  ✗ "):
            kept.append(line.strip())
            if i + 1 < len(lines) and lines[i + 1].startswith("      "):
                kept.append(lines[i + 1].strip())
    if not kept:
        kept = [line.strip() for line in lines if line.startswith("  proved:")][:1]
    return kept


def markdown(framework: str, rows: list[dict[str, object]]) -> str:
    """The rows as the table of docs/frameworks.md, then each case's verifier lines."""
    out = ["| framework | mode | resume at | world | workers | exits | verdict | anomalies |",
           "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        counts = row["anomalies"]
        assert isinstance(counts, dict)
        verdict = f"{row['verdict']} ({'windows checked' if row['windows_checked'] else 'audit'})"
        exits = row["exits"]
        assert isinstance(exits, list)
        out.append(f"| {framework} | {row['mode']} | {row['where']} | {row['world']} | "
                   f"{row['workers']} | {', '.join(map(str, exits))} | {verdict} | "
                   + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "—") + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=sorted(SCRIPTS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--markdown", type=Path, help="also write the rows as a markdown table")
    args = p.parse_args()
    rows = []
    for n, (exact, where, devices, workers) in enumerate(itertools.product(
            (False, True), WHERE, (2, 1), (0, 2))):
        row = case(args.framework, args.out / f"case-{n:02d}", exact=exact, where=where,
                   devices=devices, workers=workers)
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    if args.markdown is not None:
        args.markdown.write_text(markdown(args.framework, rows))


if __name__ == "__main__":
    main()
