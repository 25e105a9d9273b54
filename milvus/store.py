"""``MemoryStore``: the one Milvus client of a process (sync; async callers use
``asyncio.to_thread``).

One collection (default ``dmem_memories``), partitions ``core`` and ``buffer``;
the schema comes from ``schemas.models.MemoryRecord`` (see ``milvus.schema``).
A file URI (``*.db``) means Milvus Lite, ``http(s)://host:port`` a Milvus server.

Invariant: a memory (tenant, id) lives in exactly ONE partition.

Tenant isolation of writes: memory ids are client-chosen and unique
only within a tenant, so the primary key is the storage key ``tenant|id``
(``schemas.storage_key``, field ``key``), computed here on every write (a
caller's ``key`` is ignored) and never returned by a read. Every operation on
rows by id takes the tenant (``get``, ``move``, ``delete``, ``update_fields``)
and addresses keys only, so no call can read, overwrite, move or delete another
tenant's row whatever ids it names. ``upsert`` takes the tenant from each
record. A collection keyed by memory id alone (primary key ``id``) is refused
at connect with a one-line error naming ``dmem migrate``
(`MemoryStore.migrate_storage_keys`).

Partition semantics differ between the backends, and the code relies on neither
more than it must:

- Milvus server (2.3 .. 2.5): the primary key is unique per *partition*. An
  ``upsert`` into ``core`` of an id stored in ``buffer`` leaves two copies, and a
  delete with ``partition_name`` only touches that partition.
- Milvus Lite (3.x): the primary key is unique per *collection*: an upsert into
  ``core`` relocates the row, and ``delete`` ignores ``partition_name`` (it deletes
  everywhere). Also ``count(*)`` ignores ``partition_names`` when the filter is
  empty, so every query here carries a filter (``id != ""`` at least).

``upsert(records, P)`` on a server therefore first deletes the ids from the other
partition, then upserts into P. Why delete-then-upsert and why it is safe under
replay: the write path commits its Kafka offsets only after this call returns.
A crash between the two steps leaves the memory *absent* (never duplicated) until
the uncommitted records are replayed, and the replay runs the same two idempotent
steps again (deleting an absent id is a no-op; upserting by id overwrites), so the
store converges to exactly one copy in P. The reverse order would leave a
duplicate visible to search on a crash and, on Lite, the trailing delete would
remove the row just written.

``move(ids, to)`` has no replayable source, so it does the opposite: fetch the rows
from the source partition, upsert them into the target, then delete them from the
source. A crash in between leaves a duplicate, never a loss; repeating the move
repairs it (the row is still found in the source). On Lite the upsert alone moves
the row.

Every write also stamps the partition it writes to into ``metadata["_partition"]``
(``PART_KEY``; every read strips it again), because Milvus does not report which
partition a search hit came from: with the stamp a search over both partitions is
one call instead of two (see ``search``).

Reads use ``consistency_level="Strong"`` by default (a read right after a write
sees it); pass ``consistency_level="Bounded"`` for cheaper searches.

Errors: connection failures and timeouts become ``StoreUnavailable`` (retriable);
other Milvus refusals ``StoreError``; invalid rows or filters ``InvalidRecord``.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import MilvusException

from milvus import expr as E
from milvus.history import HistoryStore
from milvus.schema import (
    ID_FIELD,
    METRIC,
    PARTITIONS,
    PRIMARY_FIELD,
    VECTOR_FIELD,
    FieldSpec,
    build_schema,
    field_specs,
    scalar_fields,
    search_params,
    vector_index_params,
)
from milvus.tombstones import DEFAULT_TTL_S, tombstones_for
from schemas.errors import (
    ConfigError,
    DmemError,
    InvalidRecord,
    StoreError,
    StoreUnavailable,
)
from schemas.limits import INT64_MAX, LIMITS, json_bytes
from schemas.models import Partition, storage_key

__all__ = ["MemoryStore"]

log = logging.getLogger(__name__)


class _NoMvccTsNotice(logging.Filter):
    """The Milvus 2.3.5 server answers a query without an MVCC timestamp, so pymilvus'
    query iterator (every scan: maintenance, forget, pages) falls back to a client-side
    timestamp, which is the snapshot a scan wants, and warns about it on every scan. The
    warning fills the workers' logs and reads as a fault; it is dropped here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("failed to get mvccTs")


logging.getLogger("pymilvus.client.iterator.query_iterator").addFilter(_NoMvccTsNotice())


