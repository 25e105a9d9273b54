"""Access counts: published by the respond role, folded into rows by the jobs role once."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from schemas import AccessCount
from schemas.credentials import ServiceSigner
from streams.jobs.access import AccessPublisher, AccessRead, AccessTracker, fold_access, read_access
from streams.settings import Settings

T = "acme"


def rec(mid: str, n: int, ts: int) -> AccessCount:
    return AccessCount(memory_id=mid, tenant=T, n=n, ts=ts)


def test_reads_of_one_memory_add_up_and_a_record_read_again_is_not() -> None:
    reads: dict[tuple[str, str], AccessRead] = {}
    read_access(reads, rec("a", 2, 50), partition=1, offset=7)
    read_access(reads, rec("a", 3, 40), partition=1, offset=9)
    read_access(reads, rec("a", 3, 40), partition=1, offset=9)  # redelivered
    read_access(reads, rec("b", 1, 10), partition=0, offset=2)
    assert reads == {(T, "a"): AccessRead(5, 50, 1, 9), (T, "b"): AccessRead(1, 10, 0, 2)}


def test_a_row_takes_each_count_once_by_where_it_was_read() -> None:
    row: dict[str, Any] = {"metadata": {"task": "x"}, "last_access_ts": 30}
    assert fold_access(row, AccessRead(2, 20, 1, 9))
    assert row["metadata"] == {"task": "x", "access": {"n": 2, "at": [1, 9]}}
    assert row["last_access_ts"] == 30  # a later stamp is never moved back
    assert not fold_access(row, AccessRead(2, 20, 1, 9))  # the same read again
    assert not fold_access(row, AccessRead(4, 60, 1, 8))  # an older record
    assert fold_access(row, AccessRead(1, 60, 1, 12))
    assert row["metadata"]["access"] == {"n": 3, "at": [1, 12]} and row["last_access_ts"] == 60
    # a count read from another partition (the topic was repartitioned) is new
    assert fold_access(row, AccessRead(1, 61, 3, 0)) and row["metadata"]["access"]["n"] == 4


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
