"""Run many ``ecrl-verify`` and ``ecrl-transform`` invocations in one process, through the CLIs'
main functions: ``python -I bare_install_jobs.py JOBS.json RESULTS.json``.

``tests/test_packaging.py`` runs it in an environment where ``pip install ecrl`` left out torch,
and calls :func:`run_jobs` with the same jobs in the development environment, then compares the
two. One process for all fixtures keeps the comparison to seconds. Only the standard library is
imported at the top, so that it is the installed ``ecrl`` that the jobs load.
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any


def run_jobs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each job: ``{"tool": "verify" | "transform", "argv": [...], "output": PATH | None}``;
    each result: its exit status, stdout, stderr and the file it wrote (``output``)."""
    from transform.cli import main as transform_main
    from verifier.cli import main as verify_main

    mains = {"verify": verify_main, "transform": transform_main}
    results = []
    for job in jobs:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = mains[job["tool"]](job["argv"])
        output = job.get("output")
        results.append({"status": status, "stdout": out.getvalue(), "stderr": err.getvalue(),
                        "written": Path(output).read_text(encoding="utf-8") if output else None})
    import verifier

    return {"results": results, "torch_imported": "torch" in sys.modules,
            "verifier_file": verifier.__file__}


if __name__ == "__main__":
    jobs_file, results_file = sys.argv[1:]
    jobs = json.loads(Path(jobs_file).read_text())
    Path(results_file).write_text(json.dumps(run_jobs(jobs)))
