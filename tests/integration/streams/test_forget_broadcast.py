"""The forget broadcast over the real broker (`streams.control.ForgetFollower`).

A process that did not run the forget (another worker) may have written the row
back between the origin's delete and the notice: following ``control`` it
tombstones the key and deletes it once more, so the row is gone everywhere and
stays gone. A notice older than the tombstone TTL is not echoed (the key may
legitimately have been written again since).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from milvus import MemoryStore
from milvus.tombstones import Tombstones
from schemas import MemoryEvent, encode
from streams.admin import ensure_topics
from streams.control import ForgetFollower, echo_to_store
from streams.settings import Settings
from tests.integration.broker_fixtures import produce
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration


def test_a_forget_notice_removes_a_row_written_back_in_another_process(
    broker: str, topic_prefix: str, milvus_server_uri: str
) -> None:
    settings = Settings(kafka={"broker": f"kafka://{broker}", "topic_prefix": topic_prefix})
    store = MemoryStore(milvus_server_uri, collection=f"fb_{topic_prefix.strip('.')}",
                        dim=8).connect()  # fmt: skip
    store.tombstones = Tombstones()  # this "process" has not seen the forget yet
    try:
        store.upsert([make_record(m, seed=i) for i, m in enumerate(("back", "old", "keep"))],
                     "core")  # fmt: skip
        now = time.time() * 1000
        notices = [
            MemoryEvent(kind="forgotten", memory_id="back", tenant="acme", ts=int(now)),
            # a forget of 2 h ago: its key was written again since, legitimately
            MemoryEvent(
                kind="forgotten", memory_id="old", tenant="acme", ts=int(now - 2 * 3600 * 1000)
            ),  # fmt: skip
            MemoryEvent(kind="written", memory_id="keep", tenant="acme", ts=int(now)),
        ]

        async def run() -> int:
            await ensure_topics(settings)
            await produce(broker, settings.topic("control"),
                          [(b"acme", encode(ev)) for ev in notices])  # fmt: skip
            follower = ForgetFollower(settings, [echo_to_store(SimpleNamespace(store=store))])
            await follower.start()
            try:
                deadline = time.monotonic() + 30
                while follower.applied < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                return follower.applied
            finally:
                await follower.stop()

        assert asyncio.run(run()) == 2  # the two `forgotten` notices, not the `written` one
        assert sorted(r["id"] for r in store.get(["back", "old", "keep"], tenant="acme")) == [
            "keep",
            "old",
        ]
        # and the row stays gone: this process's writers are refused now
        assert store.upsert([make_record("back")], "core") == 0
    finally:
        store.drop()
