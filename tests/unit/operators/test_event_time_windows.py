"""Event-time windows of the dedup job: what is due, in which order, whatever the arrival."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.dedup import EventTimeWindows

LATE = 1_000


def _stream(draw: st.DrawFn) -> list[tuple[int, str]]:
    n = draw(st.integers(1, 40))
    stamps = draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n))
    return [(ts, f"m{i:03d}") for i, ts in enumerate(stamps)]


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[tuple[int, str]], list[tuple[int, str]], set[int]]:
    """A stream, one arrival order of it that is late by at most LATE, and close points."""
    items = sorted(_stream(draw))
    jitter = draw(st.lists(st.integers(0, LATE), min_size=len(items), max_size=len(items)))
    order = sorted(range(len(items)), key=lambda i: (items[i][0] + jitter[i], i))
    closes = set(draw(st.lists(st.integers(0, len(items)), max_size=8)))
    return items, [items[i] for i in order], closes


def _drive(arrived: list[tuple[int, str]], closes: set[int]) -> list[tuple[int, str, int]]:
    w = EventTimeWindows(LATE)
    out: list[tuple[int, str, int]] = []
    for k, (ts, mid) in enumerate(arrived):
        if k in closes:
            out += w.due("t")
        w.add("t", mid, ts, (0, k))
    return out + w.due("t", flush=True)


@settings(max_examples=200, deadline=None)
@given(arrivals())
def test_any_arrival_within_the_lateness_and_any_cut_decides_in_event_time_order(
    case: tuple[list[tuple[int, str]], list[tuple[int, str]], set[int]],
) -> None:
    items, arrived, closes = case
    decided = _drive(arrived, closes)
    assert [(ts, mid) for ts, mid, _ in decided] == items  # (event time, id) order, each once
    # each memory sees the store as of its own event time: nothing newer was decided before
    assert all(as_of == ts for ts, _, as_of in decided)


@settings(max_examples=100, deadline=None)
@given(arrivals())
def test_the_decisions_do_not_depend_on_when_the_timer_fired(
    case: tuple[list[tuple[int, str]], list[tuple[int, str]], set[int]],
) -> None:
    _, arrived, closes = case
    assert _drive(arrived, closes) == _drive(arrived, set()) == _drive(arrived, set(range(50)))


def test_due_waits_for_the_watermark_minus_the_lateness() -> None:
    w = EventTimeWindows(LATE)
    w.add("t", "a", 10_000, (0, 0))
    assert w.due("t") == [] and len(w) == 1 and not w.has_due()
    w.advance("t", 10_999)  # a dropped transition's event time moves the watermark too
    assert w.due("t") == []
    w.advance("t", 11_000)
    assert w.has_due()
    assert w.due("t") == [(10_000, "a", 10_000)]
    assert len(w) == 0


def test_watermarks_are_per_tenant() -> None:
    w = EventTimeWindows(LATE)
    w.add("a", "x", 1_000)
    w.add("b", "y", 1_000)
    w.advance("b", 100_000)  # tenant b's clock runs far ahead: a's memories stay pending
    assert [m for _, m, _ in w.due("a")] == []
    assert [m for _, m, _ in w.due("b")] == ["y"]
    assert w.bound("a") == 0 and w.bound("c") is None


def test_a_late_memory_is_counted_and_compared_with_everything_decided() -> None:
    w = EventTimeWindows(LATE)
    w.add("t", "new", 50_000)
    w.advance("t", 60_000)
    assert w.due("t") == [(50_000, "new", 50_000)]
    w.add("t", "old", 20_000)  # arrives 40 s after the watermark passed it
    assert w.late == 1
    assert w.due("t") == [(20_000, "old", 50_000)]  # sees "new", which was decided first


def test_low_offsets_and_removal() -> None:
    w = EventTimeWindows(LATE)
    w.add("t", "a", 5_000, (0, 7))
    w.add("t", "b", 6_000, (0, 3))
    w.add("t", "c", 6_000, (1, 9))
    w.add("t", "a", 5_000, (0, 12))  # a replayed record keeps its first position
    assert w.low_offsets() == {0: 3, 1: 9}
    w.remove("t", "b")  # merged away before it was due
    assert w.low_offsets() == {0: 7, 1: 9}
    assert [m for _, m, _ in w.due("t", flush=True)] == ["a", "c"]
    assert w.low_offsets() == {} and len(w) == 0
    with pytest.raises(ValueError):
        EventTimeWindows(-1)
