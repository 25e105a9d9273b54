"""The maintenance job (jobs role): when dedup windows close and decay passes run.

`MaintenanceJob` (one per deployment, like the credit job: capacities are per
tenant) reads every partition of ``dmem.memories`` through the consumer group
``<app_id>-maintenance``, keeps `MaintenanceEngine`'s index current, dedups new
memories (`streams.jobs.dedup`) and runs decay passes (`streams.jobs.decay`). The
pure logic is in `operators.decay` and `operators.dedup`; this module is the part
that talks to Kafka.

Event time decides what, processing time only when: new memories wait in
`operators.dedup.EventTimeWindows` until their tenant's watermark is
``allowed_lateness_ms`` past their event time, then go to dedup in (event time, id)
order, at most every ``dedup_window_s``; a tenant idle for ``dedup_window_s`` has
everything pending deduped. Offsets are committed below the oldest pending record,
so a restart re-reads exactly what was not decided yet.

Settling: after a change, passes follow each other (at most every
``SETTLE_PASS_S``) until one finds nothing to do; then the job waits for input
or the decay timer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import faust
import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from mode import Service
from pydantic import ValidationError

from operators.dedup import EventTimeWindows
from schemas import DECISION_KINDS, MemoryEvent, encode
from streams.admin import commit_or_replay, group_consumer, kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.clock import now_ms
from streams.context import RoleContext, SettleState, StatusFn
from streams.jobs.decay import DecayEngine
from streams.jobs.dedup import DedupEngine
from streams.jobs.rows import REMOVED, policy_from
from streams.settings import Settings
from streams.settle import backlog
from streams.store import StoreService

log = logging.getLogger("dmem.maintenance")

__all__ = ["SETTLE_PASS_S", "MaintenanceEngine", "MaintenanceJob", "wire_maintenance"]

SETTLE_PASS_S = 1.0  # while settling, decay passes at most this often (not every 200 ms)


class MaintenanceEngine(DedupEngine, DecayEngine):
    """Sync core of the maintenance job: the index, dedup and decay (a worker thread)."""

    def status(self) -> dict[str, Any]:
        ms = [s[0] for s in self.pass_samples]
        return {
            "indexed": len(self.index),
            "tenants": len(self.index.tenants),
            **self.counters,
            "decay_pass_ms_p50": float(np.percentile(ms, 50)) if ms else None,
            "decay_pass_ms_p99": float(np.percentile(ms, 99)) if ms else None,
            "decay_samples": [list(s) for s in list(self.pass_samples)[-64:]],
        }


class MaintenanceJob(Service):
    """Consumes ``dmem.memories``; runs dedup windows and decay passes (see module doc)."""

    def __init__(self, settings: Settings, store: StoreService, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        self.engine: MaintenanceEngine | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.windows = EventTimeWindows(settings.maintenance.allowed_lateness_ms)
        self.last_close = 0.0
        self.last_input = time.monotonic()
        self.emitted = 0
        self.bad = 0
        self.ready = False
        # settling (see `settle_state`): something a decay plan depends on changed
        # since the last pass that found nothing to do; a window or a pass in progress
        self.dirty = True
        self.busy = False
        self.deferred = 0
        self.guard = KafkaGuard.from_settings(settings)
        self.last_pass = 0.0

    async def on_start(self) -> None:
        k = self.settings.kafka
        kw = kafka_client_kwargs(k)
        self.producer = AIOKafkaProducer(linger_ms=5, **kw)
        await self.producer.start()
        self.consumer = group_consumer(
            self.settings, self.settings.topic("memories"), "maintenance"
        )
        await self.consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()

    @property
    def pending(self) -> int:
        return len(self.windows)

    async def _run(self) -> None:
        assert self.consumer is not None
        m = self.settings.maintenance
        await self.store_service.maybe_start()
        await self.store_service.connected.wait()
        store = self.store_service.store
        assert store is not None  # connected
        engine = MaintenanceEngine(
            store,
            policy_from(self.settings),
            dedup_k=m.dedup_k,
            refresh_per_pass=m.refresh_per_pass,
        )
        n = await self.store_service._retry("maintenance bootstrap", engine.bootstrap)  # noqa: SLF001
        self.engine = engine
        self.ready = True
        log.info("maintenance ready: %d memories indexed", n)
        next_decay = time.monotonic() + m.decay_interval_s
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            for msgs in batch.values():
                for msg in msgs:
                    self._observe(msg)
            clock = time.monotonic()
            if batch:
                self.last_input = clock
            flush = clock - self.last_input >= m.dedup_window_s  # input idle: close all
            if self.pending and (flush or (clock - self.last_close >= m.dedup_window_s
                                           and self.windows.has_due())):  # fmt: skip
                await self._close_windows(flush)
            elif batch:
                await self._commit()
            # the timer, or (settling) input is quiet and a pass has something to look at:
            # passes follow each other until one finds nothing to do, then the job waits
            idle = not batch and not self.windows and self.dirty
            if time.monotonic() >= next_decay:
                await self._decay()
                next_decay = time.monotonic() + m.decay_interval_s
            elif idle and time.monotonic() - self.last_pass >= SETTLE_PASS_S:
                await self._decay(refresh=False)

    def _observe(self, msg: Any) -> None:
        assert self.engine is not None
        if not self.guard.internal_ok(msg.key, msg.value, msg.headers, "memory event"):
            self.bad += 1
            return
        try:
            ev = MemoryEvent.model_validate(orjson.loads(msg.value))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            self.bad += 1
            log.warning("skipping bad memory event at %s/%s: %s", msg.partition, msg.offset, exc)
            return
        if self.engine.observe(ev):
            self.dirty = True
        if ev.kind in DECISION_KINDS and ev.event_ts is not None:
            self.windows.advance(ev.tenant, ev.event_ts)
        if ev.kind == "written" and ev.partition is not None:
            # an event without an event time is decided with the tenant's next due rows
            ts = ev.event_ts if ev.event_ts is not None else self.windows.bound(ev.tenant)
            self.windows.add(ev.tenant, ev.memory_id, ts if ts is not None else 0,
                             (msg.partition, msg.offset))  # fmt: skip
        elif ev.kind in REMOVED:
            self.windows.remove(ev.tenant, ev.memory_id)

    async def _emit(self, events: list[MemoryEvent]) -> None:
        assert self.producer is not None
        topic = self.settings.topic("memories")
        for ev in events:
            key, value = ev.memory_id.encode(), encode(ev)
            await self.producer.send(topic, value, key=key, headers=self.guard.sign(key, value))
        self.emitted += len(events)

    async def _commit(self) -> None:
        """Commit every partition up to its oldest record still pending (or all it read)."""
        assert self.consumer is not None
        low = self.windows.low_offsets()
        offsets = {}
        for tp in self.consumer.assignment():
            offsets[tp] = low.get(tp.partition, await self.consumer.position(tp))
        if offsets:
            await commit_or_replay(self.consumer, "maintenance", offsets)

    async def _close_windows(self, flush: bool) -> None:
        """Dedup every tenant's due memories (all pending ones on `flush`), oldest first,
        in steps of at most ``dedup_max_window``; each step sees the store as of its
        newest event time (`DedupEngine.dedup`'s ``as_of``)."""
        assert self.engine is not None and self.consumer is not None
        step = self.settings.maintenance.dedup_max_window
        self.busy = True
        try:
            for tenant in sorted(self.windows.pending):
                due = self.windows.due(tenant, flush)
                for i in range(0, len(due), step):
                    chunk = due[i : i + step]
                    events = await self.store_service._retry(  # noqa: SLF001
                        "dedup", self.engine.dedup, tenant, [m for _, m, _ in chunk],
                        now_ms(), chunk[-1][2],
                    )  # fmt: skip
                    self.dirty = True  # the window's rows are read: the index is exact now
                    await self._emit(events)
            assert self.producer is not None
            await self.producer.flush()
            await self._commit()
        finally:
            self.busy = False
            self.last_close = time.monotonic()

    async def _decay(self, refresh: bool = True) -> None:
        assert self.engine is not None
        self.busy = True
        acted = deferred = 0
        try:
            for tenant in sorted(self.engine.index.tenants):
                hold = frozenset(self.windows.pending.get(tenant, ()))  # dedup decides first
                events = await self.store_service._retry(  # noqa: SLF001
                    "decay", self.engine.decay, tenant, now_ms(), refresh, hold
                )
                acted += len(events)
                deferred += self.engine.last_deferred
                await self._emit(events)
            if self.producer is not None:
                await self.producer.flush()
        finally:
            self.busy = False
        self.last_pass = time.monotonic()
        self.deferred = deferred
        # a pass that acted changed the index: the next one looks again (settling)
        self.dirty = bool(acted or deferred or self.engine.touched)

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Rows another writer in this process changed (credit, access counts)."""
        if self.engine is not None:
            self.engine.touch(keys)
            self.dirty = True

    async def settle_state(self) -> SettleState:
        """Pending work, and whether there is none: no unread ``memories`` events, no
        open dedup window, no window or pass running, and a decay pass since the last
        change that found nothing to do (so, with no new input, nothing will change)."""
        unread = await backlog(self.consumer) if self.ready else None
        pending = {"unread_events": unread, "open_window": self.pending,
                   "running": self.busy, "decay_pass_due": self.dirty,
                   "deferred_actions": self.deferred}  # fmt: skip
        settled = (self.ready and unread == 0 and not self.pending and not self.busy
                   and not self.dirty and not self.deferred)  # fmt: skip
        return {"settled": settled, "pending": pending}

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ready": self.ready, "pending": self.pending,
                               "emitted": self.emitted, "bad_events": self.bad}  # fmt: skip
        if self.engine is not None:
            out.update(self.engine.status())
        return out


async def _disabled() -> SettleState:
    return {"settled": True, "pending": {"disabled": True}}


def wire_maintenance(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Run the maintenance job in this process (when enabled); returns its status callable."""
    job = MaintenanceJob(ctx.settings, ctx.store, loop=app.loop, beacon=app.beacon)
    if ctx.settings.maintenance.enabled:
        ctx.run(job)
        ctx.maintenance_touch = job.touch  # writers of this process report the rows they changed
    ctx.settle["maintenance"] = job.settle_state if ctx.settings.maintenance.enabled else _disabled
    return job.status
