"""The one definition of goodput (ecrl.contract.goodput): committed steps over the wall time from
the first attempt's start to the last attempt's end, less the waits after a person's stop."""

from __future__ import annotations

import pytest

from ecrl.contract.goodput import AttemptSpan, goodput, wall_time


def span(start: float, end: float | None, stopped: bool = False) -> AttemptSpan:
    return AttemptSpan(start=start, end=end, stopped=stopped)


def test_one_attempt() -> None:
    g = goodput(committed_steps=30, spans=[span(100.0, 130.0)])
    assert g.wall_s == 30.0 and g.steps_per_s == 1.0


def test_relaunches_and_replays_count_as_wall_time() -> None:
    # Two failures, each followed by a 5 s relaunch: the user waited for all of it.
    spans = [span(0.0, 10.0), span(15.0, 25.0), span(30.0, 40.0)]
    assert wall_time(spans) == 40.0
    assert goodput(committed_steps=20, spans=spans).steps_per_s == 0.5


def test_the_wait_after_a_stop_is_not_counted() -> None:
    stopped_then_continued = [span(1000.0, 1010.0, stopped=True),
                              span(1000.0 + 3 * 86400, 1000.0 + 3 * 86400 + 20)]
    assert wall_time(stopped_then_continued) == 30.0
    # A failure's relaunch counts, however long; a stop at the end changes nothing.
    assert wall_time([span(0.0, 10.0), span(100.0, 110.0, stopped=True)]) == 110.0


def test_unknown_ends() -> None:
    # A running attempt without an end: the caller says where it ends (or not at all).
    assert wall_time([span(0.0, 10.0), span(12.0, None)]) == 10.0
    assert wall_time([span(0.0, None)]) is None
    assert wall_time([]) is None
    g = goodput(committed_steps=5, spans=[span(7.0, 7.0)])
    assert g.wall_s is None and g.steps_per_s is None


@pytest.mark.parametrize("committed", [0, 1, 1000])
def test_goodput_is_committed_steps_per_second(committed: int) -> None:
    g = goodput(committed_steps=committed, spans=[span(0.0, 4.0)])
    assert g.steps_per_s == committed / 4.0
