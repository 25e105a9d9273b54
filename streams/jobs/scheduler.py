"""The maintenance job (jobs role): when dedup windows close and decay passes run.

`MaintenanceJob` (one per deployment, like the credit job: capacities are per
tenant) reads every partition of ``dmem.memories`` through the consumer group
``<app_id>-maintenance``, keeps `MaintenanceEngine`'s index current, closes
dedup windows (`streams.jobs.dedup`) and runs decay passes
(`streams.jobs.decay`). The pure logic is in `operators.decay` and `operators.dedup`; this
module is the part that talks to Kafka.

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

from schemas import MemoryEvent, encode
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
        self.windows: dict[str, dict[str, None]] = {}
        self.window_started: float | None = None
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
        return sum(len(w) for w in self.windows.values())

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
            if (
                self.windows
                and self.window_started is not None
                and (
                    time.monotonic() - self.window_started >= m.dedup_window_s
                    or self.pending >= m.dedup_max_window
                )
            ):
                await self._close_windows()
            elif batch and not self.windows:
                await commit_or_replay(self.consumer, "maintenance")
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
        if ev.kind == "written" and ev.partition is not None:
            if not self.windows:
                self.window_started = time.monotonic()
            self.windows.setdefault(ev.tenant, {})[ev.memory_id] = None
        elif ev.kind in REMOVED:
            self.windows.get(ev.tenant, {}).pop(ev.memory_id, None)

    async def _emit(self, events: list[MemoryEvent]) -> None:
        assert self.producer is not None
        topic = self.settings.topic("memories")
        for ev in events:
            key, value = ev.memory_id.encode(), encode(ev)
            await self.producer.send(topic, value, key=key, headers=self.guard.sign(key, value))
        self.emitted += len(events)

    async def _close_windows(self) -> None:
        assert self.engine is not None and self.consumer is not None
        windows, self.windows, self.window_started = self.windows, {}, None
        self.busy = True
        try:
            for tenant, ids in windows.items():
                if ids:
                    events = await self.store_service._retry(  # noqa: SLF001
                        "dedup", self.engine.dedup, tenant, list(ids), now_ms()
                    )
                    self.dirty = True  # the window's rows are read: the index is exact now
                    await self._emit(events)
            assert self.producer is not None
            await self.producer.flush()
            await commit_or_replay(self.consumer, "maintenance")
        finally:
            self.busy = False

    async def _decay(self, refresh: bool = True) -> None:
        assert self.engine is not None
        self.busy = True
        acted = deferred = 0
        try:
            for tenant in sorted(self.engine.index.tenants):
                events = await self.store_service._retry(  # noqa: SLF001
                    "decay", self.engine.decay, tenant, now_ms(), refresh
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
        app.add_dependency(job)
        ctx.maintenance_touch = job.touch  # writers of this process report the rows they changed
    ctx.settle["maintenance"] = job.settle_state if ctx.settings.maintenance.enabled else _disabled
    return job.status
