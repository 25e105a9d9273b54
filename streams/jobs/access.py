"""Access tracking: how often and when each memory was retrieved.

The respond role counts the ids it served (`streams.context.RoleContext.record_access`)
in `AccessTracker` and `AccessPublisher` publishes the counts every ``access_flush_s``
as `schemas.AccessCount` records (``dmem.access``, keyed by memory id, signed by the
service). The jobs role folds them into the rows (`fold_access`, called by the utility
applier under `WRITE_LOCK` with the credit it applies): every read-modify-write of a
stored row runs in one process, so a respond worker never writes back a copy of a row
that a merge, a move or an eviction in the jobs role changed meanwhile
(docs/design/2026-12-05-row-writers.md).

Each count is added once. A responder draws a random id when it starts and numbers its
publishes (``publisher``, ``seq``); a record the broker did not acknowledge is sent again
as it was, and the memory's newer counts wait until it is acknowledged, so one memory's
records of one publisher reach the log in the order of their rounds. A row keeps the
latest round applied per publisher (``metadata.access.seen``, the newest
`SEEN_PUBLISHERS`), and a record at or before it (sent twice, read again after a crash,
retried after a store write failed part way) adds nothing (`fold_access`). ``uses``
stays the credited-use count owned by the credit applier: utility is an EMA of credit
per *credited* use, and counting retrievals there would dilute it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import threading
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from mode import Service
from pydantic import ValidationError

from schemas import AccessCount, encode
from schemas.limits import LIMITS
from schemas.models import PUBLISHER_PATTERN
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


#: (tenant, memory id)
Key = tuple[str, str]


class AccessTracker:
    """Thread-safe accumulator of retrievals: (tenant, id) -> (hits, last ts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[Key, tuple[int, int]] = {}
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

    def drain(self, hold: Collection[Key] = ()) -> dict[Key, tuple[int, int]]:
        """Take the counts, but those of the keys in `hold` (they stay for a later round)."""
        with self._lock:
            out = {k: v for k, v in self._hits.items() if k not in hold}
            self._hits = {k: v for k, v in self._hits.items() if k in hold}
        return out


class AccessRead(NamedTuple):
    """One `AccessCount` record as the jobs role read it from ``dmem.access``."""

    publisher: str
    seq: int  # the publisher's round
    n: int  # retrievals
    ts: int  # stream time of the latest


#: (tenant, memory id) -> its records read together, in log order
AccessReads = dict[Key, list[AccessRead]]

#: publishers whose latest applied round a row keeps (``metadata.access.seen``, the
#: most recently applied): a copy of a record (sent again after a lost acknowledgement,
#: read again after the store failed part way) adds nothing unless this many other
#: responders' counts of the memory were applied between the two (each start of a
#: respond worker is a new responder); within the row's fixed byte budget
SEEN_PUBLISHERS = 16
_PUBLISHER = re.compile(PUBLISHER_PATTERN)


def read_access(reads: AccessReads, rec: AccessCount) -> None:
    """Add a record to those read so far."""
    reads.setdefault((rec.tenant, rec.memory_id), []).append(
        AccessRead(rec.publisher, rec.seq, rec.n, rec.ts)
    )


def _seen(held: Any) -> dict[str, int]:
    """``metadata.access.seen`` (``[[publisher, round], ...]``, oldest first) as a dict
    in that order; an entry that is not a publisher's id and round (a row edited by
    hand) is left out, so the list keeps its byte bound."""
    out: dict[str, int] = {}
    for item in held if isinstance(held, list) else ():
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and _PUBLISHER.match(item[0]) and type(item[1]) is int
                and 1 <= item[1] <= LIMITS.max_step):  # fmt: skip
            out.pop(item[0], None)
            out[item[0]] = item[1]
    return out


