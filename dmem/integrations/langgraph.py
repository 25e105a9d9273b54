"""LangGraph long-term memory on dmem: `DmemStore`, a ``langgraph.store.base.BaseStore``.

``graph = builder.compile(store=DmemStore(SyncClient(bootstrap, tenant, http_url=...)))``;
nodes then use ``get_store()`` (or the ``store`` argument) as with any LangGraph store.

Mapping (decisions):
- The client's tenant is the tenant; a namespace tuple is one agent scope,
  ``agent_id = "/".join(namespace)`` (`agent_for`) when its parts hold only
  letters, digits and ``_:@-`` (LangGraph forbids ``.`` in a label). Any other
  character of a part is written ``.XX`` per UTF-8 byte (``/`` as ``.2F``, ``.``
  as ``.2E``), so ``("a/b",)`` and ``("a", "b")`` are different scopes; a namespace
  whose joined form would pass 128 characters gets ``lg..`` and a hash of it.
  Distinct namespaces always get distinct agent ids. The memory id is a stable hash
  of (namespace, key), so a second ``put`` of the same key replaces the first where
  the gate keeps it (a dropped one leaves the stored value as it was).
- ``put(ns, key, value)`` publishes one `Transition` (``action="put"``, reward
  ``value.get("reward", 0)``). The value's text (its ``text``, ``content``,
  ``memory`` or ``data`` field when that is a string, else the whole value as JSON)
  is the observation that gets embedded; the rest of the value travels in the
  transition's metadata (at most 512 characters as JSON, at most 29 scalar fields,
  each filterable, with names of at most 124 characters; else `ValueError`).
  **Under the gate**: a put is a write *request*. The write role decides within
  milliseconds whether it is kept (core or buffer) or dropped as expected (a
  repeat of what the agent already stored, for instance); only kept items become
  searchable, after the write role has processed them (typically well under a
  second; eventually consistent like any stream). ``get`` of a dropped key is None.
- ``get`` reads the row by id over the HTTP API; ``search(ns, query=...)`` is
  dmem's value-aware search scoped to exactly that namespace: a namespace *prefix*
  is not an agent scope (dmem keeps no namespace catalogue to expand it), so a
  search of one that is only a prefix of namespaces this store object has written or
  read raises `ValueError`, and one this object has not seen finds what was put
  under exactly that tuple;
  ``filter`` maps to metadata equality on the value's scalar non-text fields
  (stored with the prefix ``lgv_``); ``score`` is dmem's ranking score.
  ``delete`` (or ``put`` with value None) forgets the memory (audited). A forget
  is final for a while: the deployment refuses every write of that memory id for
  its tombstone TTL (``DMEM_MILVUS__TOMBSTONE_TTL_S``, one hour by default), so a
  replayed old write cannot bring it back. To change a value, ``put`` it again (the
  same id is replaced where the gate keeps the new value); a ``put`` of a key this
  store object deleted within the
  default TTL raises `ValueError` instead of being dropped without a word.
- ``list_namespaces`` answers the namespaces this store object has written or
  read: dmem keeps no namespace catalogue to list across processes.
- No TTL support (``supports_ttl = False``): forgetting is dmem's decay and
  capacity policy, not a per-item timer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import string
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from dmem.client import Client, SyncClient
from schemas import LIMITS, Transition
from schemas.limits import INT64_MAX
from schemas.models import META_KEY, fit_id

TEXT_FIELDS = ("text", "content", "memory", "data")
META_PREFIX = "lgv_"


def memory_id(namespace: tuple[str, ...], key: str) -> str:
    """A stable hash of (namespace, key): the parts joined by ``\x1f``, a ``\x1f`` or
    ``\x1e`` inside a part escaped by ``\x1e`` first, so that no two namespaces share
    an id (the ids of parts without either character are the same as unescaped)."""
    parts = [
        p.replace("\x1e", "\x1e\x1e").replace("\x1f", "\x1e\x1f") for p in (*namespace, "", key)
    ]
    raw = "\x1f".join(parts).encode()
    return "lg-" + hashlib.blake2b(raw, digest_size=16).hexdigest()


#: characters a namespace part keeps as they are in its agent id (`agent_for`)
_PLAIN = frozenset(string.ascii_letters + string.digits + "_:@-")
#: starts the agent id of a namespace too long to spell out: ".." is in no spelled one
LONG_PREFIX = "lg.."


def _escape(part: str) -> str:
    """``part`` with every character outside `_PLAIN` as ``.XX`` per UTF-8 byte
    (``/`` is ``.2F``, ``.`` itself ``.2E``): LangGraph forbids ``.`` in a label, so
    the labels it accepts that hold no ``/`` and no other character an id can not
    hold are unchanged."""
    return "".join(c if c in _PLAIN else "".join(f".{b:02X}" for b in c.encode()) for c in part)


def agent_for(namespace: tuple[str, ...]) -> str:
    """The agent id of a namespace: its escaped parts joined with ``/``, or, when that
    would pass the id limit, `LONG_PREFIX` and a hash of it. Distinct namespaces get
    distinct ids (no escaped part holds ``/``, and no joined one ``..``)."""
    if not namespace:
        raise ValueError("a dmem namespace needs at least one part")
    joined = "/".join(_escape(p) for p in namespace)
    if not joined:
        raise ValueError("a dmem namespace needs a part that is not empty")
    return joined if len(joined) <= LIMITS.max_id_chars else fit_id(LONG_PREFIX, joined)


def split_value(value: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(text to embed, the field it came from or "" for whole-JSON, the rest)."""
    for f in TEXT_FIELDS:
        if isinstance(value.get(f), str):
            return value[f], f, {k: v for k, v in value.items() if k != f}
    return json.dumps(value, sort_keys=True, default=str), "", {}


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


