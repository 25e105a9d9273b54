"""Access tracking (respond role): how often and when each memory was retrieved.

The responder reports the ids it served (`streams.context.RoleContext.record_access`);
`AccessTracker` accumulates counts in memory and `AccessFlusher` writes them every
``access_flush_s`` in one batch (``last_access_ts`` and ``metadata.access.n``, the
retrieval count), never one write per hit. ``uses`` stays the credited-use count
owned by the credit applier: utility is an EMA of credit per *credited* use, and
counting retrievals there would dilute it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any, cast

import faust
from mode import Service

from milvus import MemoryStore
from schemas import Partition, storage_key
from streams.context import RoleContext, SettleState, StatusFn, TouchFn
from streams.jobs.rows import WRITE_LOCK
from streams.settings import Settings
from streams.store import StoreService, upsert_fitting

log = logging.getLogger("dmem.maintenance")

__all__ = ["AccessFlusher", "AccessTracker", "flush_access", "wire_access"]


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


class PartlyFlushed(Exception):
    """A flush whose store write failed after some partitions' rows were written:
    ``written`` names their counts' keys (not to be counted again), the cause is
    chained."""

    def __init__(self, written: set[tuple[str, str]]) -> None:
        super().__init__(f"{len(written)} access counts written before the store failed")
        self.written = written


def flush_access(store: MemoryStore, hits: dict[tuple[str, str], tuple[int, int]]) -> int:
    """One batched read-modify-write: last_access_ts and metadata.access.n. Returns rows
    written. A row the store refuses by itself (`streams.store.upsert_fitting`) keeps
    its stored counts and is logged as an error; the others are written. A store
    failure after a first partition's rows were written raises `PartlyFlushed`."""
    if not hits:
        return 0
    with WRITE_LOCK:
        # by storage key: a count only ever reaches the row of the tenant it was served to
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for r in store.get_keys(sorted(storage_key(t, m) for t, m in hits), with_vector=True):
            rows.setdefault((str(r["tenant"]), str(r["id"])), r)
        by_part: dict[str, list[dict[str, Any]]] = {}
        for tid, row in rows.items():
            n, ts = hits[tid]
            meta = dict(row.get("metadata") or {})
            acc = dict(meta.get("access") or {})
            acc["n"] = int(acc.get("n", 0)) + n
            meta["access"] = acc
            row["metadata"] = meta
            row["last_access_ts"] = max(int(row.get("last_access_ts", 0)), ts)
            part = row.pop("partition")
            by_part.setdefault(part, []).append(row)
        refused: dict[str, str] = {}
        written: set[tuple[str, str]] = set()
        for part, prow in by_part.items():
            try:
                refused.update(upsert_fitting(store, prow, cast(Partition, part)))
            except Exception as exc:
                if written:
                    raise PartlyFlushed(written) from exc
                raise
            written.update((str(r["tenant"]), str(r["id"])) for r in prow)
    for key, why in sorted(refused.items()):
        log.error("access count of memory %s not written: the store refuses its row (%s)",
                  key, why)  # fmt: skip
    return sum(len(v) for v in by_part.values()) - len(refused)


class AccessFlusher(Service):
    """Writes the tracker's counts every ``access_flush_s`` (and on stop)."""

    def __init__(self, settings: Settings, store: StoreService, tracker: AccessTracker,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        self.tracker = tracker
        self.flushed = 0
        self.on_flushed: TouchFn | None = None  # called with the (tenant, id)s written

    async def on_start(self) -> None:
        self.add_future(self._run())

    async def on_stop(self) -> None:
        await self.flush()

    async def flush(self) -> None:
        hits = self.tracker.drain()
        if not hits or not self.store_service.connected.is_set():
            self.tracker.restore(hits)
            return
        try:
            store = self.store_service.store
            assert store is not None  # connected
            self.flushed += await asyncio.to_thread(flush_access, store, hits)
        except PartlyFlushed as exc:  # the written counts are in their rows: not again
            log.warning("access flush failed part way (%s); will retry the rest", exc.__cause__)
            self.tracker.restore({k: v for k, v in hits.items() if k not in exc.written})
            return
        except Exception as exc:  # noqa: BLE001 - keep the counts, try again next time
            log.warning("access flush failed (%s); will retry", exc)
            self.tracker.restore(hits)
            return
        if self.on_flushed is not None:
            self.on_flushed(list(hits))

    async def _run(self) -> None:
        while not self.should_stop:
            await self.sleep(self.settings.maintenance.access_flush_s)
            await self.flush()


def wire_access(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Count the responder's retrievals and flush them in batches; returns a status callable."""
    tracker = AccessTracker()
    ctx.access = tracker.record
    flusher = AccessFlusher(ctx.settings, ctx.store, tracker, loop=app.loop, beacon=app.beacon)
    flusher.on_flushed = ctx.touch  # the maintenance job re-reads those rows
    ctx.run(flusher)

    async def settle_state() -> SettleState:
        n = tracker.pending()
        return {"settled": n == 0, "pending": {"unflushed_accesses": n}}

    ctx.settle["access"] = settle_state
    return lambda: {"recorded": tracker.recorded, "flushed": flusher.flushed}
