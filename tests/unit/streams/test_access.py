"""Access counts: published by the respond role, folded into rows by the jobs role once."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from schemas import AccessCount
from schemas.credentials import ServiceSigner
from streams.jobs.access import (
    SEEN_PUBLISHERS,
    AccessPublisher,
    AccessRead,
    AccessReads,
    AccessTracker,
    fold_access,
    read_access,
)
from streams.settings import Settings

T = "acme"


P1, P2 = "0123456789abcdef", "fedcba9876543210"


def rec(mid: str, n: int, ts: int, seq: int = 1, publisher: str = P1) -> AccessCount:
    return AccessCount(memory_id=mid, tenant=T, n=n, ts=ts, publisher=publisher, seq=seq)


def test_records_are_read_in_log_order_per_memory() -> None:
    reads: AccessReads = {}
    read_access(reads, rec("a", 2, 50, seq=1))
    read_access(reads, rec("b", 1, 10, seq=1, publisher=P2))
    read_access(reads, rec("a", 3, 40, seq=2))
    assert reads == {
        (T, "a"): [AccessRead(P1, 1, 2, 50), AccessRead(P1, 2, 3, 40)],
        (T, "b"): [AccessRead(P2, 1, 1, 10)],
    }


def test_a_row_takes_each_record_once() -> None:
    row: dict[str, Any] = {"metadata": {"task": "x"}, "last_access_ts": 30}
    first = [AccessRead(P1, 1, 2, 20), AccessRead(P1, 2, 1, 25)]
    assert fold_access(row, first)
    assert row["metadata"] == {"task": "x", "access": {"n": 3, "seen": [[P1, 2]]}}
    assert row["last_access_ts"] == 30  # a later stamp is never moved back
    assert not fold_access(row, first)  # the same records again
    # a replay (no commit after the first fold) that runs past what the row holds:
    # only the record it lacks counts
    assert fold_access(row, [*first, AccessRead(P1, 3, 4, 60)])
    assert row["metadata"]["access"] == {"n": 7, "seen": [[P1, 3]]}
    assert row["last_access_ts"] == 60


def test_a_record_sent_twice_counts_once_and_publishers_count_apart() -> None:
    """An unacknowledged send the broker had stored is sent again with its round: both
    copies in the log add once. Two responders' rounds are independent (a respond worker
    that restarted begins again at round 1, under a new id)."""
    row: dict[str, Any] = {"metadata": {"access": {"n": 5, "seen": [[P1, 40]]}}}
    twice = [AccessRead(P1, 41, 2, 7), AccessRead(P2, 1, 1, 8), AccessRead(P1, 41, 2, 7)]
    assert fold_access(row, twice)
    assert row["metadata"]["access"] == {"n": 8, "seen": [[P1, 41], [P2, 1]]}
    assert not fold_access(row, twice)
    assert fold_access(row, [AccessRead(P1, 42, 1, 9)])  # the newest publisher last
    assert row["metadata"]["access"] == {"n": 9, "seen": [[P2, 1], [P1, 42]]}


def test_a_row_keeps_the_newest_publishers() -> None:
    pubs = [f"{i:016x}" for i in range(SEEN_PUBLISHERS + 3)]
    row: dict[str, Any] = {"metadata": {}}
    assert fold_access(row, [AccessRead(p, 1, 1, 1) for p in pubs])
    acc = row["metadata"]["access"]
    assert acc["n"] == len(pubs) and acc["seen"] == [[p, 1] for p in pubs[-SEEN_PUBLISHERS:]]


def test_a_copy_counts_once_while_fewer_than_the_kept_publishers_came_between() -> None:
    """A record sent again after a lost acknowledgement comes a flush later; in between,
    other responders' counts of the memory may be applied (a scaled-out respond role).
    Up to `SEEN_PUBLISHERS` - 1 of them the copy is still recognised."""
    others = [f"{i:016x}" for i in range(1, SEEN_PUBLISHERS)]
    row: dict[str, Any] = {"metadata": {}}
    assert fold_access(row, [AccessRead(P1, 5, 2, 1)])
    assert fold_access(row, [AccessRead(p, 1, 1, 2) for p in others])
    assert not fold_access(row, [AccessRead(P1, 5, 2, 1)])  # the copy
    assert row["metadata"]["access"]["n"] == 2 + len(others)


def test_an_access_count_names_a_responder_and_a_round() -> None:
    from pydantic import ValidationError

    for bad in ({"publisher": "x" * 16}, {"publisher": P1 + "0"}, {"publisher": P1.upper()},
                {"seq": 0}, {"seq": 2**62}):  # fmt: skip
        with pytest.raises(ValidationError):
            AccessCount.model_validate({**rec("a", 1, 1).model_dump(), **bad})


def test_a_row_of_another_shape_does_not_stall_the_fold() -> None:
    """A row edited by hand may hold anything in ``access.seen``: the fold goes on (a
    raise would stall the applier, credit included, on every retry)."""
    row: dict[str, Any] = {
        "metadata": {"access": {"n": 2, "seen": [[P1, "x"], [P2, 3], "junk", [P1, True]]}}
    }
    assert fold_access(row, [AccessRead(P1, 1, 1, 5), AccessRead(P2, 3, 1, 6)])
    assert row["metadata"]["access"] == {"n": 3, "seen": [[P2, 3], [P1, 1]]}
    # ids that are no responder's and rounds out of range are left out too: the list
    # keeps its byte bound whatever a hand edit put there
    row["metadata"]["access"]["seen"] = [["x" * 500, 1], [P2.upper(), 1], [P2, 0], [P2, 2**62]]
    assert fold_access(row, [AccessRead(P1, 2, 1, 5)])
    assert row["metadata"]["access"] == {"n": 4, "seen": [[P1, 2]]}
    row["metadata"]["access"] = {"n": 3, "seen": {"not": "a list"}}
    assert fold_access(row, [AccessRead(P1, 1, 1, 5)])
    assert row["metadata"]["access"] == {"n": 4, "seen": [[P1, 1]]}


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


def _sent(producer: FakeProducer) -> list[tuple[bytes, AccessCount]]:
    return [(k, AccessCount.model_validate(orjson.loads(v))) for _, k, v, _ in producer.sent]


def test_the_publisher_signs_each_count_and_sends_the_unacknowledged_again_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DMEM_AUTH__TOKENS", '{"tok": ["acme"]}')
    monkeypatch.setenv("DMEM_AUTH__SERVICE_SECRET", "s3cret")
    settings = Settings()
    tracker = AccessTracker()
    tracker.record(T, ["a", "b"], 100)
    tracker.record(T, ["a"], 120)
    pub = AccessPublisher(settings, tracker)
    me = pub.publisher
    producer = FakeProducer(fail={b"b"})
    pub.producer = producer  # type: ignore[assignment]
    asyncio.run(pub.flush())
    assert pub.published == 1 and tracker.pending() == 0 and pub.waiting() == 1
    signer = ServiceSigner(b"s3cret")
    for topic, key, value, headers in producer.sent:
        assert topic == settings.topic("access") and signer.ok(key, value, headers)
    assert sorted(_sent(producer)) == [(b"a", rec("a", 2, 120, 1, me)),
                                       (b"b", rec("b", 1, 100, 1, me))]  # fmt: skip
    # the next round: b's record again as it was (the broker may have stored it), b's
    # newer count held back behind it, a's new count in a new round
    tracker.record(T, ["a", "b"], 130)
    producer.sent.clear()
    producer.fail.clear()
    asyncio.run(pub.flush())
    assert sorted(_sent(producer)) == [(b"a", rec("a", 1, 130, 2, me)),
                                       (b"b", rec("b", 1, 100, 1, me))]  # fmt: skip
    assert pub.waiting() == 0 and tracker.pending() == 1
    producer.sent.clear()
    asyncio.run(pub.flush())
    assert _sent(producer) == [(b"b", rec("b", 1, 130, 3, me))]
    assert pub.waiting() == 0 and tracker.pending() == 0 and pub.published == 4


def test_a_flush_cancelled_part_way_leaves_its_records_to_the_next() -> None:
    """The role stops while a flush waits on the broker: the counts it took from the
    tracker are neither lost nor renumbered (the stop's own flush sends them again)."""

    class Cancelled(FakeProducer):
        """Sends "a", then is cancelled on "b" (once)."""

        cancel = True

        async def send(self, topic: str, value: bytes, key: bytes, headers: Any) -> Any:
            if key == b"b" and self.sent and self.cancel:
                self.cancel = False
                raise asyncio.CancelledError
            return await super().send(topic, value, key, headers)

    tracker = AccessTracker()
    tracker.record(T, ["a", "b"], 7)
    pub = AccessPublisher(Settings(), tracker)
    producer = Cancelled(fail=set())
    pub.producer = producer  # type: ignore[assignment]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(pub.flush())
    assert pub.waiting() == 2 and tracker.pending() == 0
    producer.sent.clear()
    asyncio.run(pub.flush())
    me = pub.publisher
    assert sorted(_sent(producer)) == [(b"a", rec("a", 1, 7, 1, me)), (b"b", rec("b", 1, 7, 1, me))]
    assert pub.waiting() == 0 and pub.published == 2


def test_a_send_the_broker_refuses_part_way_keeps_the_rest_for_the_next_flush() -> None:
    from aiokafka.errors import KafkaTimeoutError

    class Refusing(FakeProducer):
        async def send(self, topic: str, value: bytes, key: bytes, headers: Any) -> Any:
            if key == b"b" and not self.fail:
                raise KafkaTimeoutError()
            return await super().send(topic, value, key, headers)

    tracker = AccessTracker()
    tracker.record(T, ["a", "b", "c"], 3)
    pub = AccessPublisher(Settings(), tracker)
    producer = Refusing(fail=set())
    pub.producer = producer  # type: ignore[assignment]
    asyncio.run(pub.flush())
    assert [k for k, _ in _sent(producer)] == [b"a"] and pub.waiting() == 2
    producer.sent.clear()
    producer.fail.add(b"-")  # the broker takes sends again
    asyncio.run(pub.flush())
    me = pub.publisher
    assert sorted(_sent(producer)) == [(b"b", rec("b", 1, 3, 1, me)), (b"c", rec("c", 1, 3, 1, me))]
    assert pub.waiting() == 0 and pub.published == 3


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
    assert pub.published == 1 and tracker.pending() == 0 and pub.waiting() == 0


def test_each_responder_draws_its_own_id() -> None:
    a, b = (
        AccessPublisher(Settings(), AccessTracker()),
        AccessPublisher(Settings(), AccessTracker()),
    )
    assert a.publisher != b.publisher and len(a.publisher) == 16


class PartitionsOf:
    """A started consumer's metadata: topic -> its partitions."""

    def __init__(self, parts: dict[str, set[int]]) -> None:
        self.parts = parts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.parts.get(topic)


@pytest.mark.parametrize(
    ("credit", "access", "logged"),
    [(4, 4, False), (4, 2, True), (4, 0, False)],  # a topic not there yet: nothing to say
)
def test_the_applier_says_at_start_where_its_topics_differ_in_partition_count(
    credit: int, access: int, logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from streams.jobs.credit import UtilityApplier

    settings = Settings()
    applier = UtilityApplier(settings, SimpleNamespace(store=None))
    topics = [settings.topic("credit"), settings.topic("access")]
    consumer = PartitionsOf({t: set(range(n)) for t, n in zip(topics, (credit, access), strict=True)
                             if n})  # fmt: skip
    consumer._client = SimpleNamespace(force_metadata_update=_nothing)  # type: ignore[attr-defined]  # noqa: SLF001
    applier.consumer = consumer  # type: ignore[assignment]
    with caplog.at_level("ERROR"):
        asyncio.run(applier._check_partitions(topics))  # noqa: SLF001
    assert ("differ in partition count" in caplog.text) is logged


async def _nothing() -> None:
    return None