def fold_access(row: dict[str, Any], reads: list[AccessRead]) -> bool:
    """Add the records of `reads` the row does not hold yet to its ``metadata.access.n``
    and ``last_access_ts``. Returns whether the row changed.

    A publisher's rounds grow, and its records of one memory reach the log in round
    order (module doc), so a record whose round is at or before the latest the row
    applied from that publisher was applied before.
    """
    meta = dict(row.get("metadata") or {})
    acc = dict(meta.get("access") or {})
    seen = _seen(acc.get("seen"))
    changed = False
    for r in reads:
        if r.seq <= seen.get(r.publisher, 0):
            continue
        seen.pop(r.publisher, None)
        seen[r.publisher] = r.seq  # the newest last
        acc["n"] = int(acc.get("n", 0)) + r.n
        row["last_access_ts"] = max(int(row.get("last_access_ts", 0)), r.ts)
        changed = True
    if changed:
        acc["seen"] = [[p, q] for p, q in list(seen.items())[-SEEN_PUBLISHERS:]]
        meta["access"] = acc
        row["metadata"] = meta
    return changed


class AccessPublisher(Service):
    """Publishes the tracker's counts every ``access_flush_s`` (and on stop).

    A record the broker did not acknowledge is kept and sent again as it was (same
    publisher and round: the jobs role adds it once if both copies were stored); the
    memory's newer counts stay in the tracker until it is acknowledged."""

    def __init__(self, settings: Settings, tracker: AccessTracker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.tracker = tracker
        self.guard = KafkaGuard.from_settings(settings)
        self.topic = settings.topic("access")
        self.producer: AIOKafkaProducer | None = None
        self.publisher = secrets.token_hex(8)
        self.seq = 0
        self.published = 0
        self.in_flight = 0  # records being sent
        self.unacked: dict[Key, AccessCount] = {}  # to be sent again
        self._flushing = asyncio.Lock()

    async def on_start(self) -> None:
        self.producer = AIOKafkaProducer(
            linger_ms=20, acks="all", **kafka_client_kwargs(self.settings.kafka)
        )
        await self.producer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        await self.flush()
        if lost := self.waiting() + self.tracker.pending():
            log.warning("%d memories' access counts not published at stop: lost", lost)
        if self.producer is not None:
            await self.producer.stop()

    def waiting(self) -> int:
        """Records taken from the tracker and not acknowledged yet."""
        return max(self.in_flight, len(self.unacked))

    async def flush(self) -> None:
        async with self._flushing:
            if self.producer is None:  # the counts stay in the tracker
                return
            records = dict(self.unacked)
            fresh = self.tracker.drain(hold=records.keys())
            if fresh:
                self.seq += 1
            for (tenant, mid), (n, ts) in fresh.items():
                try:
                    records[(tenant, mid)] = AccessCount(
                        memory_id=mid, tenant=tenant, n=n, ts=ts,
                        publisher=self.publisher, seq=self.seq,
                    )  # fmt: skip
                except ValidationError as exc:  # not kept: it would fail every round
                    log.error("access count of %s/%s not published: %s", tenant, mid, exc)
            if not records:
                return
            # unacknowledged until the broker says otherwise: a flush cancelled part way
            # (the role stopping) leaves every record of it to the next one
            self.unacked = records
            self.in_flight = len(records)
            try:
                acked = await self._publish(records)
            finally:
                self.in_flight = 0
            self.unacked = {k: r for k, r in records.items() if k not in acked}

    async def _publish(self, records: dict[Key, AccessCount]) -> set[Key]:
        """Send the records; returns the keys of those acknowledged."""
        assert self.producer is not None
        sent: list[tuple[Key, asyncio.Future[Any]]] = []
        try:
            for (tenant, mid), rec in records.items():
                key, value = mid.encode(), encode(rec)
                fut = await self.producer.send(
                    self.topic, value, key=key, headers=self.guard.sign(key, value)
                )
                sent.append(((tenant, mid), fut))
        except KafkaError as exc:  # the ones not sent are kept
            log.warning("access counts not published (%s); will retry", exc)
        results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
        acked = {tid for (tid, _), res in zip(sent, results, strict=True)
                 if not isinstance(res, BaseException)}  # fmt: skip
        if len(acked) < len(records):
            log.warning("%d access counts not acknowledged; will retry",
                        len(records) - len(acked))  # fmt: skip
        self.published += len(acked)
        return acked

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
        n = tracker.pending() + publisher.waiting()
        return {"settled": n == 0, "pending": {"unpublished_accesses": n}}

    ctx.settle["access"] = settle_state
    return lambda: {"recorded": tracker.recorded, "published": publisher.published}