class _LiteInUseNotice(logging.Filter):
    """milvus-lite logs a traceback when another process holds the Lite file it is asked
    to open (its ``DataDirLockedError``); `MemoryStore.connect` raises a `StoreError`
    saying so in one line instead, so that record is dropped. Other failures keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if type(exc).__name__ == "DataDirLockedError":
                return False
            exc = exc.__cause__
        return True


logging.getLogger("milvus_lite.server_manager").addFilter(_LiteInUseNotice())


def lite_in_use(path: str) -> bool:
    """Whether another process holds the Milvus Lite file ``path`` open: milvus-lite takes
    an exclusive ``flock`` on ``<path>/LOCK`` for as long as it has the file open. A
    file not created yet is not in use."""
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the lock when it was taken
    return False


_SPECS: dict[str, FieldSpec] = {s.name: s for s in field_specs()}
_ANY_ROW = f'{PRIMARY_FIELD} != ""'
#: every write stamps the row's partition into ``metadata[PART_KEY]`` (stripped again
#: on every read), so one search over both partitions can still label each hit
PART_KEY = "_partition"
_MAX_BATCH_BYTES = 16 * 1024 * 1024
_UNAVAILABLE_HINTS = (
    "deadline exceeded",
    "unavailable",
    "connection refused",
    "fail connecting",
    "failed to connect",
    "connect failed",
    "retry timeout",
    "server is not ready",
    "not ready",
    "socket closed",
    "connection reset",
    "timed out",
    "timeout",
)


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    try:
        import grpc

        if isinstance(exc, grpc.RpcError):
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            return code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            )
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, MilvusException):
        name = type(exc).__name__
        if name in ("MilvusUnavailableException", "ConnectError"):
            return True
        if getattr(exc, "code", None) == 2:  # Status.CONNECT_FAILED
            return True
        msg = str(getattr(exc, "message", "") or exc).lower()
        return any(h in msg for h in _UNAVAILABLE_HINTS)
    return False


def _other(partition: str) -> str:
    return "buffer" if partition == "core" else "core"


def _stamped(rows: Sequence[dict[str, Any]], partition: str) -> list[dict[str, Any]]:
    """Copies of ``rows`` whose metadata records the partition they are written to."""
    return [{**r, "metadata": {**(r.get("metadata") or {}), PART_KEY: partition}} for r in rows]


def _unstamp(row: dict[str, Any]) -> str | None:
    """Remove the partition stamp from a read row (in place); returns it."""
    meta = row.get("metadata")
    if not isinstance(meta, dict) or PART_KEY not in meta:
        return None
    meta = dict(meta)
    part = meta.pop(PART_KEY)
    row["metadata"] = meta
    return part if isinstance(part, str) else None


def _check_partition(partition: Any) -> Partition:
    if partition not in PARTITIONS:
        raise InvalidRecord(f"partition must be one of {PARTITIONS} (got {partition!r})")
    return cast(Partition, partition)


def _check_partitions(partitions: Iterable[str] | str | None) -> list[str]:
    if partitions is None:
        return list(PARTITIONS)
    if isinstance(partitions, str):
        partitions = [partitions]
    out = []
    for p in partitions:
        _check_partition(p)
        if p not in out:
            out.append(p)
    if not out:
        raise InvalidRecord("no partitions given")
    return out


def _key(tenant: Any, memory_id: Any) -> str:
    """The storage key of (tenant, id); `InvalidRecord` for a bad tenant or id."""
    if not isinstance(tenant, str) or not isinstance(memory_id, str):
        raise InvalidRecord(f"tenant and memory id must be strings (got {tenant!r}, {memory_id!r})")
    try:
        return storage_key(tenant, memory_id)
    except ValueError as exc:
        raise InvalidRecord(str(exc), key=memory_id or None) from exc


def _tenant_keys(tenant: str, ids: Iterable[str]) -> list[str]:
    """Distinct storage keys of ``ids`` in ``tenant``, in first-seen order."""
    return list(dict.fromkeys(_key(tenant, E._as_id(i)) for i in ids))  # noqa: SLF001


def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


#: Milvus' limit on one JSON field value (``proxy.maxJSONSize``-like; 64 KiB here):
#: checked before sending, with the partition stamp every write adds, so a too-large
#: metadata object is refused row by row (`InvalidRecord`) instead of failing a whole
#: batch on the server (the budget of its parts: `schemas.limits`)
MAX_JSON_BYTES = LIMITS.max_json_field_bytes
#: the longest partition stamp a write adds to a row's metadata
_LONGEST_STAMP = max(PARTITIONS, key=len)


def legacy_layout_message(collection: str, uri: str) -> str:
    """The one-line refusal for a collection keyed by memory id alone (no storage keys)."""
    return (
        f"collection {collection!r} at {uri} is keyed by memory id alone (created before "
        "tenant-scoped storage keys): run `dmem migrate` (DMEM_MILVUS__URI and "
        "DMEM_MILVUS__COLLECTION as for the workers) to rewrite it, or use a new collection name"
    )


class MemoryStore:
    """Sync access to the dmem memory collection (Milvus Lite or server)."""

    def __init__(
        self,
        uri: str,
        collection: str = "dmem_memories",
        dim: int = 256,
        token: str | None = None,
        timeout_s: float = 10.0,
        *,
        batch_size: int = 1000,
        consistency_level: str = "Strong",
        tombstone_ttl_s: float = DEFAULT_TTL_S,
        tombstone_file: Path | None = None,
    ) -> None:
        if not uri:
            raise ConfigError("Milvus URI is empty")
        if not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"vector dim must be a positive int (got {dim!r})")
        self.uri = uri
        self.collection = collection
        self.dim = dim
        self.token = token
        self.timeout_s = timeout_s
        self.batch_size = max(1, int(batch_size))
        self.consistency_level = consistency_level
        self._client: MilvusClient | None = None
        self._executor: ThreadPoolExecutor | None = None
        #: keys forgotten lately: every write refuses them (see `milvus.tombstones`)
        self.tombstones = tombstones_for(uri, collection, tombstone_ttl_s, tombstone_file)
        #: what happened to each memory, and which survivor a folded id went into
        self.history = HistoryStore(self)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=len(PARTITIONS), thread_name_prefix="dmem-milvus"
            )
        return self._executor

    # -- connection ------------------------------------------------------------
    @property
    def is_lite(self) -> bool:
        """A file URI (Milvus Lite), as opposed to a server URL."""
        return "://" not in self.uri or self.uri.startswith("file://")

    @property
    def connected(self) -> bool:
        return self._client is not None

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            yield
        except DmemError:
            raise
        except Exception as exc:
            where = f"Milvus {op} on {self.collection!r} at {self.uri}"
            if _is_unavailable(exc):
                raise StoreUnavailable(f"{where} unavailable: {exc}") from exc
            if isinstance(exc, MilvusException):
                raise StoreError(f"{where} failed: {exc}") from exc
            raise

    def connect(self) -> MemoryStore:
        """Connect; create the collection, partitions and indexes if missing; load it."""
        if self._client is not None:
            return self
        uri = self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri
        with self._errors("connect"):
            try:
                client = MilvusClient(uri=uri, token=self.token or "", timeout=self.timeout_s)
            except Exception:
                # checked after the failure: this process's own open of the file (which
                # milvus-lite shares with later clients here) also holds the lock
                if self.is_lite and lite_in_use(uri):
                    raise StoreError(
                        f"the Milvus Lite file {uri} is in use by another process (Milvus "
                        "Lite opens in one process only): stop that process (a `dmem up` or "
                        "worker on this data dir), or run Milvus as a server "
                        "(`dmem up --milvus server`, or DMEM_MILVUS__URI=http://HOST:19530)"
                    ) from None
                raise
        try:
            with self._errors("connect"):
                self._ensure_collection(client)
        except BaseException:
            client.close()
            raise
        self._client = client
        return self

    def _ensure_collection(self, c: MilvusClient) -> None:
        t = self.timeout_s
        name = self.collection
        if not c.has_collection(name, timeout=t):
            c.create_collection(
                name,
                schema=build_schema(self.dim),
                consistency_level=self.consistency_level,
                timeout=t,
            )
            log.info("created Milvus collection %s (dim=%d) at %s", name, self.dim, self.uri)
        else:
            self._check_existing(c)
        existing = set(c.list_partitions(name, timeout=t))
        for p in PARTITIONS:
            if p not in existing:
                c.create_partition(name, p, timeout=t)
        indexed = set(c.list_indexes(name, timeout=t))
        if VECTOR_FIELD not in indexed:
            itype, params = vector_index_params(self.is_lite)
            ip = c.prepare_index_params()
            ip.add_index(field_name=VECTOR_FIELD, index_type=itype, metric_type=METRIC, **params)
            c.create_index(name, ip, timeout=t)
        if "tenant" not in indexed:
            self._scalar_index(c, "tenant")
        c.load_collection(name, timeout=max(t, 60.0))

    def _server_version(self, c: MilvusClient) -> tuple[int, int]:
        if self.is_lite:
            return (99, 0)
        try:
            text = str(c.get_server_version(timeout=self.timeout_s))
        except MilvusException as exc:
            if _is_unavailable(exc):
                raise
            return (0, 0)
        m = re.search(r"(\d+)\.(\d+)", text)
        return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

    def _scalar_index(self, c: MilvusClient, field: str) -> None:
        # INVERTED since Milvus 2.4 (and on Lite); Trie for VARCHAR before that
        kinds = ("INVERTED", "Trie") if self._server_version(c) >= (2, 4) else ("Trie",)
        for itype in kinds:
            try:
                ip = c.prepare_index_params()
                ip.add_index(field_name=field, index_type=itype)
                c.create_index(self.collection, ip, timeout=self.timeout_s)
                return
            except MilvusException as exc:
                if _is_unavailable(exc):
                    raise
                log.debug("scalar index %s on %s not supported: %s", itype, field, exc)
        log.warning("no scalar index on %s.%s (backend supports none)", self.collection, field)

    def _check_existing(self, c: MilvusClient) -> None:
        desc = c.describe_collection(self.collection, timeout=self.timeout_s)
        fields = {f["name"]: f for f in desc.get("fields", [])}
        vec = fields.get(VECTOR_FIELD)
        if vec is None:
            raise ConfigError(f"collection {self.collection!r} has no {VECTOR_FIELD!r} field")
        dim = int(vec.get("params", {}).get("dim", -1))
        if dim != self.dim:
            raise ConfigError(
                f"collection {self.collection!r} at {self.uri} stores vectors of dim {dim}, "
                f"but the encoder produces dim {self.dim}; use another collection name "
                "or re-embed into a new collection"
            )
        pk = next((n for n, f in fields.items() if f.get("is_primary")), None)
        if pk != PRIMARY_FIELD:
            raise ConfigError(legacy_layout_message(self.collection, self.uri))
        missing = [n for n in _SPECS if n not in fields]
        if missing:
            raise ConfigError(
                f"collection {self.collection!r} lacks fields {missing}: it was created by "
                "an older schema; migrate it or use a new collection name"
            )

    def migrate_storage_keys(self, *, page: int = 1000) -> dict[str, Any]:
        """Rewrite a collection keyed by memory id alone into the tenant-keyed layout.

        Run with no worker attached (``dmem migrate``). Steps, each safe to repeat
        after a crash: copy every row, partition by partition, into
        ``<collection>__tenant_keys`` (dropped first if a previous run left one),
        check the copy's counts per partition, drop the old collection, rename
        the copy. Returns ``{"status": "migrated" | "current" | "absent",
        "rows": {partition: n}}``. The store is left closed.
        """
        if self._client is not None:
            raise ConfigError("migrate before connecting (the store is already open)")
        uri = self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri
        tmp = f"{self.collection}__tenant_keys"
        t = self.timeout_s
        with self._errors("migrate"):
            c = MilvusClient(uri=uri, token=self.token or "", timeout=t)
        try:
            with self._errors("migrate"):
                if not c.has_collection(self.collection, timeout=t):
                    if not c.has_collection(tmp, timeout=t):
                        return {"status": "absent", "rows": {}}
                    c.rename_collection(tmp, self.collection, timeout=t)  # crashed before
                    return {"status": "migrated", "rows": {}}
                desc = c.describe_collection(self.collection, timeout=t)
                fields = [f["name"] for f in desc.get("fields", [])]
                pk = next((f["name"] for f in desc["fields"] if f.get("is_primary")), None)
                if pk == PRIMARY_FIELD:
                    return {"status": "current", "rows": {}}
                vec = next(f for f in desc["fields"] if f["name"] == VECTOR_FIELD)
                self.dim = int(vec.get("params", {}).get("dim", self.dim))
                if c.has_collection(tmp, timeout=t):
                    c.drop_collection(tmp, timeout=t)
                c.load_collection(self.collection, timeout=max(t, 60.0))
                old, self.collection = self.collection, tmp
                self._client = c
                try:
                    self._ensure_collection(c)
                    rows: dict[str, int] = {}
                    keys: set[str] = set()
                    for part in PARTITIONS:
                        it = c.query_iterator(
                            old,
                            batch_size=page,
                            filter='id != ""',
                            output_fields=fields,
                            partition_names=[part],
                            timeout=t,
                            consistency_level="Strong",
                        )
                        n = 0
                        try:
                            while batch := it.next():
                                new = [self._legacy_row(r) for r in batch]
                                n += self.upsert(new, cast(Partition, part))
                                keys.update(_key(r["tenant"], r[ID_FIELD]) for r in new)
                        finally:
                            it.close()
                        rows[part] = n
                    # one row per (tenant, id): a server copy left in both partitions by
                    # an interrupted move ends up once, in the partition copied last
                    if self.count() != len(keys):
                        raise StoreError(
                            f"migration copy of {old!r} has {self.count()} rows, "
                            f"expected {len(keys)}"
                        )
                finally:
                    self.collection, self._client = old, None
                c.release_collection(tmp, timeout=t)
                c.drop_collection(old, timeout=t)
                c.rename_collection(tmp, old, timeout=t)
                log.info("migrated %s to tenant-scoped storage keys: %s", old, rows)
                return {"status": "migrated", "rows": rows}
        finally:
            c.close()
            if self.is_lite:
                try:
                    from milvus_lite.server_manager import server_manager_instance

                    server_manager_instance.release_server(self.uri)
                except Exception as exc:  # noqa: BLE001 - closing must not raise
                    log.debug("releasing Milvus Lite server: %s", exc)

    @staticmethod
    def _legacy_row(row: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in row.items() if k in _SPECS and k != PRIMARY_FIELD}
        _unstamp(out)
        return out

    def wait_indexed(
        self, timeout_s: float = 600.0, *, compact: bool = True, poll_s: float = 1.0
    ) -> dict[str, float]:
        """Block until the background work of a bulk load is done (server only).

        After ``flush`` a Milvus server still builds HNSW over every sealed
        segment and auto-compacts the segments that carry deletes (every server
        ``upsert`` deletes its ids from the other partition first), re-indexing
        the compacted ones, and a search issued meanwhile competes with it
        (docs/design/2026-12-01-read-path-latency.md). So: trigger one manual compaction,
        wait for it, then wait until every row is indexed on two consecutive polls.
        Returns ``{"compact_s", "index_s"}``; a timeout raises ``StoreUnavailable``.
        """
        out = {"compact_s": 0.0, "index_s": 0.0}
        if self.is_lite:
            return out
        c, name = self.client, self.collection
        t0 = time.monotonic()
        deadline = t0 + timeout_s

        def wait(what: str, done: Any) -> None:
            while not done():
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"Milvus {what} on {name!r} not done in {timeout_s}s")
                time.sleep(poll_s)

        with self._errors("compact"):
            if compact:
                job = c.compact(name, timeout=self.timeout_s)
                wait(
                    "compaction",
                    lambda: str(c.get_compaction_state(job, timeout=self.timeout_s)) == "Completed",
                )
            out["compact_s"] = time.monotonic() - t0

            def indexed() -> bool:
                d = c.describe_index(name, VECTOR_FIELD, timeout=self.timeout_s)
                return int(d.get("pending_index_rows", 0)) == 0 and int(
                    d.get("indexed_rows", 0)
                ) >= int(d.get("total_rows", 0))

            def indexed_twice() -> bool:  # a compaction may re-open index work
                if not indexed():
                    return False
                time.sleep(poll_s)
                return indexed()

            t1 = time.monotonic()
            wait("index build", indexed_twice)
            out["index_s"] = time.monotonic() - t1
        return out

    @property
    def client(self) -> MilvusClient:
        """The connected pymilvus client (connects on first use)."""
        if self._client is None:
            self.connect()
        assert self._client is not None
        return self._client

    def close(self) -> None:
        """Close the client; for Lite also stop the in-process Lite server.

        Milvus Lite keeps a file lock for as long as its server runs in this
        process, so without the release another process (a restarted worker,
        the demo reading results) cannot open the same file.
        """
        pool, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=True)
        client, self._client = self._client, None
        self.history.reset()
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # closing must not raise
                log.debug("closing Milvus client: %s", exc)
            if self.is_lite:
                try:
                    from milvus_lite.server_manager import server_manager_instance

                    server_manager_instance.release_server(self.uri)
                except Exception as exc:  # noqa: BLE001 - closing must not raise
                    log.debug("releasing Milvus Lite server: %s", exc)

    def drop(self) -> None:
        """Drop the whole collection (tests, tooling)."""
        with self._errors("drop"):
            for name in (self.collection, self.history.name):
                if self.client.has_collection(name, timeout=self.timeout_s):
                    self.client.drop_collection(name, timeout=self.timeout_s)
        self.tombstones.clear()
        self.history.edges.clear()
        self.close()

    def __enter__(self) -> MemoryStore:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rows ---------------------------------------------------------------------
    def _vector(self, value: Any, key: str | None = None) -> np.ndarray:
        try:
            vec = np.asarray(value, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise InvalidRecord(f"vector is not numeric: {exc}", key=key) from exc
        if vec.shape[0] != self.dim:
            raise InvalidRecord(f"vector has dim {vec.shape[0]}, expected {self.dim}", key=key)
        if not np.isfinite(vec).all():
            raise InvalidRecord("vector has non-finite values", key=key)
        return vec

    def _row(self, record: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(record, Mapping):
            raise InvalidRecord(f"record must be a mapping, got {type(record).__name__}")
        rid = record.get(ID_FIELD)
        key = rid if isinstance(rid, str) else None
        unknown = [k for k in record if k not in _SPECS and k != "partition"]
        if unknown:
            raise InvalidRecord(f"unknown fields {unknown}", key=key)
        row: dict[str, Any] = {}
        for name, spec in _SPECS.items():
            if spec.primary:  # derived below, never taken from the caller
                continue
            if name in record and record[name] is not None:
                value = record[name]
            elif not spec.required:
                value = spec.default
            else:
                raise InvalidRecord(f"missing field {name!r}", key=key)
            row[name] = self._coerce(spec, value, key)
        row[PRIMARY_FIELD] = self._coerce(
            _SPECS[PRIMARY_FIELD], _key(row["tenant"], row[ID_FIELD]), key
        )
        return row

    def _coerce(self, spec: FieldSpec, value: Any, key: str | None) -> Any:
        if spec.vector:
            return self._vector(value, key)
        try:
            if spec.dtype == DataType.VARCHAR:
                if not isinstance(value, str):
                    raise TypeError("expected str")
                if (spec.primary or spec.name == ID_FIELD) and not value:
                    raise ValueError("empty id")
                if spec.max_length and len(value.encode("utf-8")) > spec.max_length:
                    raise ValueError(f"longer than {spec.max_length} bytes")
                return value
            if spec.dtype == DataType.INT64:
                if isinstance(value, bool) or not isinstance(value, int | np.integer):
                    raise TypeError("expected int")
                if not -INT64_MAX - 1 <= int(value) <= INT64_MAX:  # else the client raises,
                    raise ValueError("outside the 64-bit integers")  # a retried StoreError
                return int(value)
            if spec.dtype in (DataType.DOUBLE, DataType.FLOAT):
                if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                    raise TypeError("expected float")
                f = float(value)
                if not math.isfinite(f):
                    raise ValueError("not finite")
                return f
            if spec.dtype == DataType.BOOL:
                if not isinstance(value, bool | np.bool_):
                    raise TypeError("expected bool")
                return bool(value)
            if spec.dtype == DataType.JSON:
                if not isinstance(value, Mapping):
                    raise TypeError("expected dict")
                value = dict(value)
                size = json_bytes({**value, PART_KEY: _LONGEST_STAMP})
                if size > MAX_JSON_BYTES:
                    raise ValueError(f"{size} bytes of JSON (max {MAX_JSON_BYTES})")
                return value
        except (TypeError, ValueError) as exc:
            raise InvalidRecord(f"field {spec.name!r}: {exc}", key=key) from exc
        raise InvalidRecord(f"field {spec.name!r}: unsupported type", key=key)

    def ping(self, timeout_s: float = 3.0) -> None:
        """One cheap round trip (raises `StoreUnavailable`/`StoreError` when it fails)."""
        with self._errors("ping"):
            self.client.has_collection(self.collection, timeout=timeout_s)

    def check_row(self, record: Mapping[str, Any]) -> str | None:
        """Why the store would refuse ``record`` (`InvalidRecord`), or None if it is fine."""
        try:
            self._row(record)
        except InvalidRecord as exc:
            return str(exc)
        return None

    def _batches(self, rows: Sequence[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
        """Chunks of <= batch_size rows and roughly <= 16 MB."""
        batch: list[dict[str, Any]] = []
        size = 0
        for row in rows:
            est = 4 * self.dim + len(row.get("text", "")) + 512
            if batch and (len(batch) >= self.batch_size or size + est > _MAX_BATCH_BYTES):
                yield batch
                batch, size = [], 0
            batch.append(row)
            size += est
        if batch:
            yield batch

    @staticmethod
    def _dedupe(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Last write wins for repeated keys inside one call (Milvus rejects duplicates)."""
        by_id: dict[str, dict[str, Any]] = {}
        for r in rows:
            by_id.pop(r[PRIMARY_FIELD], None)
            by_id[r[PRIMARY_FIELD]] = r
        return list(by_id.values())

    # -- writes ------------------------------------------------------------------
    def upsert(self, records: Sequence[Mapping[str, Any]], partition: Partition) -> int:
        """Write (insert or overwrite by id) ``records`` into ``partition``.

        Idempotent: replaying the same records leaves the same single copy. A
        memory that currently lives in the other partition ends up only in
        ``partition``. Rows are keyed by (record tenant, id): a record can only
        ever replace its own tenant's row. Returns the number of distinct
        (tenant, id) written.
        """
        part = _check_partition(partition)
        rows = self._dedupe(self._row(r) for r in records)
        if not rows:
            return 0
        c = self.client
        with self.tombstones.lock.shared(), self._errors("upsert"):
            rows = self._alive(rows)
            for batch in self._batches(rows):
                if not self.is_lite:  # server: pk unique per partition (see module doc)
                    self._delete_keys([r[PRIMARY_FIELD] for r in batch], _other(part))
                c.upsert(
                    self.collection,
                    _stamped(batch, part),
                    partition_name=part,
                    timeout=self.timeout_s,
                )
        return len(rows)

    def _alive(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` without the forgotten ones (call under ``tombstones.lock.shared()``)."""
        dead = self.tombstones.dead(r[PRIMARY_FIELD] for r in rows)
        if dead:
            log.info("refused %d write(s) of forgotten memories", len(dead))
        return [r for r in rows if r[PRIMARY_FIELD] not in dead] if dead else rows

    def forget(self, ids: Iterable[str], *, tenant: str, at: float | None = None) -> int:
        """Delete ``tenant``'s memories for good: tombstone the keys, then delete.

        Unlike `delete` (dedup and eviction, whose rows may legitimately be
        written again), a forgotten key is refused by every write of this process
        for the tombstone TTL, so a write that read the row before the forget
        cannot bring it back. ``at``: when the forget happened (a broadcast
        notice's time); returns how many rows existed.
        """
        keys = _tenant_keys(tenant, ids)
        if not keys:
            return 0
        with self.tombstones.lock.exclusive():
            self.tombstones.add(keys, at)
            found = sorted(
                {
                    _key(r["tenant"], r[ID_FIELD])
                    for r in self._fetch(keys, list(PARTITIONS), fields=["tenant"])
                }
            )
            if found:
                with self._errors("delete"):
                    self._delete_keys(found, None)
        return len(found)

    def _delete_keys(self, keys: Sequence[str], partition: str | None) -> None:
        for chunk in _chunks(keys, self.batch_size):
            self.client.delete(
                self.collection,
                filter=E.ids_in(chunk, PRIMARY_FIELD),
                partition_name=partition,
                timeout=self.timeout_s,
            )

    def move(self, ids: Iterable[str], to: Partition, *, tenant: str) -> int:
        """Move ``tenant``'s memories into partition ``to``; returns how many moved.

        Ids already in ``to`` or absent (in this tenant) are skipped.
        """
        target = _check_partition(to)
        src = _other(target)
        c = self.client
        with self.tombstones.lock.shared(), self._errors("move"):
            rows = self._fetch(_tenant_keys(tenant, ids), [src], with_vector=True)
            for batch in self._batches(rows):
                clean = [
                    {
                        **{k: v for k, v in r.items() if k != "partition"},
                        PRIMARY_FIELD: _key(r["tenant"], r[ID_FIELD]),
                    }
                    for r in batch
                ]
                c.upsert(
                    self.collection,
                    _stamped(clean, target),
                    partition_name=target,
                    timeout=self.timeout_s,
                )
                if not self.is_lite:
                    self._delete_keys([_key(r["tenant"], r[ID_FIELD]) for r in batch], src)
        return len(rows)

    def delete(self, ids: Iterable[str], *, tenant: str) -> int:
        """Delete ``tenant``'s memories from both partitions; returns how many existed."""
        wanted = _tenant_keys(tenant, ids)
        if not wanted:
            return 0
        found = {
            _key(r["tenant"], r[ID_FIELD])
            for r in self._fetch(wanted, list(PARTITIONS), fields=["tenant"])
        }
        if found:
            with self._errors("delete"):
                self._delete_keys(sorted(found), None)
        return len(found)

    def update_fields(self, rows: Sequence[Mapping[str, Any]], *, tenant: str) -> int:
        """Partial update of ``tenant``'s rows: each row has ``id`` plus the fields to change.

        The stored row is read (with its vector), merged and written back into the
        partition it is in. Not atomic against concurrent writers of the same id:
        run one updater per memory id (the credit applier, the decay job).
        Returns the number of ids found and updated.
        """
        changes: dict[str, dict[str, Any]] = {}
        for r in rows:
            rid = r.get(ID_FIELD)
            if not isinstance(rid, str) or not rid:
                raise InvalidRecord("update row without an id")
            bad = [k for k in r if k not in _SPECS or k in (PRIMARY_FIELD, "tenant")]
            if bad:
                raise InvalidRecord(f"fields {bad} cannot be updated", key=rid)
            changes.setdefault(rid, {}).update({k: v for k, v in r.items() if k != ID_FIELD})
        if not changes:
            return 0
        current = self._fetch(_tenant_keys(tenant, changes), list(PARTITIONS), with_vector=True)
        by_part: dict[str, list[dict[str, Any]]] = {p: [] for p in PARTITIONS}
        for row in current:
            part = row.pop("partition")
            merged = {**row, **changes[row[ID_FIELD]]}
            by_part[part].append(self._row(merged))
        c = self.client
        written = 0
        with self.tombstones.lock.shared(), self._errors("update"):
            for part, prow in by_part.items():
                prow = self._alive(prow)
                written += len(prow)
                for batch in self._batches(prow):
                    c.upsert(
                        self.collection,
                        _stamped(batch, part),
                        partition_name=part,
                        timeout=self.timeout_s,
                    )
        return written

    # -- reads ---------------------------------------------------------------------
    def _out_fields(self, output_fields: Sequence[str] | None, with_vector: bool) -> list[str]:
        if output_fields is None:
            fields = scalar_fields()
        else:
            fields = [f for f in output_fields if f not in ("partition", PRIMARY_FIELD)]
            unknown = [f for f in fields if f not in _SPECS]
            if unknown:
                raise InvalidRecord(f"unknown output fields {unknown}")
        if with_vector and VECTOR_FIELD not in fields:
            fields = [*fields, VECTOR_FIELD]
        if ID_FIELD not in fields:
            fields = [ID_FIELD, *fields]
        return fields

    def _fix(self, row: dict[str, Any], partition: str) -> dict[str, Any]:
        out = dict(row)
        out.pop(PRIMARY_FIELD, None)  # the storage key stays inside the store
        if VECTOR_FIELD in out and out[VECTOR_FIELD] is not None:
            out[VECTOR_FIELD] = np.asarray(out[VECTOR_FIELD], dtype=np.float32)
        _unstamp(out)
        out["partition"] = partition
        return out

    def _fetch(
        self,
        keys: Sequence[str],
        partitions: Sequence[str],
        *,
        with_vector: bool = False,
        fields: Sequence[str] | None = None,
        consistency_level: str | None = None,
    ) -> list[dict[str, Any]]:
        """Rows by storage key (the only way rows are read by id)."""
        if not keys:
            return []
        out_fields = self._out_fields(fields, with_vector)
        if "tenant" not in out_fields:
            out_fields = [*out_fields, "tenant"]
        rows: list[dict[str, Any]] = []
        c = self.client
        with self._errors("query"):
            for part in partitions:
                for chunk in _chunks(list(keys), self.batch_size):
                    res = c.query(
                        self.collection,
                        filter=E.ids_in(chunk, PRIMARY_FIELD),
                        output_fields=out_fields,
                        partition_names=[part],
                        timeout=self.timeout_s,
                        consistency_level=consistency_level or self.consistency_level,
                    )
                    rows.extend(self._fix(r, part) for r in res)
        order = {k: i for i, k in enumerate(keys)}
        rows.sort(key=lambda r: order.get(_key(r["tenant"], r[ID_FIELD]), len(order)))
        return rows

    def get(
        self,
        ids: Iterable[str],
        *,
        tenant: str,
        with_vector: bool = False,
        output_fields: Sequence[str] | None = None,
        consistency_level: str | None = None,
        include_forgotten: bool = False,
    ) -> list[dict[str, Any]]:
        """``tenant``'s rows for ``ids`` (request order, missing skipped), each with ``partition``.

        Normally one row per id; two only if a move on a server was interrupted.
        Another tenant's row with the same id is never returned. Every row
        carries ``tenant``. ``consistency_level`` overrides the store default.
        ``include_forgotten``: see `get_keys`.
        """
        return self.get_keys(_tenant_keys(tenant, ids), with_vector=with_vector,
                             output_fields=output_fields, consistency_level=consistency_level,
                             include_forgotten=include_forgotten)  # fmt: skip

    def get_keys(
        self,
        keys: Sequence[str],
        *,
        with_vector: bool = False,
        output_fields: Sequence[str] | None = None,
        consistency_level: str | None = None,
        include_forgotten: bool = False,
    ) -> list[dict[str, Any]]:
        """Rows by storage key (``schemas.storage_key``): one read for many tenants.
        Keys forgotten lately are left out (`milvus.tombstones`: a bounded read can
        still find a row for a moment after its delete), unless ``include_forgotten``
        (a forget looking for what is still stored: a row a writer of another process
        put back before the notice reached it)."""
        keys = list(dict.fromkeys(keys))
        gone = set() if include_forgotten else self.tombstones.hide(keys)
        return self._fetch([k for k in keys if k not in gone], list(PARTITIONS),
                           with_vector=with_vector,
                           fields=output_fields,
                           consistency_level=consistency_level)  # fmt: skip

    def lookup(
        self,
        ids: Iterable[str],
        *,
        tenant: str,
        output_fields: Sequence[str] | None = None,
        consistency_level: str | None = None,
    ) -> list[dict[str, Any]]:
        """Like `get` (no vectors), in ONE primary-key query over both partitions.

        Each row's partition comes from its write stamp (``PART_KEY``); a row
        without one (written by another client) is looked up again partition by
        partition. The read path of ``GET /v1/memories``: one round trip per call.
        Keys forgotten lately are left out, as in `get_keys`.
        """
        keys = _tenant_keys(tenant, ids)
        if not keys:
            return []
        fields = self._out_fields(output_fields, False)
        fields = list(dict.fromkeys([*fields, "tenant", "metadata"]))
        level = consistency_level or self.consistency_level
        rows: list[dict[str, Any]] = []
        unstamped: list[str] = []
        with self._errors("query"):
            for chunk in _chunks(keys, self.batch_size):
                res = self.client.query(self.collection, filter=E.ids_in(chunk, PRIMARY_FIELD),
                                        output_fields=fields, partition_names=list(PARTITIONS),
                                        timeout=self.timeout_s,
                                        consistency_level=level)  # fmt: skip
                gone = self.tombstones.hide(r[PRIMARY_FIELD] for r in res)
                for r in res:
                    if gone and r[PRIMARY_FIELD] in gone:
                        continue
                    out = dict(r)
                    out.pop(PRIMARY_FIELD, None)
                    part = _unstamp(out)
                    if part in PARTITIONS:
                        out["partition"] = part
                        rows.append(out)
                    else:
                        unstamped.append(_key(out["tenant"], out[ID_FIELD]))
        if unstamped:
            rows += self._fetch(unstamped, list(PARTITIONS), fields=fields,
                                consistency_level=level)  # fmt: skip
        order = {k: i for i, k in enumerate(keys)}
        rows.sort(key=lambda r: order.get(_key(r["tenant"], r[ID_FIELD]), len(order)))
        return rows

    def query_rows(
        self,
        flt: str,
        partitions: Sequence[str],
        fields: Sequence[str],
        *,
        limit: int | None,
        consistency_level: str | None = None,
        stamp: bool = True,
        hide: bool = True,
    ) -> list[dict[str, Any]]:
        """At most ``limit`` rows (None: all, paged by an iterator) matching the filter
        expression ``flt`` over ``partitions``, each labelled with its partition from
        the write stamp (None when a row has none; no label and no metadata read
        without ``stamp``, when ``fields`` lacks metadata). ``flt`` must come from
        `milvus.expr` (validated terms). Keys forgotten lately are left out, as in
        `get_keys`, unless ``hide`` is False: a caller that tells a capped answer by
        ``len(rows) >= limit`` must count the rows Milvus returned, and leaves them
        out itself (`visible`)."""
        out_fields = self._out_fields(fields, False)
        if stamp:
            out_fields = list(dict.fromkeys([*out_fields, "metadata"]))
        level = consistency_level or self.consistency_level
        parts = _check_partitions(partitions)
        res: list[dict[str, Any]] = []
        with self._errors("query"):
            if limit is not None:
                res = self.client.query(self.collection, filter=flt, output_fields=out_fields,
                                        partition_names=parts, limit=limit,
                                        timeout=self.timeout_s,
                                        consistency_level=level)  # fmt: skip
            else:
                it = self.client.query_iterator(self.collection, batch_size=16_384, filter=flt,
                                                output_fields=out_fields, partition_names=parts,
                                                timeout=self.timeout_s,
                                                consistency_level=level)  # fmt: skip
                try:
                    while page := it.next():
                        res += page
                finally:
                    it.close()
        rows = []
        want_meta = "metadata" in fields
        gone = self.tombstones.hide(r[PRIMARY_FIELD] for r in res) if hide else set()
        for r in res:
            if gone and r[PRIMARY_FIELD] in gone:
                continue
            out = dict(r)
            out.pop(PRIMARY_FIELD, None)
            if stamp:
                out["partition"] = _unstamp(out)
            if not want_meta:
                out.pop("metadata", None)
            rows.append(out)
        return rows

    def visible(self, tenant: str, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` of ``tenant`` without those whose key was forgotten lately."""
        gone = self.tombstones.hide(_key(tenant, r[ID_FIELD]) for r in rows)
        # the keys again only when one of these rows was forgotten (rare)
        return [r for r in rows if _key(tenant, r[ID_FIELD]) not in gone] if gone else list(rows)

    @staticmethod
    def key_filter(tenant: str, ids: Iterable[str]) -> str:
        """A filter expression matching exactly ``tenant``'s rows with ``ids``."""
        return E.ids_in(_tenant_keys(tenant, ids), PRIMARY_FIELD)

    def survivors_of(
        self, tenant: str, ids: Iterable[str], *, output_fields: Sequence[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """``{id: survivor row}`` for those of `ids` that dedup folded into another
        memory of `tenant` (found by ``metadata.merge.ids``); ids not folded are absent."""
        want = list(dict.fromkeys(ids))
        if not want:
            return {}
        fields = self._out_fields(output_fields, False)
        if "metadata" not in fields:
            fields = [*fields, "metadata"]
        out: dict[str, dict[str, Any]] = {}
        c = self.client
        with self._errors("query"):
            for part in PARTITIONS:
                for chunk in _chunks(want, self.batch_size):
                    flt = E.and_all(
                        [
                            E.build_filter(tenant=tenant),
                            E.json_contains_any("metadata.merge.ids", list(chunk)),
                        ]
                    )
                    res = c.query(self.collection, filter=flt, output_fields=fields,
                                  partition_names=[part], timeout=self.timeout_s,
                                  consistency_level=self.consistency_level)  # fmt: skip
                    for r in res:
                        row = self._fix(r, part)
                        folded = ((row.get("metadata") or {}).get("merge") or {}).get("ids", [])
                        for mid in set(chunk) & set(folded):
                            out.setdefault(mid, row)
        return out

    def count(self, partition: str | None = None, tenant: str | None = None, *,
              consistency_level: str = "Strong") -> int:  # fmt: skip
        """Row count, optionally per partition and/or tenant: exact with the default
        Strong consistency (one server time tick, ~390 ms on the embedded 2.3.5
        server, per partition); a reader that only needs the order of magnitude (the
        responder's lambda schedule) passes its bounded one."""
        parts = _check_partitions(partition)
        flt = E.build_filter(tenant=tenant) or _ANY_ROW
        total = 0
        c = self.client
        with self._errors("count"):
            for part in parts:
                res = c.query(
                    self.collection,
                    filter=flt,
                    output_fields=["count(*)"],
                    partition_names=[part],
                    timeout=self.timeout_s,
                    consistency_level=consistency_level,
                )
                total += int(res[0]["count(*)"]) if res else 0
        return total

    def scan(
        self,
        tenant: str | None = None,
        partition: str | None = None,
        batch_size: int = 1000,
        output_fields: list[str] | None = None,
        *,
        with_vector: bool = False,
        extra_filter: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every row (optionally of one tenant/partition), each with ``partition``.

        Pages with pymilvus' ``query_iterator`` (pk-ordered pages; works on Lite and
        server), one partition at a time. Rows written during a scan may or may not
        be seen.
        """
        parts = _check_partitions(partition)
        flt = E.build_filter(tenant=tenant, extra_filter=extra_filter) or _ANY_ROW
        out_fields = self._out_fields(output_fields, with_vector)
        size = max(1, min(int(batch_size), 16_384))
        for part in parts:
            with self._errors("scan"):
                it = self.client.query_iterator(
                    self.collection,
                    batch_size=size,
                    filter=flt,
                    output_fields=out_fields,
                    partition_names=[part],
                    timeout=self.timeout_s,
                    consistency_level="Strong",
                )
            try:
                while True:
                    with self._errors("scan"):
                        page = it.next()
                    if not page:
                        break
                    for row in page:
                        yield self._fix(row, part)
            finally:
                try:
                    it.close()
                except Exception as exc:
                    log.debug("closing query iterator: %s", exc)

    def search(
        self,
        vector: Sequence[float] | np.ndarray,
        tenant: str,
        k: int,
        partitions: Sequence[str] = PARTITIONS,
        agent_id: str | None = None,
        extra_filter: Mapping[str, Any] | None = None,
        *,
        output_fields: Sequence[str] | None = None,
        consistency_level: str | None = None,
    ) -> list[dict[str, Any]]:
        """Top-``k`` nearest memories of ``tenant`` (COSINE), best first.

        ``consistency_level`` overrides the store's default for this call: the
        responder uses "Bounded" (a Strong read waits for the next time tick).

        Each hit has the output fields plus ``distance`` (= cosine similarity,
        higher is closer; ``similarity`` is the same number) and ``partition``.

        Several partitions: ONE search over all of them; each hit's partition
        comes from the stamp every write puts into ``metadata`` (``PART_KEY``;
        Milvus does not report a hit's partition): one call costs less latency
        and server CPU than one per partition (docs/design/2026-12-01-read-path-latency.md).
        If any hit lacks a valid stamp (a row written before stamping, or by another
        client), the search falls back to one call per partition, which labels
        hits by construction. Keys forgotten lately are left out, as in `get_keys`.
        """
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k > 16_384:
            raise InvalidRecord(f"k must be an int in 1..16384 (got {k!r})")
        if not isinstance(tenant, str) or not tenant:
            raise InvalidRecord("search needs a tenant")
        vec = self._vector(vector).tolist()
        parts = _check_partitions(partitions)
        flt = E.build_filter(tenant=tenant, agent_id=agent_id, extra_filter=extra_filter)
        out_fields = [f for f in self._out_fields(output_fields, False) if f != VECTOR_FIELD]
        want_meta = "metadata" in out_fields
        params = search_params(self.is_lite, k)
        c = self.client

        def run(names: list[str], label: str | None) -> list[dict[str, Any]] | None:
            """Hits of one search over ``names``; None when a hit has no usable stamp."""
            res = c.search(
                self.collection,
                data=[vec],
                filter=flt,
                limit=k,
                output_fields=out_fields if want_meta or label else [*out_fields, "metadata"],
                search_params=params,
                partition_names=names,
                anns_field=VECTOR_FIELD,
                timeout=self.timeout_s,
                consistency_level=consistency_level or self.consistency_level,
            )
            hits = []
            found = [{**(h.get("entity") or {}), "distance": float(h["distance"])}
                     for h in (res[0] if res else [])]  # fmt: skip
            for entity in self.visible(tenant, found):  # the filter holds the tenant
                entity.pop(PRIMARY_FIELD, None)
                entity["similarity"] = entity["distance"]
                stamp = _unstamp(entity)
                if not want_meta:
                    entity.pop("metadata", None)
                if label is None and stamp not in names:
                    return None
                entity["partition"] = label or stamp
                hits.append(entity)
            return hits

        def one(part: str) -> list[dict[str, Any]]:
            return run([part], part) or []

        best: dict[str, dict[str, Any]] = {}
        with self._errors("search"):
            if len(parts) == 1:
                results = [one(parts[0])]
            else:
                merged = run(parts, None)
                if merged is not None:  # still by id: a crashed move can leave two copies
                    results = [merged]
                else:
                    # unstamped rows: one request per partition, in parallel (the
                    # second in the pool, the first in this thread)
                    other = self._pool().submit(one, parts[1])
                    results = [one(parts[0]), other.result()]
        for hits in results:
            for h in hits:
                prev = best.get(h[ID_FIELD])
                if prev is None or h["distance"] > prev["distance"]:
                    best[h[ID_FIELD]] = h
        # equal distances by id: Milvus returns ties in an order that varies between
        # calls (segments are searched in parallel), and a cut through them here
        # (one request per partition) would keep a varying subset
        hits = sorted(best.values(), key=lambda h: (-h["distance"], str(h[ID_FIELD])))
        return hits[:k]
