"""A folded id whose edge this process learned from the memories topic is read in
one store round trip (the id and its survivor in one lookup), and stays
tenant-scoped: the history recorder (`streams.jobs.history`) files a ``merged``
event from the real broker into the real Milvus and, on the way, into the
process' fold edges (`milvus.history.FoldEdges`) that the read path shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from schemas import MemoryEvent, encode
from streams.admin import ensure_topics
from streams.jobs.history import HistoryRecorder
from streams.respond.browse import MemoryReader
from streams.settings import Settings
from streams.store import StoreService
from tests.integration.broker_fixtures import produce
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration


def _counted(obj: Any, name: str, calls: list[str]) -> None:
    """Count the calls of ``obj.name`` (the real method still runs)."""
    real: Callable[..., Any] = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    setattr(obj, name, counted)


def test_an_edge_learned_from_the_stream_reads_the_survivor_in_one_round_trip(
    broker: str, topic_prefix: str, milvus_server_uri: str
) -> None:
    settings = Settings(
        kafka={"broker": f"kafka://{broker}", "topic_prefix": topic_prefix},
        milvus={"uri": milvus_server_uri, "collection": f"fe_{topic_prefix.strip('.')}"},
    )
    now = int(time.time() * 1000)
    merged = MemoryEvent(kind="merged", memory_id="f1", tenant="acme", partition="core",
                         reason="into s1 cos=0.9800", ts=now)  # fmt: skip

    async def run() -> dict[str, Any]:
        await ensure_topics(settings)
        svc = StoreService(settings, 8)
        await svc.start()
        try:
            await asyncio.wait_for(svc.connected.wait(), 60)
            store = svc.store
            assert store is not None
            rows = [make_record("s1", text="the survivor"),
                    make_record("s1", tenant="other", text="other's s1")]  # fmt: skip
            store.upsert(rows, "core")
            await produce(broker, settings.topic("memories"), [(b"acme", encode(merged))])
            rec = HistoryRecorder(settings, svc)
            await rec.start()
            try:
                deadline = time.monotonic() + 60
                while rec.recorded < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            finally:
                await rec.stop()
            assert rec.recorded == 1
            reader = MemoryReader(store, "Strong", store.history.edges)
            calls: list[str] = []
            _counted(store, "lookup", calls)
            _counted(store.history, "folded_into", calls)
            first = await asyncio.to_thread(reader.get, "acme", ["f1"])
            first_calls = list(calls)
            calls.clear()
            other = await asyncio.to_thread(reader.get, "other", ["f1"])
            out = {"first": first, "first_calls": first_calls, "other": other,
                   "other_calls": list(calls)}  # fmt: skip
            store.drop()
            return out
        finally:
            await svc.stop()

    got = asyncio.run(run())
    assert got["first"]["f1"]["memory_id"] == "s1" and got["first"]["f1"]["folded_id"] == "f1"
    assert got["first"]["f1"]["text"] == "the survivor"
    assert got["first_calls"] == ["lookup"]  # one round trip, no fold-index read
    # another tenant: the edge is acme's, so the id is unknown there (an HTTP 404)
    assert got["other"] == {}
    assert "folded_into" in got["other_calls"]  # it asked its own tenant's fold index
