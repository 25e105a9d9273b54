"""Tombstones and the shared/exclusive guard (`milvus.tombstones`)."""

from __future__ import annotations

import threading
import time

import pytest

from milvus.tombstones import SharedExclusive, Tombstones, tombstones_for


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_key_is_dead_for_the_ttl_then_alive_again() -> None:
    clock = Clock()
    t = Tombstones(ttl_s=60, clock=clock)
    t.add(["a|1", "a|2"])
    assert t.dead(["a|1", "a|2", "b|1"]) == {"a|1", "a|2"}
    clock.t += 59
    assert t.dead(["a|1"]) == {"a|1"}
    clock.t += 2
    assert t.dead(["a|1", "a|2"]) == set() and len(t) == 0


def test_forget_time_comes_from_the_notice_not_the_arrival() -> None:
    clock = Clock()
    t = Tombstones(ttl_s=60, clock=clock)
    t.add(["a|old"], at=clock.t - 59)  # a broadcast notice 59 s old
    t.add(["a|new"])
    clock.t += 2
    assert t.dead(["a|old", "a|new"]) == {"a|new"}


def test_the_set_is_bounded_oldest_first() -> None:
    t = Tombstones(ttl_s=60, max_keys=2, clock=Clock())
    t.add(["k1"])
    t.add(["k2"])
    t.add(["k3"])
    assert t.dead(["k1", "k2", "k3"]) == {"k2", "k3"}


def test_invalid_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Tombstones(ttl_s=0)
    with pytest.raises(ValueError):
        Tombstones(max_keys=0)


def test_one_set_per_collection() -> None:
    a = tombstones_for("/tmp/x.db", "c1")
    assert tombstones_for("/tmp/x.db", "c1") is a
    assert tombstones_for("/tmp/x.db", "c2") is not a
    assert tombstones_for("/tmp/y.db", "c1") is not a


def test_exclusive_waits_for_shared_holders_and_blocks_new_ones() -> None:
    lock = SharedExclusive()
    order: list[str] = []
    in_shared = threading.Event()
    release_shared = threading.Event()

    def writer(name: str, started: threading.Event | None = None) -> None:
        with lock.shared():
            if started is not None:
                started.set()
                release_shared.wait(5)
            order.append(name)

    def forgetter() -> None:
        with lock.exclusive():
            order.append("forget")
            time.sleep(0.05)
            order.append("forget-end")

    first = threading.Thread(target=writer, args=("w1", in_shared))
    first.start()
    assert in_shared.wait(5)
    f = threading.Thread(target=forgetter)
    f.start()
    time.sleep(0.05)
    assert order == []  # the forget waits for the write in progress
    late = threading.Thread(target=writer, args=("w2",))
    late.start()
    time.sleep(0.05)
    release_shared.set()
    for th in (first, f, late):
        th.join(5)
    # the write in progress finishes first; the later write waits for the forget
    assert order == ["w1", "forget", "forget-end", "w2"]


def test_a_tombstone_dated_in_the_future_lasts_one_ttl_from_now() -> None:
    clock = Clock()
    t = Tombstones(ttl_s=60, clock=clock)
    t.add(["far|1"], at=clock.t + 10 * 365 * 86400)  # a forged notice dated years ahead
    t.add(["later|1"], at=clock.t)
    clock.t += 59
    assert t.dead(["far|1", "later|1"]) == {"far|1", "later|1"}
    clock.t += 2  # both expire: the future one neither outlives the TTL nor stalls expiry
    assert t.dead(["far|1", "later|1"]) == set() and len(t) == 0
