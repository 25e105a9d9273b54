"""``HistoryStore``: what happened to each memory, next to the memories.

A second collection (``<collection>_history``) in the same Milvus as the
memories, one row per event of a memory:

- ``key`` (primary key) ``tenant|memory_id|<event key>``: deterministic, so a
  replayed event overwrites its own row instead of adding one;
- ``mkey`` ``tenant|memory_id`` (scalar index): one memory's events are one
  indexed filter, never a scan;
- ``tenant``, ``memory_id``, ``kind``, ``ts`` (event time, ms), ``body`` (JSON:
  the event's fields) and a two-dimensional placeholder vector (Milvus requires a
  vector field in every collection).

The fold index: the row of a ``merged`` event is keyed ``tenant|id|merged`` and
names the survivor in ``body.into``, so "which memory stands for this folded
id" is a primary-key read (`HistoryStore.folded_into`). Dedup writes that row
before it deletes the folded memory (`streams.jobs.dedup`), so no reader ever
sees an id that is neither stored nor folded. Fold edges never change once
written (an id is folded once), so every edge this process writes or reads (dedup's
folds, the recorder's ``merged`` events, fold-index reads) is kept in
`HistoryStore.edges` (`FoldEdges`, bounded): a reader that knows an id's edge
reads its survivor directly, and one that does not falls back to the index.

Bounds: at most ``per_memory`` events per memory and ``per_tenant`` per tenant;
`HistoryStore.trim` drops the oldest beyond either (the recorder calls it for
what it touched).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any

import orjson
from pymilvus import CollectionSchema, DataType, FieldSchema, MilvusClient
from pymilvus.exceptions import MilvusException

from milvus import expr as E
from schemas.errors import InvalidRecord
from schemas.models import storage_key

__all__ = ["FOLD_CACHE", "FOLD_SLOT", "FoldEdges", "HistoryStore", "event_key"]

log = logging.getLogger(__name__)

FOLD_SLOT = "merged"
_DIM = 2
_VEC = [1.0, 0.0]
_FIELDS = ["key", "memory_id", "kind", "ts", "body"]
_MAX_ROWS = 16_384
#: fold edges (tenant, folded id) -> survivor id kept by a process
FOLD_CACHE = 65_536


def event_key(kind: str, ts: int, body: Mapping[str, Any]) -> str:
    """The per-memory part of an event's primary key: ``merged`` for the fold
    (one per memory), else time, kind and a digest of the body (a replay of the
    same event lands on the same row)."""
    if kind == FOLD_SLOT:
        return FOLD_SLOT
    digest = hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS),
                             digest_size=6).hexdigest()  # fmt: skip
    return f"{ts:015d}:{kind}:{digest}"


def _schema() -> CollectionSchema:
    return CollectionSchema(
        [
            FieldSchema("key", DataType.VARCHAR, is_primary=True, max_length=1024),
            FieldSchema("mkey", DataType.VARCHAR, max_length=768),
            FieldSchema("tenant", DataType.VARCHAR, max_length=256),
            FieldSchema("memory_id", DataType.VARCHAR, max_length=512),
            FieldSchema("kind", DataType.VARCHAR, max_length=32),
            FieldSchema("ts", DataType.INT64),
            FieldSchema("body", DataType.JSON),
            FieldSchema("vec", DataType.FLOAT_VECTOR, dim=_DIM),
        ],
        description="dmem memory history",
    )


class FoldEdges:
    """The last `FOLD_CACHE` fold edges this process saw, keyed by tenant and id
    (thread-safe). An edge is a fact that never changes, so a cached edge is never
    stale; one evicted or never seen is read from the fold index instead."""

    def __init__(self, size: int = FOLD_CACHE) -> None:
        self.size = size
        self._edges: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._edges)

    def add(self, tenant: str, edges: Mapping[str, str]) -> None:
        """Remember that each id of ``edges`` was folded into its value."""
        if not edges:
            return
        with self._lock:
            for m, into in edges.items():
                self._edges[(tenant, m)] = into
                self._edges.move_to_end((tenant, m))
            while len(self._edges) > self.size:
                self._edges.popitem(last=False)

    def chains(self, tenant: str, ids: Iterable[str], hops: int) -> dict[str, str]:
        """The known edges from ``ids`` on, chains followed for at most ``hops``."""
        known: dict[str, str] = {}
        with self._lock:
            for m in ids:
                c = m
                for _ in range(hops):
                    nxt = self._edges.get((tenant, c))
                    if nxt is None or c in known:
                        break
                    known[c] = nxt
                    c = nxt
        return known

    def drop_tenant(self, tenant: str) -> None:
        with self._lock:
            for k in [k for k in self._edges if k[0] == tenant]:
                del self._edges[k]

    def clear(self) -> None:
        with self._lock:
            self._edges.clear()


def in_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History rows oldest first: by event time, then processing time, then key. Among
    events of one millisecond, utility changes (credit, feedback) follow their chain:
    the one whose ``utility_before`` is another's ``utility_after`` comes after it
    (three thumbs applied in one millisecond read in the order they were applied)."""
    rows = sorted(rows, key=lambda r: (int(r["ts"]), int((r.get("body") or {}).get(
        "processed_ts") or 0), str(r["key"])))  # fmt: skip
    return [r for _, g in groupby(rows, key=lambda r: int(r["ts"])) for r in _chained(list(g))]


