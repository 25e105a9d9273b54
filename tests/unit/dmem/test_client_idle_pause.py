"""`Client`'s Kafka transport pauses its response partitions while no search waits.

Why it matters: the response consumer fetches with a short ``fetch_max_wait_ms``
(the embedded broker holds a fetch for its whole max wait), which would cost
~200 empty fetches/s in an idle agent. Fakes stand in for aiokafka here; the
real request/reply path is covered by tests/integration/test_read_path.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from dmem.client import Client
from schemas import RetrievalRequest, RetrievalResponse
from schemas.errors import ServiceUnavailable


class FakeConsumer:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def pause(self, *tps: TopicPartition) -> None:
        self.log.append(f"pause {len(tps)}")

    def resume(self, *tps: TopicPartition) -> None:
        self.log.append(f"resume {len(tps)}")


class FakeProducer:
    """Answers a request by resolving the client's waiter, as the reader task would."""

    def __init__(self, client: Client, log: list[str], answer: bool = True) -> None:
        self.client, self.log, self.answer = client, log, answer

    async def send_and_wait(self, topic: str, value: bytes, key: bytes) -> None:
        self.log.append(f"send {topic}")
        for rid, fut in self.client._waiting.items():  # noqa: SLF001
            if self.answer and not fut.done():
                fut.set_result(RetrievalResponse(request_id=rid, tenant="t"))


def _client(log: list[str], answer: bool = True, **kw: Any) -> Client:
    c = Client("127.0.0.1:1", "t", **kw)
    c._consumer = FakeConsumer(log)  # type: ignore[assignment]  # noqa: SLF001
    c._tps = [TopicPartition("dmem.retrieval.responses", p) for p in range(3)]  # noqa: SLF001
    c._producer = FakeProducer(c, log, answer)  # type: ignore[assignment]  # noqa: SLF001
    c._started = True  # noqa: SLF001
    return c


def _req(rid: str) -> RetrievalRequest:
    return RetrievalRequest.model_validate({"request_id": rid, "tenant": "t", "query": "q"})


def test_resume_before_send_and_pause_after_answer() -> None:
    log: list[str] = []
    c = _client(log)
    resp = asyncio.run(c._search_kafka(_req("r1")))  # noqa: SLF001
    assert resp.request_id == "r1"
    assert log == ["resume 3", "send dmem.retrieval.requests", "pause 3"]
    assert c._waiting == {}  # noqa: SLF001


def test_concurrent_searches_pause_only_when_the_last_finishes() -> None:
    log: list[str] = []
    c = _client(log)

    async def both() -> tuple[RetrievalResponse, RetrievalResponse]:
        return await asyncio.gather(c._search_kafka(_req("a")), c._search_kafka(_req("b")))  # noqa: SLF001

    out = asyncio.run(both())
    assert sorted(r.request_id for r in out) == ["a", "b"]
    assert log.count("resume 3") == 1 and log[0] == "resume 3"
    assert log.count("pause 3") == 1 and log[-1] == "pause 3"


def test_timeout_still_pauses() -> None:
    log: list[str] = []
    c = _client(log, answer=False, timeout_s=0.01, retries=1)
    with pytest.raises(ServiceUnavailable):
        asyncio.run(c._search_kafka(_req("lost")))  # noqa: SLF001
    assert log == [
        "resume 3",
        "send dmem.retrieval.requests",
        "send dmem.retrieval.requests",
        "pause 3",
    ]


def test_fetch_wait_is_configurable() -> None:
    assert Client("h:1", "t").fetch_max_wait_ms == 5
    assert Client("h:1", "t", fetch_max_wait_ms=50).fetch_max_wait_ms == 50
