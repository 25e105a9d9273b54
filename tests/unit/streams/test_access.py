"""Access counts: published by the respond role, folded into rows by the jobs role once."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from schemas import AccessCount
from schemas.credentials import ServiceSigner
from streams.jobs.access import (
    AccessPublisher,
    AccessRead,
    AccessReads,
    AccessTracker,
    fold_access,
    read_access,
)
from streams.settings import Settings

T = "acme"


def rec(mid: str, n: int, ts: int) -> AccessCount:
    return AccessCount(memory_id=mid, tenant=T, n=n, ts=ts)


def test_records_are_read_in_log_order_per_memory() -> None:
    reads: AccessReads = {}
    read_access(reads, rec("a", 2, 50), partition=1, offset=7, logged=1000)
    read_access(reads, rec("b", 1, 10), partition=0, offset=2, logged=1001)
    read_access(reads, rec("a", 3, 40), partition=1, offset=9, logged=1002)
    assert reads == {
        (T, "a"): [AccessRead(1, 7, 1000, 2, 50), AccessRead(1, 9, 1002, 3, 40)],
        (T, "b"): [AccessRead(0, 2, 1001, 1, 10)],
    }


def test_a_row_takes_each_record_once() -> None:
    row: dict[str, Any] = {"metadata": {"task": "x"}, "last_access_ts": 30}
    first = [AccessRead(1, 10, 1000, 2, 20), AccessRead(1, 11, 1001, 1, 25)]
    assert fold_access(row, first)
    assert row["metadata"] == {"task": "x", "access": {"n": 3, "at": [1, 11, 1001]}}
    assert row["last_access_ts"] == 30  # a later stamp is never moved back
    assert not fold_access(row, first)  # the same records again
    # a replay (no commit after the first fold) that runs past what the row holds:
    # only the record it lacks counts
    assert fold_access(row, [*first, AccessRead(1, 12, 1002, 4, 60)])
    assert row["metadata"]["access"] == {"n": 7, "at": [1, 12, 1002]}
    assert row["last_access_ts"] == 60


def test_records_of_a_log_that_started_over_count() -> None:
    """A memory-only broker restarted (``dmem up``): offsets begin at 0 again, later in
    time; they count, and are then recognised when read again."""
    row: dict[str, Any] = {"metadata": {"access": {"n": 5, "at": [0, 40, 5000]}}}
    again = [AccessRead(0, 0, 9000, 1, 7), AccessRead(0, 1, 9001, 2, 8)]
    assert fold_access(row, again)
    assert row["metadata"]["access"] == {"n": 8, "at": [0, 1, 9001]}
    assert not fold_access(row, again)
    # two publishers whose clocks differ: a later offset with an earlier time counts,
    # and the latest time is kept
    assert fold_access(row, [AccessRead(0, 2, 8000, 1, 9)])
    assert row["metadata"]["access"] == {"n": 9, "at": [0, 2, 9001]}
    assert not fold_access(row, [AccessRead(0, 1, 9001, 2, 8)])
    # another partition (the topic was repartitioned) is new
    assert fold_access(row, [AccessRead(3, 0, 100, 1, 61)])
    assert row["metadata"]["access"]["n"] == 10


class FakeProducer:
    """Acknowledges every send but the ones for `fail` (their futures fail)."""

    def __init__(self, fail: set[bytes]) -> None:
        self.fail = fail
        self.sent: list[tuple[str, bytes, bytes, Any]] = []

    async def send(self, topic: str, value: bytes, key: bytes, headers: Any) -> Any:
        self.sent.append((topic, key, value, headers))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if key in self.fail:
            fut.set_exception(RuntimeError("not acknowledged"))
        else:
            fut.set_result(None)
        return fut


def test_the_publisher_signs_each_count_and_keeps_the_unacknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DMEM_AUTH__TOKENS", '{"tok": ["acme"]}')
    monkeypatch.setenv("DMEM_AUTH__SERVICE_SECRET", "s3cret")
    settings = Settings()
    tracker = AccessTracker()
    tracker.record(T, ["a", "b"], 100)
    tracker.record(T, ["a"], 120)
    pub = AccessPublisher(settings, tracker)
    producer = FakeProducer(fail={b"b"})
    pub.producer = producer  # type: ignore[assignment]
    asyncio.run(pub.flush())
    assert pub.published == 1
    assert tracker.drain() == {(T, "b"): (1, 100)}  # kept for the next round
    signer = ServiceSigner(b"s3cret")
    got = {}
    for topic, key, value, headers in producer.sent:
        assert topic == settings.topic("access") and signer.ok(key, value, headers)
        got[key] = AccessCount.model_validate(orjson.loads(value))
    assert got[b"a"] == rec("a", 2, 120) and got[b"b"] == rec("b", 1, 100)


def test_a_publisher_without_a_producer_keeps_every_count() -> None:
    tracker = AccessTracker()
    tracker.record(T, ["a"], 5)
    pub = AccessPublisher(Settings(), tracker)
    asyncio.run(pub.flush())
    assert pub.published == 0 and tracker.drain() == {(T, "a"): (1, 5)}


def test_a_count_that_is_no_valid_record_is_not_kept() -> None:
    """It would fail every round, and the role would never report settled."""
    tracker = AccessTracker()
    tracker.record(T, ["a"], 5)
    tracker.record(T, ["b"], -1)  # no event time
    pub = AccessPublisher(Settings(), tracker)
    pub.producer = FakeProducer(fail=set())  # type: ignore[assignment]
    asyncio.run(pub.flush())
    assert pub.published == 1 and tracker.pending() == 0


def test_a_record_without_a_timestamp_and_a_row_of_another_shape_do_not_stall_the_fold() -> None:
    """The oldest message format has no timestamp (aiokafka gives None); a row edited by
    hand may hold anything in ``access.at``: the fold goes on (a raise would stall the
    applier, credit included, on every retry)."""
    reads: AccessReads = {}
    read_access(reads, rec("a", 1, 5), partition=0, offset=3, logged=None)
    read_access(reads, rec("a", 1, 6), partition=0, offset=4, logged=-1)
    assert [r.logged for r in reads[(T, "a")]] == [0, 0]
    row: dict[str, Any] = {"metadata": {"access": {"n": 2, "at": [0, "x", None]}}}
    assert fold_access(row, reads[(T, "a")])
    assert row["metadata"]["access"] == {"n": 4, "at": [0, 4, 0]}
    assert not fold_access(row, reads[(T, "a")])  # read again: by its offset