def _chained(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def util(r: dict[str, Any], k: str) -> float | None:
        v = (r.get("body") or {}).get(k)
        return float(v) if isinstance(v, int | float) else None

    links = [r for r in group if util(r, "utility_before") is not None
             and util(r, "utility_after") is not None]  # fmt: skip
    if len(links) < 2:
        return group
    # start with a change whose "before" is no other change's "after", then follow
    afters = {id(r): util(r, "utility_after") for r in links}
    heads = [
        r
        for r in links
        if all(afters[id(o)] != util(r, "utility_before") for o in links if o is not r)
    ]
    chain = [heads[0] if heads else links[0]]
    left = [r for r in links if r is not chain[0]]
    while left:
        want = afters[id(chain[-1])]
        nxt = next((r for r in left if util(r, "utility_before") == want), left[0])
        chain.append(nxt)
        left = [r for r in left if r is not nxt]
    linked = {id(r) for r in links}
    it = iter(chain)
    return [next(it) if id(r) in linked else r for r in group]


class HistoryStore:
    """Events of memories (see the module doc); sync, shares the store's client."""

    def __init__(self, store: Any, *, per_memory: int = 200, per_tenant: int = 200_000,
                 consistency_level: str = "Bounded") -> None:  # fmt: skip
        self.store = store
        self.name = f"{store.collection}_history"
        self.per_memory = per_memory
        self.per_tenant = per_tenant
        self.consistency_level = consistency_level
        self._ready = False
        self._setup = threading.Lock()
        #: events written by this process per tenant / per memory: when to check the bounds
        self._tenant_rows: dict[str, int] = {}
        self._mem_rows: dict[str, int] = {}
        #: fold edges written or read by this process (see the module doc)
        self.edges = FoldEdges()

    @property
    def client(self) -> MilvusClient:
        c: MilvusClient = self.store.client
        if not self._ready:
            with self._setup, self.store._errors("history setup"):  # noqa: SLF001
                if not self._ready:  # one thread sets up; the others wait for it
                    self._ensure(c)
                    self._ready = True
        return c

    def _ensure(self, c: MilvusClient) -> None:
        t = self.store.timeout_s
        if not c.has_collection(self.name, timeout=t):
            try:
                c.create_collection(self.name, schema=_schema(), timeout=t,
                                    consistency_level="Strong")  # fmt: skip
            except MilvusException:
                if not c.has_collection(self.name, timeout=t):  # another process made it
                    raise
        indexed = set(c.list_indexes(self.name, timeout=t))
        if "vec" not in indexed:
            ip = c.prepare_index_params()
            ip.add_index(field_name="vec", index_type="FLAT", metric_type="L2")
            c.create_index(self.name, ip, timeout=t)
        for field in ("mkey", "tenant"):
            if field not in indexed:
                self._scalar_index(c, field)
        c.load_collection(self.name, timeout=max(t, 60.0))

    def _scalar_index(self, c: MilvusClient, field: str) -> None:
        # INVERTED on Lite and Milvus >= 2.4, Trie before
        newer = self.store._server_version(c) >= (2, 4)  # noqa: SLF001 - one probe, shared
        for itype in ("INVERTED", "Trie") if newer else ("Trie",):
            try:
                ip = c.prepare_index_params()
                ip.add_index(field_name=field, index_type=itype)
                c.create_index(self.name, ip, timeout=self.store.timeout_s)
                return
            except MilvusException as exc:
                log.debug("history index %s on %s not supported: %s", itype, field, exc)

    def reset(self) -> None:
        """Forget the setup check (the store closed its client)."""
        self._ready = False

    # -- writes --------------------------------------------------------------------
    def record(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Upsert events: mappings with ``tenant``, ``memory_id``, ``kind``, ``ts``
        (event time) and any other fields (kept as the body). Returns rows written."""
        rows: dict[str, dict[str, Any]] = {}
        for ev in events:
            tenant, mid, kind = ev["tenant"], ev["memory_id"], str(ev["kind"])
            ts = int(ev.get("ts") or 0)
            body = {k: v for k, v in ev.items() if v is not None}
            mkey = storage_key(tenant, mid)
            key = f"{mkey}|{event_key(kind, ts, body)}"
            rows[key] = {"key": key, "mkey": mkey, "tenant": tenant, "memory_id": mid,
                         "kind": kind, "ts": ts, "body": body, "vec": _VEC}  # fmt: skip
        if not rows:
            return 0
        c = self.client
        with self.store._errors("history upsert"):  # noqa: SLF001
            vals = list(rows.values())
            for i in range(0, len(vals), 1000):
                c.upsert(self.name, vals[i : i + 1000], timeout=self.store.timeout_s)
        for r in vals:  # a fold row stored: its edge is known from now on
            if r["kind"] == FOLD_SLOT and isinstance(into := r["body"].get("into"), str) and into:
                self.edges.add(r["tenant"], {r["memory_id"]: into})
        due: list[str] = []
        every = max(1, self.per_memory // 4)
        if len(self._mem_rows) > 100_000:
            self._mem_rows.clear()
        for r in vals:
            self._tenant_rows[r["tenant"]] = self._tenant_rows.get(r["tenant"], 0) + 1
            n = self._mem_rows[r["mkey"]] = self._mem_rows.get(r["mkey"], 0) + 1
            if n % every == 0 or self._tenant_rows[r["tenant"]] > self.per_tenant:
                due.append(r["mkey"])
        if due:  # a memory written to often, or a full tenant: look at its bounds
            self.trim(due)
        return len(rows)

    def fold(self, tenant: str, folded: Mapping[str, str], ts: int,
             reason: Mapping[str, str] | None = None) -> int:  # fmt: skip
        """Record that each ``folded`` id now stands in its survivor (``{id: into}``)."""
        return self.record(
            {"tenant": tenant, "memory_id": mid, "kind": FOLD_SLOT, "ts": ts, "into": into,
             "reason": (reason or {}).get(mid, f"into {into}")}
            for mid, into in folded.items()
        )  # fmt: skip

    def delete_tenant(self, tenant: str) -> None:
        c = self.client
        with self.store._errors("history delete"):  # noqa: SLF001
            c.delete(self.name, filter=E.eq("tenant", tenant), timeout=self.store.timeout_s)
        self._tenant_rows.pop(tenant, None)
        self.edges.drop_tenant(tenant)

    def trim(self, mkeys: Iterable[str]) -> int:
        """Drop the oldest events beyond ``per_memory`` of each memory in ``mkeys``
        and beyond ``per_tenant`` of their tenants. Returns rows deleted."""
        c = self.client
        drop: list[str] = []
        tenants: set[str] = set()
        with self.store._errors("history trim"):  # noqa: SLF001
            for mk in dict.fromkeys(mkeys):
                tenants.add(mk.split("|", 1)[0])
                rows = c.query(self.name, filter=f"mkey == {E.literal(mk)}",
                               output_fields=["key", "ts"], limit=_MAX_ROWS,
                               timeout=self.store.timeout_s)  # fmt: skip
                if len(rows) > self.per_memory:
                    old = sorted(rows, key=lambda r: (r["ts"], r["key"]))
                    drop += [r["key"] for r in old[: len(rows) - self.per_memory]
                             if not r["key"].endswith(f"|{FOLD_SLOT}")]  # fmt: skip
            for tenant in tenants:
                if self._tenant_rows.get(tenant, 0) <= self.per_tenant:
                    continue
                n = self._count(c, tenant)
                self._tenant_rows[tenant] = n
                if n > self.per_tenant:
                    drop += self._oldest(c, tenant, n - int(self.per_tenant * 0.9))
            for i in range(0, len(drop), 1000):
                c.delete(self.name, filter=E.ids_in(drop[i : i + 1000], "key"),
                         timeout=self.store.timeout_s)  # fmt: skip
        return len(drop)

    def _count(self, c: MilvusClient, tenant: str) -> int:
        res = c.query(self.name, filter=E.eq("tenant", tenant), output_fields=["count(*)"],
                      timeout=self.store.timeout_s)  # fmt: skip
        return int(res[0]["count(*)"]) if res else 0

    def _oldest(self, c: MilvusClient, tenant: str, n: int) -> list[str]:
        it = c.query_iterator(self.name, batch_size=5000, filter=E.eq("tenant", tenant),
                              output_fields=["key", "ts"],
                              timeout=self.store.timeout_s)  # fmt: skip
        rows: list[tuple[int, str]] = []
        try:
            while page := it.next():
                rows += [(int(r["ts"]), str(r["key"])) for r in page]
        finally:
            it.close()
        rows.sort()
        return [k for _, k in rows[: max(0, n)]]

    # -- reads ---------------------------------------------------------------------
    def folded_into(self, tenant: str, ids: Sequence[str],
                    consistency_level: str | None = None) -> dict[str, str]:  # fmt: skip
        """``{id: survivor id}`` for those of ``ids`` dedup folded (a primary-key read;
        ``consistency_level`` overrides this store's)."""
        keys = [f"{storage_key(tenant, i)}|{FOLD_SLOT}" for i in dict.fromkeys(ids)]
        if not keys:
            return {}
        c = self.client
        level = consistency_level or self.consistency_level
        out: dict[str, str] = {}
        with self.store._errors("history query"):  # noqa: SLF001
            for i in range(0, len(keys), 1000):
                res = c.query(self.name, filter=E.ids_in(keys[i : i + 1000], "key"),
                              output_fields=["memory_id", "body"], timeout=self.store.timeout_s,
                              consistency_level=level)  # fmt: skip
                for r in res:
                    into = (r.get("body") or {}).get("into")
                    if isinstance(into, str) and into:
                        out[str(r["memory_id"])] = into
        self.edges.add(tenant, out)
        return out

    def events(self, tenant: str, memory_id: str, limit: int | None = None) -> list[dict[str, Any]]:
        """``memory_id``'s events in event-time order (oldest first), at most ``limit``
        (the newest ones)."""
        try:
            mk = storage_key(tenant, memory_id)
        except ValueError as exc:
            raise InvalidRecord(str(exc)) from exc
        c = self.client
        with self.store._errors("history query"):  # noqa: SLF001
            rows = c.query(self.name, filter=f"mkey == {E.literal(mk)}", output_fields=_FIELDS,
                           limit=_MAX_ROWS, timeout=self.store.timeout_s,
                           consistency_level=self.consistency_level)  # fmt: skip
        rows = in_order(rows)
        if limit is not None:
            rows = rows[-limit:]
        return [{**(r.get("body") or {}), "kind": r["kind"], "ts": int(r["ts"])} for r in rows]
