"""``ecrl demo``: the embedded default, end to end, in a couple of minutes on a laptop.

Two ranks train the tiny CNN on generated data with overlapped checkpoints every 20 steps; a
failure is injected after step 35 and another after step 85; the third attempt runs at world size
1 (a 2→1 resume). Then the runtime's summary, and the verifier's verdict on the run directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ecrl.apps.console import Console
from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import RunManifest, read_json_record
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervision.supervisor import EXIT_OK, Supervisor

__all__ = ["DEMO_CONFIG", "DEMO_MARKER", "run_demo"]

DEMO_MARKER = {"created_by": "ecrl demo"}
"""In the demo's ``run.json``: the only directories the demo ever replaces."""

DEMO_CONFIG = dict(
    world_sizes=(2, 2, 1), dataset="fake", dataset_size=2048, model="tiny-cnn", global_batch=32,
    steps=120, ckpt_every=20, strategy="overlapped", max_inflight=2, fail_at=(35, 85),
    fail_rank=0, seed=0, log_ids=True,
)


def _fresh(root: Path) -> None:
    """Make room for the demo: replace a directory only if an earlier demo created it."""
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        return
    try:
        ours = read_json_record(root / "run.json", RunManifest).extra.get("created_by") \
            == DEMO_MARKER["created_by"]
    except RunFormatError:
        ours = False
    if not ours:
        raise ConfigError(f"{root} exists and was not created by ecrl demo, so the demo will not "
                          "replace it: pass --out with a new directory")
    shutil.rmtree(root)


def run_demo(*, out: str = "demo-run") -> int:
    root = Path(out)
    _fresh(root)
    config = RunConfig(out=str(root), **DEMO_CONFIG)  # type: ignore[arg-type]
    print("ecrl demo: 2-rank DDP run of the tiny CNN on generated data, overlapped checkpoints "
          "every 20 steps,\n  failures injected after steps 35 and 85, the last attempt at "
          f"world size 1 (2→1); writing {root}/", flush=True)
    code = Supervisor(config, reporter=Console(), marker=dict(DEMO_MARKER)).run()
    if code != EXIT_OK:
        return code
    from verifier import render_text, verify

    result = verify(str(root))
    print(render_text(result), flush=True)
    return int(result.exit_code)