#: how long a forgotten id is refused by default (`milvus.tombstones`' TTL)
FORGET_REFUSES_S = 3600.0


def _filterable(v: Any) -> bool:
    """A value field that becomes a filterable metadata key: a scalar that metadata holds
    (a string up to 256 characters, an integer within Milvus' INT64, a finite float); any
    other stays in the value's JSON only (returned, not filterable)."""
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return abs(v) <= INT64_MAX
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, str) and len(v) <= 256


class DmemStore(BaseStore):
    """A LangGraph `BaseStore` backed by a dmem deployment (see the module doc)."""

    supports_ttl = False

    def __init__(self, client: SyncClient) -> None:
        if client.client.http_url is None:
            raise ValueError("DmemStore reads over HTTP: create the client with http_url=...")
        self.sync = client
        self.seen: set[tuple[str, ...]] = set()
        self.deleted: dict[str, float] = {}  # memory id -> monotonic time of its delete

    # -- BaseStore -----------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self.sync.submit(self._batch(list(ops))).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.wrap_future(self.sync.submit(self._batch(list(ops))))

    # -- implementation (runs on the client's loop) -------------------------
    async def _batch(self, ops: list[Op]) -> list[Result]:
        c = self.sync.client
        out: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                out.append(await self._get(c, op))
            elif isinstance(op, PutOp):
                await self._put(c, op)
                out.append(None)
            elif isinstance(op, SearchOp):
                out.append(await self._search(c, op))
            elif isinstance(op, ListNamespacesOp):
                out.append(self._namespaces(op))
            else:
                raise TypeError(f"unsupported store operation {type(op).__name__}")
        return out

    async def _put(self, c: Client, op: PutOp) -> None:
        mid = memory_id(op.namespace, op.key)
        self.seen.add(op.namespace)
        if op.value is None:
            await c.forget(memory_id=mid)
            now = time.monotonic()
            self.deleted = {k: t for k, t in self.deleted.items() if now - t < FORGET_REFUSES_S}
            self.deleted[mid] = now
            return
        at = self.deleted.get(mid)
        if at is not None and time.monotonic() - at < FORGET_REFUSES_S:
            raise ValueError(
                f"key {op.key!r} of {op.namespace} was deleted {time.monotonic() - at:.0f} s "
                "ago: dmem refuses a forgotten memory's id for its tombstone TTL (one hour "
                "by default), so this put would not be stored; put without deleting to "
                "replace a value"
            )
        value = dict(op.value)
        text, field, rest = split_value(value)
        meta: dict[str, Any] = {"lg_key": op.key, "lg_text_field": field}
        rest_json = json.dumps(rest, sort_keys=True, default=str)
        if len(rest_json) > LIMITS.max_metadata_value_chars:
            raise ValueError(
                f"the value's non-text fields take {len(rest_json)} characters "
                f"as JSON (at most {LIMITS.max_metadata_value_chars})"
            )
        meta["lg_rest"] = rest_json
        for k, v in rest.items():  # scalar fields are filterable (`filter=`)
            if _filterable(v):
                meta[f"{META_PREFIX}{k}"] = v
        # said here, in the value's terms: the transition's check would name metadata
        # keys the caller never wrote ("metadata has 33 keys (max 32)")
        long_names = [k for k in meta if len(k) > LIMITS.max_id_chars]
        if long_names:
            raise ValueError(
                f"the value's field {long_names[0][len(META_PREFIX) :][:40]!r}... has a name "
                f"longer than {LIMITS.max_id_chars - len(META_PREFIX)} characters"
            )
        if len(meta) > LIMITS.max_metadata_keys:
            raise ValueError(
                f"the value has {len(meta) - 3} scalar fields besides its text; at most "
                f"{LIMITS.max_metadata_keys - 3} (each is a filterable metadata key)"
            )
        reward = value.get("reward", 0.0)
        if isinstance(reward, int) and abs(reward) > LIMITS.max_abs_value:
            # float() of a huge int is an OverflowError, not the transition's reason
            raise ValueError(f"the value's reward is outside +-{LIMITS.max_abs_value:g}")
        now = int(datetime.now(tz=UTC).timestamp() * 1000)
        await c.publish(
            Transition.model_validate(
                {
                    "transition_id": mid,
                    "tenant": c.tenant,
                    "agent_id": agent_for(op.namespace),
                    "episode_id": agent_for(op.namespace),
                    "step": 0,
                    "observation": text,
                    "action": "put",
                    "reward": float(reward) if isinstance(reward, int | float) else 0.0,
                    "ts": now,
                    "metadata": meta,
                }
            )
        )

    @staticmethod
    def _value(text: str, meta: dict[str, Any]) -> dict[str, Any]:
        field = meta.get("lg_text_field", "")
        if not field:
            try:
                value = json.loads(text)
                return value if isinstance(value, dict) else {"text": text}
            except json.JSONDecodeError:
                return {"text": text}
        rest = json.loads(meta.get("lg_rest") or "{}")
        return {**rest, field: text}

    async def _get(self, c: Client, op: GetOp) -> Item | None:
        self.seen.add(op.namespace)
        row = await c.get_memory(memory_id(op.namespace, op.key))
        if row is None:
            return None
        meta = dict((row.get("metadata") or {}).get("user") or {})  # the agent's own part
        ts = _ts(int(row.get("created_ts", 0)))
        updated = _ts(int(row.get("last_access_ts", row.get("created_ts", 0))))
        return Item(
            value=self._value(str(row.get("text", "")), meta),
            key=op.key,
            namespace=op.namespace,
            created_at=ts,
            updated_at=updated,
        )

    async def _search(self, c: Client, op: SearchOp) -> list[SearchItem]:
        ns = op.namespace_prefix
        if not ns:
            raise ValueError("search needs the full namespace of an agent scope")
        longer = [n for n in self.seen if len(n) > len(ns) and n[: len(ns)] == ns]
        if longer and ns not in self.seen:  # a prefix would search an empty scope: []
            raise ValueError(
                f"search of {ns} would not cover {sorted(longer)[0]}: dmem searches "
                "exactly one namespace (an agent scope), not a namespace prefix; search "
                "each namespace"
            )
        if op.limit + op.offset > LIMITS.max_k:  # the search's k, which the caller never named
            raise ValueError(
                f"limit + offset is {op.limit + op.offset}: dmem answers at most "
                f"{LIMITS.max_k} hits to one search"
            )
        filters = {f"{META_PREFIX}{k}": v for k, v in (op.filter or {}).items()}
        bad = sorted(k[len(META_PREFIX) :] for k in filters if not META_KEY.match(k))
        if bad:
            raise ValueError(
                f"the value field {bad[0]!r} cannot be filtered on: a filter names a field of "
                f"letters, digits and _ (not first), at most {64 - len(META_PREFIX)} characters"
            )
        if not op.query:  # LangGraph's listing of a namespace: newest first
            return await self._list(c, ns, op, filters)
        hits = await c.search(
            op.query, op.limit + op.offset, agent_id=agent_for(ns), metadata_equals=filters
        )
        out = []
        for h in hits[op.offset :]:
            meta = h.metadata
            if "lg_key" not in meta:
                continue  # a memory of the same agent not written through a store
            out.append(
                SearchItem(
                    namespace=ns,
                    key=str(meta["lg_key"]),
                    value=self._value(h.text, meta),
                    created_at=_ts(h.created_ts),
                    updated_at=_ts(h.created_ts),
                    score=h.score,
                )
            )
        self.seen.add(ns)
        return out

    async def _list(self, c: Client, ns: tuple[str, ...], op: SearchOp,
                    filters: dict[str, Any]) -> list[SearchItem]:  # fmt: skip
        """A search without a query: the namespace's items, newest first (``score``
        None), from the memory listing."""
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        while len(rows) < op.limit + op.offset:
            page, cursor = await c.list_page(
                limit=LIMITS.max_page, cursor=cursor, agent_id=agent_for(ns),
                filters={"metadata_equals": filters},
            )  # fmt: skip
            rows += [r for r in page if "lg_key" in ((r.get("metadata") or {}).get("user") or {})]
            if cursor is None:
                break
        out = []
        for row in rows[op.offset : op.offset + op.limit]:
            meta = dict(row["metadata"]["user"])
            out.append(
                SearchItem(
                    namespace=ns,
                    key=str(meta["lg_key"]),
                    value=self._value(str(row.get("text", "")), meta),
                    created_at=_ts(int(row.get("created_ts", 0))),
                    updated_at=_ts(int(row.get("last_access_ts", row.get("created_ts", 0)))),
                )
            )
        self.seen.add(ns)
        return out

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        names = sorted(self.seen)
        for cond in op.match_conditions or ():
            path = tuple(cond.path)
            if cond.match_type == "prefix":
                names = [n for n in names if _match(n[: len(path)], path)]
            else:
                names = [n for n in names if len(n) >= len(path) and _match(n[-len(path) :], path)]
        if op.max_depth is not None:
            names = sorted({n[: op.max_depth] for n in names})
        return names[op.offset : op.offset + op.limit]


def _match(part: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return all(p == "*" or p == q for q, p in zip(part, pattern, strict=True))


__all__ = ["DmemStore", "agent_for", "memory_id"]
