"""The store service: this process's Milvus client, as a faust (mode) Service.

Every role shares one instance. Writes are retried with backoff until Milvus
acknowledges them, so an outage stalls consumption instead of skipping records;
only rows Milvus refuses by themselves (`InvalidRecord`) are handed back to the
caller to dead-letter. Connecting happens in the background so a worker started
during an outage still answers ``/health``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from mode import Service

from milvus import MemoryStore
from schemas import Partition, storage_key
from schemas.errors import ConfigError, InvalidRecord
from streams.backoff import Backoff
from streams.settings import Settings

log = logging.getLogger("dmem")

__all__ = ["StoreService", "forgotten_reason", "upsert_fitting"]


#: Milvus has no partial updates: every read-modify-write of a stored row in this
#: process (the jobs' merges, moves, credit and access flushes; the write path's
#: edits of stored ids) holds this lock from its read to its write
WRITE_LOCK = threading.Lock()

#: `streams.write.replays.reconcile`'s shape: (upserts by partition, stored rows by
#: storage key) -> (upserts to write, storage keys not written)
Plan = Callable[
    [Mapping[str, list[dict[str, Any]]], Mapping[str, Mapping[str, Any]]],
    tuple[dict[str, list[dict[str, Any]]], set[str]],
]
#: what a plan compares and carries over: no search fields beyond the row's own
STORED_FIELDS = ["id", "tenant", "text", "action", "reward", "utility", "uses", "merged_count",
                 "last_access_ts", "created_ts", "metadata", "vector"]  # fmt: skip


def upsert_fitting(store: MemoryStore, rows: Sequence[Mapping[str, Any]],
                   partition: Partition) -> dict[str, str]:  # fmt: skip
    """Upsert `rows` into `partition`, leaving out the rows the store refuses by
    themselves (`InvalidRecord`, e.g. a metadata object over Milvus' JSON limit), so
    one bad row neither stalls the others nor turns a retry loop into an endless one.
    Returns ``{storage key: reason}`` of the rows left out (for the caller to
    dead-letter or report); other failures raise as from `MemoryStore.upsert`."""
    if not rows:
        return {}
    try:
        store.upsert(rows, partition)
    except InvalidRecord:
        bad = {storage_key(r["tenant"], r["id"]): why for r in rows
               if (why := store.check_row(r)) is not None}  # fmt: skip
        if not bad:
            raise
        good = [r for r in rows if storage_key(r["tenant"], r["id"]) not in bad]
        if good:
            store.upsert(good, partition)
        return bad
    return {}


def forgotten_reason(store: MemoryStore) -> str:
    """Why a write of a memory forgotten lately is refused (`milvus.tombstones`)."""
    return (f"its id was forgotten less than {store.tombstones.ttl_s:g} s ago "
            "(DMEM_MILVUS__TOMBSTONE_TTL_S): a forgotten memory is not written back")  # fmt: skip


class StoreService(Service):
    """Owns the Milvus client for this process; retries writes until acknowledged."""

    def __init__(self, settings: Settings, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.dim = dim
        self.store: MemoryStore | None = None
        self.healthy = False
        self.failures = 0
        self._probed_at = 0.0
        self._call_failing = False
        self.connected = asyncio.Event()

    async def on_start(self) -> None:
        m = self.settings.milvus
        if not m.uri:
            self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = MemoryStore(
            self.settings.milvus_uri,
            collection=m.collection,
            dim=self.dim,
            token=m.token,
            timeout_s=m.timeout_s,
            tombstone_ttl_s=m.tombstone_ttl_s,
            tombstone_file=m.tombstone_file,
        )
        self.store.history.per_memory = m.history_per_memory
        self.store.history.per_tenant = m.history_per_tenant
        self.store.history.consistency_level = m.search_consistency
        # Connect in the background: a worker started during a Milvus outage must
        # still come up and answer /health (503) instead of hanging in start-up,
        # which an orchestrator's liveness probe would turn into a restart loop.
        # Users of the store wait for `connected` (or retry through `_retry`).
        self.add_future(self._connect())

    async def _connect(self) -> None:
        assert self.store is not None
        await self._retry("connect", self.store.connect)
        self.connected.set()

    async def on_stop(self) -> None:
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    async def _retry(self, what: str, fn: Any, *args: Any, raise_invalid: bool = False) -> Any:
        w = self.settings.write
        backoff = Backoff(w.retry_initial_s, w.retry_max_s)
        while True:
            try:
                out = await asyncio.to_thread(fn, *args)
                self.healthy = True
                self._call_failing = False
                return out
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - every store failure is retried
                if raise_invalid and isinstance(exc, InvalidRecord):
                    raise  # retrying cannot help: the caller isolates the record
                self.healthy = False
                self._call_failing = True  # a good ping must not hide failing writes
                self.failures += 1
                retriable = getattr(exc, "retriable", True)
                log.warning(
                    "milvus %s failed (%s, retriable=%s); retry in %.1fs",
                    what,
                    exc,
                    retriable,
                    backoff.delay,
                )
                await backoff.wait()

    async def probe(self, max_age_s: float = 1.0, timeout_s: float = 1.0) -> bool:
        """Ask Milvus now (cached for ``max_age_s``): /health and /metrics must show an
        outage even when no write is pending, not only after the next write fails."""
        if not self.connected.is_set():
            return False
        if self.store is None or time.monotonic() - self._probed_at < max_age_s:
            return self.healthy
        self._probed_at = time.monotonic()
        store = self.store
        try:
            await asyncio.wait_for(asyncio.to_thread(store.ping, timeout_s), timeout_s + 0.2)
            self.healthy = not self._call_failing
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable now"
            log.info("milvus probe failed: %s", exc)
            self.healthy = False
        return self.healthy

    async def write(
        self, upserts: Mapping[Any, list[dict[str, Any]]], plan: Plan
    ) -> tuple[dict[str, str], set[str]]:
        """Upsert every partition's rows as ``plan`` decides once it has seen the rows
        stored under the same keys: read, plan and upsert in one go under `WRITE_LOCK`,
        so no job of this process writes one of those rows in between. Retried whole
        until acknowledged (a plan is a pure function of what is stored), never
        skipped. Returns (``{storage key: reason}`` (``schemas.storage_key``: ids are
        unique only per tenant) for rows the store refuses by itself (`InvalidRecord`,
        e.g. a metadata object over Milvus' JSON limit), which are left out while the
        rest is written, so one bad row cannot stall its partition forever and the
        caller dead-letters them; the storage keys ``plan`` left out). A row whose key
        was forgotten within the tombstone TTL is refused the same way (with the reason
        `forgotten_reason`) rather than dropped without a word by the store's own check:
        a client that sends a forgotten memory again learns why it is not stored."""
        assert self.store is not None
        store = self.store
        keys = [storage_key(r["tenant"], r["id"]) for rows in upserts.values() for r in rows]
        # bounded staleness, as searches read: a Strong read waits for the server's next
        # time tick (200 ms) on every batch; what it may miss is a row written in the
        # last seconds, which has earned next to nothing yet
        level = self.settings.milvus.search_consistency

        def once() -> tuple[dict[str, str], set[str]]:
            with WRITE_LOCK:
                rejected = dict.fromkeys(store.tombstones.dead(keys), forgotten_reason(store))
                live = {p: [r for r in rows if storage_key(r["tenant"], r["id"]) not in rejected]
                        for p, rows in upserts.items()}  # fmt: skip
                have = store.get_keys(keys, output_fields=STORED_FIELDS, with_vector=True,
                                      consistency_level=level)  # fmt: skip
                todo, skipped = plan(live, {storage_key(r["tenant"], r["id"]): r
                                            for r in have})  # fmt: skip
                for partition, rows in todo.items():
                    rejected.update(upsert_fitting(store, rows, cast(Partition, partition)))
                return rejected, skipped

        if not keys:
            return {}, set()
        out: tuple[dict[str, str], set[str]] = await self._retry("write", once)
        return out

    async def evict(self, keys: Sequence[tuple[str, str]]) -> None:
        """Delete the (tenant, memory id) rows, each tenant's own only; retried until
        acknowledged (deleting a row that is not there is no error)."""
        assert self.store is not None
        by_tenant: dict[str, list[str]] = {}
        for tenant, mid in keys:
            by_tenant.setdefault(tenant, []).append(mid)
        for tenant, ids in by_tenant.items():
            delete = functools.partial(self.store.delete, tenant=tenant)
            await self._retry("evict", delete, ids)
