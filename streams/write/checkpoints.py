"""Where each (tenant, partition) checkpoint lies on the compacted ``models`` topic.

The write role restores the state of the input partitions it is assigned at
every rebalance (`streams.write.consumer`), so reading the whole ``models``
topic each time would cost as much as the topic holds (an embedded broker does
not compact, and even a compacted topic keeps its head uncompacted).
`CheckpointIndex` reads the topic once, from the beginning, and then tails it,
keeping only *where* the latest record of every key is (partition, offset), not
its bytes; `load` then fetches exactly the records a restore needs. Memory is a
few dozen bytes per key whatever the states weigh.

Decisions:
- No consumer group: every write worker must see every key (any partition may
  be handed to it), like the ``control`` topic.
- `sync` waits until the index has read up to the end offsets of the moment it
  is called. A restore calls it first: a revoked owner's last checkpoints were
  acknowledged before its rebalance callback returned, i.e. before this worker
  was assigned the partition, so after `sync` they are indexed.
- A tombstone (value None) removes a key.
- With Kafka auth on (`streams.auth.KafkaGuard`) only records the service signed
  are indexed: a forged checkpoint or tombstone neither replaces nor hides the
  latest genuine one (refusals are logged and counted in ``refused``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from streams.admin import ReadEnds, kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.settings import Settings

log = logging.getLogger("dmem.write")

#: largest checkpoint record either consumer accepts (a state is ~0.3-2 MB)
MAX_RECORD_BYTES = 32 * 1024 * 1024


class CheckpointIndex(Service):
    """Latest (partition, offset) of every key of a compacted topic; fetches values on demand."""

    def __init__(self, settings: Settings, topic: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.topic = topic
        self.where: dict[bytes, tuple[int, int]] = {}
        self.tps: list[TopicPartition] = []
        self._reader: AIOKafkaConsumer | None = None
        self._loader: AIOKafkaConsumer | None = None
        self._read_up_to: dict[TopicPartition, int] = {}
        self._moved = asyncio.Event()
        self.loads = 0
        self.guard = KafkaGuard.from_settings(settings)

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=MAX_RECORD_BYTES,
            fetch_max_bytes=MAX_RECORD_BYTES,
            **kafka_client_kwargs(self.settings.kafka),
        )

    async def on_start(self) -> None:
        self._reader, self._loader = self._consumer(), self._consumer()
        await self._reader.start()
        await self._loader.start()
        parts = self._reader.partitions_for_topic(self.topic)
        while not parts and not self.should_stop:  # `dmem topics create` may come later
            await self._reader._client.force_metadata_update()  # noqa: SLF001
            parts = self._reader.partitions_for_topic(self.topic)
            if not parts:
                await asyncio.sleep(1.0)
        self.tps = [TopicPartition(self.topic, p) for p in sorted(parts or ())]
        self._reader.assign(self.tps)
        await self._reader.seek_to_beginning(*self.tps)
        self.add_future(self._tail())

    async def on_stop(self) -> None:
        for c in (self._reader, self._loader):
            if c is not None:
                try:
                    await c.stop()
                except Exception as exc:  # noqa: BLE001 - shutting down anyway
                    log.warning("checkpoint index consumer stop: %s", exc)

    async def _tail(self) -> None:
        c = self._reader
        assert c is not None
        while not self.should_stop:
            batch = await c.getmany(timeout_ms=500, max_records=10_000)
            for tp, msgs in batch.items():
                for m in msgs:
                    if m.key is None:
                        continue
                    if not self.guard.internal_ok(m.key, m.value, m.headers, "checkpoint"):
                        continue
                    if m.value is None:
                        self.where.pop(m.key, None)
                    else:
                        self.where[m.key] = (tp.partition, m.offset)
            for tp in self.tps:
                self._read_up_to[tp] = await c.position(tp)
            self._moved.set()
            self._moved = asyncio.Event()

    async def sync(self, timeout_s: float = 60.0) -> bool:
        """Wait until everything on the topic now is indexed; False on timeout."""
        assert self._reader is not None
        if not self.tps:
            return True
        end = await self._reader.end_offsets(self.tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        reader, ends = self._reader, ReadEnds(end)

        def behind() -> bool:
            return any(self._read_up_to.get(tp, 0) < ends.of(reader, tp) for tp in end)

        while behind():
            left = deadline - loop.time()
            if left <= 0:
                log.warning(
                    "checkpoint index behind the end of %s after %.0fs", self.topic, timeout_s
                )
                return False
            try:
                await asyncio.wait_for(self._moved.wait(), min(left, 1.0))
            except TimeoutError:
                pass
        return True

    async def load(self, keys: Iterable[bytes], timeout_s: float = 60.0) -> dict[bytes, bytes]:
        """The latest value of each indexed key among `keys` (others are left out)."""
        c = self._loader
        assert c is not None
        want: dict[int, dict[int, bytes]] = {}  # partition -> offset -> key
        for k in keys:
            if k in self.where:
                part, off = self.where[k]
                want.setdefault(part, {})[off] = k
        out: dict[bytes, bytes] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for part, offs in sorted(want.items()):
            tp = TopicPartition(self.topic, part)
            c.assign([tp])
            for off, key in sorted(offs.items()):
                c.seek(tp, off)
                found = False
                while not found and loop.time() < deadline:
                    got = await c.getmany(tp, timeout_ms=1000, max_records=1)
                    for m in got.get(tp, []):
                        if m.offset >= off:
                            found = True
                            if (m.offset == off and m.key == key and m.value is not None
                                    and self.guard.internal_ok(m.key, m.value, m.headers,
                                                               "checkpoint")):  # fmt: skip
                                out[key] = m.value
                                self.loads += 1
                if not found:
                    log.warning("checkpoint %r at %s:%d not readable", key, part, off)
        return out


__all__ = ["CheckpointIndex"]
