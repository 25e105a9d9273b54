"""Forget broadcast: every process that writes rows follows the ``control`` topic.

A forget runs in one process (HTTP ``/v1/forget``, ``dmem forget``, the MCP tool)
and is broadcast as ``forgotten`` MemoryEvents on ``control``
(`streams.jobs.forget.emit_events`). `ForgetFollower` reads *all* of that
small topic (no consumer group, from the beginning at every start, so a forget
issued while a worker was down still reaches it) and hands each notice to its
handlers: the write path drops the memory from its operator state
(`WritePipeline.forget`), and every process tombstones the key and deletes it
once more (`MemoryStore.forget`, see `milvus.tombstones`), which removes a row
that one of its own writers upserted between the origin's delete and the
notice's arrival. Notices older than the tombstone TTL are not echoed to the
store: by then the key may have been written again legitimately. Applying a
notice twice is harmless.

A notice is trusted only as far as it is bounded: with Kafka auth on
(`streams.auth.KafkaGuard`) only notices the service signed are applied (a
forged one is logged and counted in ``forged``), and a notice dated in the
future counts from now (its tombstone cannot outlive the TTL).

Reading the busy ``memories`` topic for the rare ``forgotten`` events instead
cost ~15 % of a write worker's CPU (py-spy), hence the separate topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service
from pydantic import ValidationError

from schemas import MemoryEvent, storage_key
from schemas.errors import DmemError
from streams.admin import kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.backoff import Backoff
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.store import StoreService

log = logging.getLogger("dmem.control")

#: sync, called with the `forgotten` notices of one fetch; runs in a worker thread
Handler = Callable[[list[MemoryEvent]], None]


#: how long the store half retries a notice's delete through a store outage (seconds;
#: bounded: a worker stopping during an outage waits for it)
ECHO_RETRY_S = 60.0


def echo_to_store(store_service: StoreService, retry_s: float = ECHO_RETRY_S,
                  sleep: Callable[[float], None] = time.sleep) -> Handler:  # fmt: skip
    """The store half: tombstone and re-delete recently forgotten keys (one call per tenant).

    A retriable store failure is retried (1 s, 2 s, ... at most 30 s apart, for
    ``retry_s``): the tombstone is set before the delete, so a notice handled once more
    later would take the key for its origin's and skip the delete of a row written back.
    """

    def forget(tenant: str, ids: list[str], at: float) -> None:
        store = store_service.store
        assert store is not None
        deadline, backoff = time.monotonic() + retry_s, Backoff(1.0, 30.0)
        while True:
            try:
                store.forget(ids, tenant=tenant, at=at)
                return
            except DmemError as exc:
                if not exc.retriable or time.monotonic() + backoff.delay > deadline:
                    raise
                log.warning("forget notice for %s: %s; retry in %.0fs", tenant, exc,
                            backoff.delay)  # fmt: skip
                sleep(backoff.step())

    def handle(events: list[MemoryEvent]) -> None:
        store = store_service.store
        if store is None:
            return
        now = time.time()
        todo: dict[tuple[str, float], list[str]] = {}
        for ev in events:
            at = min(ev.ts / 1000.0, now)  # a future date would outlive the TTL
            if at + store.tombstones.ttl_s < now:
                continue  # older than the guard: the key may legitimately exist again
            if not store.tombstones.dead([storage_key(ev.tenant, ev.memory_id)]):
                todo.setdefault((ev.tenant, at), []).append(ev.memory_id)  # not the origin
        for (tenant, at), ids in todo.items():
            forget(tenant, ids, at)

    return handle


class ForgetFollower(Service):
    """Reads every partition of ``control`` and applies each ``forgotten`` notice."""

    def __init__(self, settings: Settings, handlers: list[Handler], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.handlers = handlers
        self.consumer: AIOKafkaConsumer | None = None
        self.applied = 0  # `forgotten` notices handled
        self.forged = 0  # notices without the service's signature (not applied)
        self.guard = KafkaGuard.from_settings(settings)

    async def on_start(self) -> None:
        self.consumer = AIOKafkaConsumer(
            enable_auto_commit=False, fetch_max_wait_ms=200,
            **kafka_client_kwargs(self.settings.kafka),
        )  # fmt: skip
        await self.consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        if self.consumer is not None:
            try:
                await self.consumer.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.warning("control consumer stop failed: %s", exc)

    async def _run(self) -> None:
        c = self.consumer
        assert c is not None
        topic = self.settings.topic("control")
        parts = c.partitions_for_topic(topic)
        while not parts and not self.should_stop:  # `dmem topics create` may come later
            await c._client.force_metadata_update()  # noqa: SLF001
            parts = c.partitions_for_topic(topic)
            if not parts:
                await asyncio.sleep(5.0)
        tps = [TopicPartition(topic, p) for p in sorted(parts or ())]
        if not tps:
            return
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        while not self.should_stop:
            batch = await c.getmany(timeout_ms=1000, max_records=5000)
            events: list[MemoryEvent] = []
            for msgs in batch.values():
                for m in msgs:
                    if not self.guard.internal_ok(m.key, m.value, m.headers, "control"):
                        self.forged += 1
                        continue
                    try:
                        ev = MemoryEvent.model_validate(orjson.loads(m.value))
                    except (orjson.JSONDecodeError, ValidationError):
                        continue
                    if ev.kind == "forgotten":
                        events.append(ev)
            if not events:
                continue
            for handle in self.handlers:  # in a thread: they may wait on locks
                try:
                    await asyncio.to_thread(handle, events)
                except DmemError as exc:  # best effort: the origin deleted the rows
                    log.warning("%d forget notice(s) not applied: %s", len(events), exc)
            self.applied += len(events)


__all__ = ["ForgetFollower", "echo_to_store"]
