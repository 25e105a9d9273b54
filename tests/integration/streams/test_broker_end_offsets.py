"""Reading a topic to its end on the real broker: a record batch's records all count.

The embedded broker answers ListOffsets with a batch's base offset + 1 where Kafka
answers its last offset + 1, while its fetches carry the true high watermark.
`streams.admin.ReadEnds` is the end every "read until the end" loop compares with."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dmem_bench.backends import BackendChoice
from streams.admin import ReadEnds

pytestmark = pytest.mark.integration
RECORDS = 20


async def _one_batch_then_read(broker: str, topic: str) -> tuple[int, list[int]]:
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=50)
    await producer.start()
    try:
        acks = [await producer.send(topic, b"r%d" % i, key=b"k") for i in range(RECORDS)]
        await producer.flush()  # one linger window: one record batch
        mds = [f.result() for f in acks]
    finally:
        await producer.stop()
    tp = TopicPartition(topic, mds[0].partition)
    c = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await c.start()
    try:
        c.assign([tp])
        await c.seek_to_beginning(tp)
        listed = (await c.end_offsets([tp]))[tp]
        ends = ReadEnds({tp: listed})
        got: list[int] = []
        while await c.position(tp) < ends.of(c, tp):
            batch = await c.getmany(tp, timeout_ms=1000, max_records=3)
            got += [m.offset for m in batch.get(tp, [])]
        return listed, got
    finally:
        await c.stop()


def test_reading_to_the_end_reads_the_whole_last_batch(
    broker: str, topic_prefix: str, test_backend: BackendChoice
) -> None:
    listed, got = asyncio.run(_one_batch_then_read(broker, f"{topic_prefix}ends"))
    assert got == list(range(RECORDS))  # every record, in order, none twice
    if test_backend.name == "embedded":  # the case `end_of` is for: a batch's base + 1
        assert listed < RECORDS
    else:  # Apache Kafka: the high watermark
        assert listed == RECORDS
