"""The runtime's runs, checked by ecrl-verify once the verifier provides `verify` (issue #4).

Until then these tests are skipped (reported as skipped, never as passed); the runtime's own
oracle (lineage_check.py) checks the same runs in the meantime.
"""

from __future__ import annotations

import pytest
from conftest import Run

pytestmark = pytest.mark.torchrun


@pytest.mark.parametrize("name", ["reference_run", "blocking_run", "overlapped_run", "demo_run",
                                  "elastic_up_run", "writer_crash_run"])
def test_verifier_passes_every_completed_run(name: str, request: pytest.FixtureRequest) -> None:
    verifier = pytest.importorskip("verifier")
    if not hasattr(verifier, "verify"):
        pytest.skip("the verifier does not provide verify() yet")
    run: Run = request.getfixturevalue(name)
    result = verifier.verify(str(run.root))
    assert result.exit_code == 0, verifier.render_text(result)
