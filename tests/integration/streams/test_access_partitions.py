"""The applier's two topics on the real broker: ``dmem.access`` is made with the
partition count of ``dmem.credit`` (`streams.admin.ensure_topics`), and the members of
the applier's group read the same partitions of both (`group_consumer` with
``co_partitioned``), so one process folds a memory's credit and its access counts."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.admin import ensure_topics, group_consumer, partition_count
from streams.settings import Settings

pytestmark = pytest.mark.integration


def test_access_follows_credit_and_a_member_reads_both_alike(
    broker: str, topic_prefix: str
) -> None:
    settings = Settings(kafka={"broker": f"kafka://{broker}", "topic_prefix": topic_prefix,
                               "partitions": 4})  # fmt: skip
    credit, access = settings.topic("credit"), settings.topic("access")

    fresh = Settings(kafka={"broker": f"kafka://{broker}", "topic_prefix": f"{topic_prefix}new.",
                            "partitions": 2})  # fmt: skip

    async def run() -> tuple[int, int, list[dict[str, set[int]]]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker)
        await admin.start()
        try:  # a deployment whose credit topic was made with 3 partitions
            await admin.create_topics([NewTopic(credit, 3, 1)])
            await ensure_topics(settings)
            n_access = await partition_count(admin, access)
            n_other = await partition_count(admin, settings.topic("usage"))
            # a new deployment: both made now, with the configured count
            await ensure_topics(fresh)
            for logical in ("credit", "access"):
                assert await partition_count(admin, fresh.topic(logical)) == 2
        finally:
            await admin.close()
        members = [group_consumer(settings, [credit, access], "applier-test", co_partitioned=True)
                   for _ in range(2)]  # fmt: skip
        for c in members:
            await c.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await asyncio.gather(*(c.getmany(timeout_ms=200) for c in members))
                got = [c.assignment() for c in members]
                if sum(len(a) for a in got) == 6 and all(got):
                    break
            by_topic = [{t: {tp.partition for tp in a if tp.topic == t} for t in (credit, access)}
                        for a in (c.assignment() for c in members)]  # fmt: skip
        finally:
            for c in members:
                await c.stop()
        return n_access, n_other, by_topic

    n_access, n_other, by_topic = asyncio.run(run())
    assert n_access == 3 and n_other == 4
    assert sum(len(m[credit]) for m in by_topic) == 3  # every partition, each once
    for m in by_topic:
        assert m[credit] and m[credit] == m[access]
