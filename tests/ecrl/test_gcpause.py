"""The collector pause that the sharded boundary and the verifier's block parse share."""

from __future__ import annotations

import gc

import pytest

from ecrl.contract.gcpause import collection_paused


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pause_leaves_garbage_collection_as_it_found_it(enabled: bool) -> None:
    try:
        (gc.enable if enabled else gc.disable)()
        with collection_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(KeyError), collection_paused():
            raise KeyError("inside")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
