"""Tombstones and the shared/exclusive guard (`milvus.tombstones`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

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


def test_a_file_keeps_the_live_tombstones_across_a_restart(tmp_path: Path) -> None:
    """With a file, a new process's set refuses what the last one forgot within the
    TTL, drops what expired, survives a line cut short by a crash, and rewrites the file
    with the live keys only."""
    now = [1000.0]
    path = tmp_path / "tomb" / "tombstones.jsonl"
    first = Tombstones(ttl_s=60.0, clock=lambda: now[0], path=path)
    first.add(["t|old"], at=950.0)  # until 1010
    first.add(["t|a", "t|b"])  # until 1060
    with path.open("a") as f:
        f.write('{"k": "t|cut", "u": 10')  # a crash mid-line
    now[0] = 1020.0
    second = Tombstones(ttl_s=60.0, clock=lambda: now[0], path=path)
    assert second.dead(["t|a", "t|b", "t|old", "t|cut", "t|x"]) == {"t|a", "t|b"}
    assert len(path.read_text().splitlines()) == 2
    second.clear()
    assert not path.exists()
    assert Tombstones(ttl_s=60.0, clock=lambda: now[0], path=path).dead(["t|a"]) == set()


def test_dmem_up_keeps_its_tombstones_beside_its_data(tmp_path: Path) -> None:
    """The embedded stack's broker is memory-only: its workers keep the refusals in the
    data dir (`DMEM_MILVUS__TOMBSTONE_FILE`), and the store's set is the file's."""
    from milvus import MemoryStore
    from streams.local.stack import LocalStack
    from streams.settings import Settings

    env = LocalStack(tmp_path / "d").env(1)
    assert env["DMEM_MILVUS__TOMBSTONE_FILE"] == str(tmp_path / "d" / "tombstones.jsonl")
    s = Settings.model_validate({"milvus": {"tombstone_file": env["DMEM_MILVUS__TOMBSTONE_FILE"]}})
    assert s.milvus.tombstone_file == tmp_path / "d" / "tombstones.jsonl"
    store = MemoryStore(str(tmp_path / "m.db"), collection="tomb_file_wiring",
                        tombstone_file=tmp_path / "t.jsonl")  # fmt: skip
    assert store.tombstones.path == tmp_path / "t.jsonl"
