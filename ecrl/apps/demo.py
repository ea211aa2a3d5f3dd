"""``ecrl demo``: the embedded default, end to end, in a couple of minutes on a laptop.

Two ranks train the tiny CNN on generated data with overlapped checkpoints every 20 steps; a
failure is injected after step 35 and another after step 85; the third attempt runs at world size
1 (a 2→1 resume). Then the runtime's summary, and the verifier's verdict on the run directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ecrl.contract.errors import ConfigError
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervisor import EXIT_OK, Supervisor

__all__ = ["DEMO_CONFIG", "run_demo"]

DEMO_CONFIG = dict(
    world_sizes=(2, 2, 1), dataset="fake", dataset_size=2048, model="tiny-cnn", global_batch=32,
    steps=120, ckpt_every=20, strategy="overlapped", max_inflight=2, fail_at=(35, 85),
    fail_rank=0, seed=0, log_ids=True,
)


def _fresh(root: Path) -> None:
    if not root.exists():
        return
    if (root / "run.json").exists() or not any(root.iterdir()):
        shutil.rmtree(root)
    else:
        raise ConfigError(f"{root} exists and is not an ECRL run: remove it or pass --out DIR")


def run_demo(*, out: str = "demo-run") -> int:
    root = Path(out)
    _fresh(root)
    config = RunConfig(out=str(root), **DEMO_CONFIG)  # type: ignore[arg-type]
    print("ecrl demo: 2-rank DDP run of the tiny CNN on generated data, overlapped checkpoints "
          "every 20 steps,\n  failures injected after steps 35 and 85, the last attempt at "
          f"world size 1 (2→1); writing {root}/", flush=True)
    code = Supervisor(config).run()
    if code != EXIT_OK:
        return code
    from verifier import render_text, verify

    result = verify(str(root))
    print(render_text(result), flush=True)
    return int(result.exit_code)
