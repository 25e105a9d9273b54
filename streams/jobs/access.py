"""Access tracking: how often and when each memory was retrieved.

The respond role counts the ids it served (`streams.context.RoleContext.record_access`)
in `AccessTracker` and `AccessPublisher` publishes the counts every ``access_flush_s``
as `schemas.AccessCount` records (``dmem.access``, keyed by memory id, signed by the
service). The jobs role folds them into the rows (`fold_access`, called by the utility
applier under `WRITE_LOCK` with the credit it applies): every read-modify-write of a
stored row runs in one process, so a respond worker never writes back a copy of a row
that a merge, a move or an eviction in the jobs role changed meanwhile
(docs/design/2026-12-05-row-writers.md).

A row keeps where its last applied count was read (``metadata.access.at``: partition
and offset on ``dmem.access``); a count read again (a replay after a crash, a retry
after the store failed part way) is not added twice. ``uses`` stays the credited-use
count owned by the credit applier: utility is an EMA of credit per *credited* use, and
counting retrievals there would dilute it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from mode import Service
from pydantic import ValidationError

from schemas import AccessCount, encode
from streams.admin import kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.context import RoleContext, SettleState, StatusFn
from streams.settings import Settings

log = logging.getLogger("dmem.maintenance")

__all__ = ["AccessPublisher", "AccessRead", "AccessTracker", "fold_access", "wire_access"]


class AccessTracker:
    """Thread-safe accumulator of retrievals: (tenant, id) -> (hits, last ts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[tuple[str, str], tuple[int, int]] = {}
        self.recorded = 0

    def record(self, tenant: str, ids: Sequence[str], now: int) -> None:
        with self._lock:
            for mid in ids:
                n, _ = self._hits.get((tenant, mid), (0, 0))
                self._hits[(tenant, mid)] = (n + 1, now)
            self.recorded += len(ids)

    def pending(self) -> int:
        with self._lock:
            return len(self._hits)

    def drain(self) -> dict[tuple[str, str], tuple[int, int]]:
        with self._lock:
            out, self._hits = self._hits, {}
        return out

    def restore(self, pending: dict[tuple[str, str], tuple[int, int]]) -> None:
        """Put back counts whose write failed (merged with any new ones)."""
        with self._lock:
            for key, (n, ts) in pending.items():
                n2, ts2 = self._hits.get(key, (0, 0))
                self._hits[key] = (n + n2, max(ts, ts2))


class AccessRead(NamedTuple):
    """One memory's counts as the jobs role read them from ``dmem.access``."""

    n: int  # retrievals (summed over the records read together)
    ts: int  # stream time of the latest
    partition: int  # where the last of them was read
    offset: int


def read_access(reads: dict[tuple[str, str], AccessRead], rec: AccessCount,
                partition: int, offset: int) -> None:  # fmt: skip
    """Add a record to the counts read so far (one memory's records share a partition)."""
    key = (rec.tenant, rec.memory_id)
    had = reads.get(key)
    if had is None or had.partition != partition:
        reads[key] = AccessRead(rec.n, rec.ts, partition, offset)
    elif offset > had.offset:
        reads[key] = AccessRead(had.n + rec.n, max(had.ts, rec.ts), partition, offset)


def fold_access(row: dict[str, Any], read: AccessRead) -> bool:
    """Add `read` to the row's ``metadata.access.n`` and ``last_access_ts``, unless the
    row already holds it (its ``access.at`` is at or past the read's offset on the same
    partition). Returns whether the row changed."""
    meta = dict(row.get("metadata") or {})
    acc = dict(meta.get("access") or {})
    at = acc.get("at")
    if isinstance(at, list) and len(at) == 2 and at[0] == read.partition and at[1] >= read.offset:
        return False
    acc["n"] = int(acc.get("n", 0)) + read.n
    acc["at"] = [read.partition, read.offset]
    meta["access"] = acc
    row["metadata"] = meta
    row["last_access_ts"] = max(int(row.get("last_access_ts", 0)), read.ts)
    return True


class AccessPublisher(Service):
    """Publishes the tracker's counts every ``access_flush_s`` (and on stop); counts
    the broker did not acknowledge go back to the tracker for the next round."""

    def __init__(self, settings: Settings, tracker: AccessTracker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.tracker = tracker
        self.guard = KafkaGuard.from_settings(settings)
        self.topic = settings.topic("access")
        self.producer: AIOKafkaProducer | None = None
        self.published = 0

    async def on_start(self) -> None:
        self.producer = AIOKafkaProducer(linger_ms=20, **kafka_client_kwargs(self.settings.kafka))
        await self.producer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        await self.flush()
        if self.producer is not None:
            await self.producer.stop()

    async def flush(self) -> None:
        hits = self.tracker.drain()
        if not hits:
            return
        if self.producer is None:
            self.tracker.restore(hits)
            return
        sent: list[tuple[tuple[str, str], asyncio.Future[Any]]] = []
        try:
            for (tenant, mid), (n, ts) in hits.items():
                try:
                    rec = AccessCount(memory_id=mid, tenant=tenant, n=n, ts=ts)
                except ValidationError as exc:  # ids the responder served are valid ids
                    log.error("access count of %s/%s not published: %s", tenant, mid, exc)
                    continue
                key, value = mid.encode(), encode(rec)
                fut = await self.producer.send(
                    self.topic, value, key=key, headers=self.guard.sign(key, value)
                )
                sent.append(((tenant, mid), fut))
        except KafkaError as exc:  # the ones not sent are kept below
            log.warning("access counts not published (%s); will retry", exc)
        acked: set[tuple[str, str]] = set()
        results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
        for (tid, _), res in zip(sent, results, strict=True):
            if not isinstance(res, BaseException):
                acked.add(tid)
        if len(acked) < len(sent):
            log.warning("%d access counts not acknowledged; will retry", len(sent) - len(acked))
        self.tracker.restore({k: v for k, v in hits.items() if k not in acked})
        self.published += len(acked)

    async def _run(self) -> None:
        while not self.should_stop:
            await self.sleep(self.settings.maintenance.access_flush_s)
            await self.flush()


def wire_access(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Count the responder's retrievals and publish them in batches for the jobs role
    (`streams.jobs.credit.UtilityApplier` folds them); returns a status callable."""
    tracker = AccessTracker()
    ctx.access = tracker.record
    publisher = AccessPublisher(ctx.settings, tracker, loop=app.loop, beacon=app.beacon)
    ctx.run(publisher)

    async def settle_state() -> SettleState:
        n = tracker.pending()
        return {"settled": n == 0, "pending": {"unpublished_accesses": n}}

    ctx.settle["access"] = settle_state
    return lambda: {"recorded": tracker.recorded, "published": publisher.published}
