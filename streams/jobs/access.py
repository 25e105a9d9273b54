"""Access tracking: how often and when each memory was retrieved.

The respond role counts the ids it served (`streams.context.RoleContext.record_access`)
in `AccessTracker` and `AccessPublisher` publishes the counts every ``access_flush_s``
as `schemas.AccessCount` records (``dmem.access``, keyed by memory id, signed by the
service). The jobs role folds them into the rows (`fold_access`, called by the utility
applier under `WRITE_LOCK` with the credit it applies): every read-modify-write of a
stored row runs in one process, so a respond worker never writes back a copy of a row
that a merge, a move or an eviction in the jobs role changed meanwhile
(docs/design/2026-12-05-row-writers.md).

A row keeps where and when its last applied count was read (``metadata.access.at``:
partition, offset and Kafka timestamp on ``dmem.access``); a count read again (a replay
after a crash, a retry after the store failed part way) is not added twice
(`fold_access`). ``uses`` stays the credited-use
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

__all__ = [
    "AccessPublisher",
    "AccessRead",
    "AccessReads",
    "AccessTracker",
    "fold_access",
    "read_access",
    "wire_access",
]


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
    """One `AccessCount` record as the jobs role read it from ``dmem.access``."""

    partition: int
    offset: int
    #: the record's Kafka timestamp (ms): tells a log that started over (a memory-only
    #: broker restarted, the topic made again) from a replay of one already applied
    logged: int
    n: int  # retrievals
    ts: int  # stream time of the latest


#: (tenant, memory id) -> its records read together, in log order
AccessReads = dict[tuple[str, str], list[AccessRead]]


def read_access(reads: AccessReads, rec: AccessCount, partition: int, offset: int,
                logged: int | None) -> None:  # fmt: skip
    """Add a record to those read so far (a record without a timestamp, as the oldest
    message format has, counts as time 0: only its offset tells a replay)."""
    stamp = logged if isinstance(logged, int) and logged > 0 else 0
    reads.setdefault((rec.tenant, rec.memory_id), []).append(
        AccessRead(partition, offset, stamp, rec.n, rec.ts)
    )


def _held(at: Any) -> tuple[int, int, int] | None:
    """``metadata.access.at`` as (partition, offset, timestamp), None where it is not one
    (a row of an earlier release, or one edited by hand: its next count is taken)."""
    if not isinstance(at, list) or len(at) != 3:
        return None
    try:
        p, o, t = (int(x) for x in at)
    except (TypeError, ValueError):
        return None
    return p, o, t


def fold_access(row: dict[str, Any], reads: list[AccessRead]) -> bool:
    """Add the records of `reads` the row does not hold yet to its ``metadata.access.n``
    and ``last_access_ts``. Returns whether the row changed.

    The row keeps where its last applied record was read and the latest Kafka timestamp
    of those applied (``access.at``: partition, offset, timestamp). One memory's records
    share a partition and come in offset order, so a record at or before that offset
    and no later than that timestamp was applied before (a replay before the applier's
    commit, its retry after a store failure part way). A record at or before the offset
    but later in time is of a log that started over, and counts (unless its publisher's
    clock is behind the latest time of the old log: then it is taken for one applied).
    """
    meta = dict(row.get("metadata") or {})
    acc = dict(meta.get("access") or {})
    held = _held(acc.get("at"))
    changed = False
    for r in reads:
        if held is not None and r.partition == held[0]:
            if r.offset <= held[1] and r.logged <= held[2]:  # applied before
                continue
            held = (r.partition, r.offset, max(r.logged, held[2]))
        else:
            held = (r.partition, r.offset, r.logged)
        acc["n"] = int(acc.get("n", 0)) + r.n
        row["last_access_ts"] = max(int(row.get("last_access_ts", 0)), r.ts)
        changed = True
    if changed and held is not None:
        acc["at"] = list(held)
        meta["access"] = acc
        row["metadata"] = meta
    return changed


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
        self.in_flight = 0  # counts taken from the tracker and not yet acknowledged

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
        self.in_flight = len(hits)
        try:
            done = await self._publish(hits)
        finally:
            self.in_flight = 0
        self.tracker.restore({k: v for k, v in hits.items() if k not in done})

    async def _publish(self, hits: dict[tuple[str, str], tuple[int, int]]) -> set[tuple[str, str]]:
        """Send the counts; returns the keys done with: acknowledged, or not valid as a
        record (logged, not kept: they would fail again)."""
        assert self.producer is not None
        done: set[tuple[str, str]] = set()
        sent: list[tuple[tuple[str, str], asyncio.Future[Any]]] = []
        try:
            for (tenant, mid), (n, ts) in hits.items():
                try:
                    rec = AccessCount(memory_id=mid, tenant=tenant, n=n, ts=ts)
                except ValidationError as exc:  # ids the responder served are valid ids
                    log.error("access count of %s/%s not published: %s", tenant, mid, exc)
                    done.add((tenant, mid))
                    continue
                key, value = mid.encode(), encode(rec)
                fut = await self.producer.send(
                    self.topic, value, key=key, headers=self.guard.sign(key, value)
                )
                sent.append(((tenant, mid), fut))
        except KafkaError as exc:  # the ones not sent are kept below
            log.warning("access counts not published (%s); will retry", exc)
        results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
        acked = {tid for (tid, _), res in zip(sent, results, strict=True)
                 if not isinstance(res, BaseException)}  # fmt: skip
        if len(acked) < len(sent):
            log.warning("%d access counts not acknowledged; will retry", len(sent) - len(acked))
        self.published += len(acked)
        return done | acked

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
        n = tracker.pending() + publisher.in_flight
        return {"settled": n == 0, "pending": {"unpublished_accesses": n}}

    ctx.settle["access"] = settle_state
    return lambda: {"recorded": tracker.recorded, "published": publisher.published}
