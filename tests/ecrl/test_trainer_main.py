"""The built-in trainer's rank entry (``python -m ecrl.runtime.trainer``): its imports run with
the cyclic collector held off, what they made is frozen, and the collector is on again for the
training itself."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, sys
from ecrl.runtime.trainer.__main__ import load
before = sum(s["collections"] for s in gc.get_stats())
main = load()
print(json.dumps({
    "collections": sum(s["collections"] for s in gc.get_stats()) - before,
    "frozen": gc.get_freeze_count(),
    "enabled": gc.isenabled(),
    "dynamo": "torch._dynamo" in sys.modules,
    "main": f"{main.__module__}.{main.__name__}",
}))
"""


def test_the_rank_entry_imports_without_collections_then_freezes_them() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=300)
    probe = json.loads(out.stdout)
    # With the collector on, the imports set off hundreds of collections; held off, only a
    # module's own gc.collect() call counts (torch makes one).
    assert probe["collections"] <= 3
    assert probe["frozen"] > 100_000  # torch's modules, out of later collections
    assert probe["enabled"] is True
    assert probe["dynamo"] is True
    assert probe["main"] == "ecrl.runtime.trainer.trainer.main"
