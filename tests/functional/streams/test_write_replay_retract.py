"""The write consumer's store stage keeps what a replay found stored: a retract of the
context guard's second look (`BatchResult.retract`) of a memory the store reports as a
replay, of this batch or of the batch before it, is neither evicted nor announced as
``evicted``; stage 1 judged it before stage 2 learned it was stored before."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from schemas import MemoryEvent, encode
from streams.settings import Settings
from streams.write.consumer import Message, WriteConsumer, _Batch
from streams.write.pipeline import BatchResult

TOPIC = Settings().topic("memories")


class Store:
    """Answers each batch's write with the replays it is given; records the evictions."""

    def __init__(self, replays: list[set[str]]) -> None:
        self.replays = replays
        self.evicted: list[list[tuple[str, str]]] = []

    async def write(self, upserts: Any, plan: Any) -> tuple[dict[str, str], set[str]]:
        return {}, self.replays.pop(0)

    async def evict(self, keys: list[tuple[str, str]]) -> None:
        self.evicted.append(list(keys))


class Producer:
    """Acknowledges every record batch at once; records what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def create_batch(self) -> Any:
        return SimpleNamespace(append=lambda key, value, **_: self.sent.append(orjson.loads(value)))

    async def send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def event(kind: str, tenant: str, mid: str) -> MemoryEvent:
    reason = "off_context" if kind == "evicted" else "gate"
    return MemoryEvent(kind=kind, memory_id=mid, tenant=tenant, reason=reason, ts=1)


def batch(written: list[str], retract: list[tuple[str, str]]) -> _Batch:
    """A batch that wrote ``written`` (tenant ``t``) and takes back ``retract``."""
    events = [event("written", "t", m) for m in written]
    events += [event("evicted", t, m) for t, m in retract]
    msgs: list[Message] = [(TOPIC, e.memory_id.encode(), encode(e), 0) for e in events]
    result = BatchResult(events=events, retract=list(retract))
    return _Batch(len(events), {}, result, msgs, 0.0, [], {})


def run(batches: list[_Batch], store: Store) -> list[list[dict[str, Any]]]:
    """The batches through stage 2, one after the other; the events each one produced."""
    pipe = SimpleNamespace(replayed=lambda keys: None,
                           guard=SimpleNamespace(enabled=False, sign=lambda k, v: []))  # fmt: skip
    producer = Producer()

    async def go() -> list[list[dict[str, Any]]]:
        w = WriteConsumer(Settings(), pipe, store, now_ms=lambda: 0)  # type: ignore[arg-type]
        w.producer = producer  # type: ignore[assignment]
        w.consumer = SimpleNamespace(assignment=lambda: set())  # type: ignore[assignment]
        stage = asyncio.create_task(w._stage_store())
        out: list[list[dict[str, Any]]] = []
        try:
            for b in batches:
                await w.queue.put(b)
                await asyncio.wait_for(w.queue.join(), 5)
                out.append(producer.sent[:])
                producer.sent.clear()
        finally:
            stage.cancel()
        return out

    return asyncio.run(go())


def evicted(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["tenant"], e["memory_id"]) for e in events if e["kind"] == "evicted"]


def test_a_retract_of_a_replayed_memory_is_withheld(caplog: pytest.LogCaptureFixture) -> None:
    store = Store([{"t|a", "t|b"}, {"t|c"}, set()])
    batches = [
        # a is a replay of this batch; n1 was written new; u|a is another tenant's
        batch(["a", "b", "n1"], [("t", "a"), ("t", "n1"), ("u", "a")]),
        # b was a replay of the batch before, judged before that batch's write
        batch(["c", "n2"], [("t", "b"), ("t", "n2")]),
        # two batches on, a's replay is no longer in flight: a retract of it is taken
        batch([], [("t", "a")]),
    ]
    with caplog.at_level(logging.INFO, logger="dmem.write"):
        produced = run(batches, store)

    assert store.evicted == [[("t", "n1"), ("u", "a")], [("t", "n2")], [("t", "a")]]
    assert [evicted(p) for p in produced] == store.evicted
    # the other events of the batch go out as they were
    assert [e["memory_id"] for e in produced[0] if e["kind"] == "written"] == ["a", "b", "n1"]
    assert [e["memory_id"] for e in produced[1] if e["kind"] == "written"] == ["c", "n2"]
    withheld = [r.getMessage() for r in caplog.records if "withheld" in r.getMessage()]
    assert len(withheld) == 2 and all("withheld 1 retract" in m for m in withheld)
