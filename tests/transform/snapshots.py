"""``python tests/transform/snapshots.py [--update]``: the code written for every fixture, pinned.

For each ``fixtures/programs/<case>/input.py`` the program is transformed exactly as
``ecrl-transform input.py -o OUT ARGS`` would (``ARGS``: ``transform_args`` of the case's
``case.json``, default ``--all-hints`` so every construct's generated code is pinned) and compared
with ``expected-output.py``. Without ``--update`` a stale or missing snapshot is listed and the
exit status is 1; with it they are rewritten. Run it after a deliberate change to the generator
and review the diff.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CORPUS", "SNAPSHOT", "cases", "generated_for", "main"]

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"
SNAPSHOT = "expected-output.py"


def cases(corpus: Path = CORPUS) -> list[Path]:
    return sorted(p for p in corpus.iterdir() if (p / "input.py").exists())


def arguments(case: Path) -> list[str]:
    spec = case / "case.json"
    data = json.loads(spec.read_text()) if spec.exists() else {}
    return list(data.get("transform_args", ["--all-hints"]))


def generated_for(case: Path) -> str:
    """What ``ecrl-transform`` writes for this case."""
    from transform.cli import main as transform_main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.py"
        status = transform_main([str(case / "input.py"), "-o", str(out), *arguments(case)])
        if status != 0:
            raise SystemExit(f"{case.name}: ecrl-transform exited {status}")
        return out.read_text(encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/transform/snapshots.py",
                                     description="Check (or --update) the generated code "
                                     "pinned for each program fixture.")
    parser.add_argument("--update", action="store_true", help="rewrite stale snapshots")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="fixture directory")
    args = parser.parse_args(argv)
    stale = []
    for case in cases(args.corpus):
        code = generated_for(case)
        target = case / SNAPSHOT
        if target.exists() and target.read_text(encoding="utf-8") == code:
            continue
        stale.append(case.name)
        if args.update:
            target.write_text(code, encoding="utf-8")
    verb = "updated" if args.update else "stale"
    for name in stale:
        print(f"{verb}: {name}/{SNAPSHOT}")
    if stale and not args.update:
        print("run `python tests/transform/snapshots.py --update` and review the diff",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
