"""The history recorder (jobs role): every memory's events into the history collection.

`HistoryRecorder` reads ``dmem.memories`` (consumer group ``<app_id>-history``)
and upserts each event of a stored memory into `milvus.history.HistoryStore`:
written (route, reason, gate score, thresholds), merged (into which survivor),
moved / promoted / demoted / evicted, forgotten. Offsets are committed after
Milvus acknowledged, and an event's row key is derived from its content, so a
replay rewrites the same rows. ``dropped`` transitions never became memories and
are not recorded (the topic keeps them for `dmem inspect`). Credit and feedback
events come from the utility applier (`streams.jobs.credit`), which alone knows
the utility before and after.

Time: each event is filed under its event time (``event_ts``, else the
processing time the emitter stamped).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaConsumer
from mode import Service
from pydantic import ValidationError

from schemas import MemoryEvent
from streams.admin import commit_or_replay, group_consumer
from streams.auth import KafkaGuard
from streams.context import RoleContext, SettleState, StatusFn
from streams.settings import Settings
from streams.settle import backlog
from streams.store import StoreService

__all__ = ["HistoryRecorder", "history_row", "wire_history"]

log = logging.getLogger("dmem.history")

_INTO = re.compile(r"^into (\S+)")


def history_row(ev: MemoryEvent) -> dict[str, Any] | None:
    """The history event of a `MemoryEvent` (None for ``dropped``)."""
    if ev.kind == "dropped":
        return None
    body = ev.model_dump(mode="json", exclude_none=True)
    body["ts"] = ev.event_ts if ev.event_ts is not None else ev.ts
    body["processed_ts"] = ev.ts
    if ev.kind == "merged" and (m := _INTO.match(ev.reason)):
        body["into"] = m.group(1)
    return body


class HistoryRecorder(Service):
    """Consumes ``dmem.memories`` into the history collection (see the module doc)."""

    def __init__(self, settings: Settings, store: StoreService, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        #: with Kafka credentials on, only events the service signed enter a history
        self.guard = KafkaGuard.from_settings(settings)
        self.consumer: AIOKafkaConsumer | None = None
        self.recorded = 0
        self.bad = 0
        self.recording = 0

    async def on_start(self) -> None:
        self.consumer = group_consumer(self.settings, self.settings.topic("memories"), "history")
        await self.consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def _run(self) -> None:
        assert self.consumer is not None
        await self.store_service.maybe_start()
        await self.store_service.connected.wait()
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=500, max_records=5000)
            rows: list[dict[str, Any]] = []
            for msgs in batch.values():
                for m in msgs:
                    if not self.guard.internal_ok(m.key, m.value, m.headers, "memory event"):
                        continue
                    try:
                        ev = MemoryEvent.model_validate(orjson.loads(m.value))
                    except (ValidationError, orjson.JSONDecodeError) as exc:
                        self.bad += 1
                        log.warning("skipping bad memory event at %s/%s: %s",
                                    m.partition, m.offset, exc)  # fmt: skip
                        continue
                    if (row := history_row(ev)) is not None:
                        rows.append(row)
            self.recording = len(rows)
            if rows:
                self.recorded += await self.store_service._retry(  # noqa: SLF001
                    "record history", self._record, rows
                )
            if batch:
                await commit_or_replay(self.consumer, "history")
            self.recording = 0

    def _record(self, rows: list[dict[str, Any]]) -> int:
        store = self.store_service.store
        assert store is not None  # connected before the loop
        return store.history.record(rows)

    async def settle_state(self) -> SettleState:
        unread = await backlog(self.consumer)
        return {"settled": unread == 0 and not self.recording,
                "pending": {"unrecorded_events": unread, "recording": self.recording}}  # fmt: skip


def wire_history(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Run the history recorder in this process; returns its status callable."""
    rec = HistoryRecorder(ctx.settings, ctx.store, loop=app.loop, beacon=app.beacon)
    ctx.run(rec)
    ctx.settle["history"] = rec.settle_state
    return lambda: {"recorded": rec.recorded, "bad_events": rec.bad}
