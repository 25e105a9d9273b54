"""Reading a tenant's memories by id, page by page, and their history (sync; the
HTTP handlers run it in a worker thread).

- By id (`MemoryReader.get`): one primary-key query over both partitions
  (`MemoryStore.lookup`) with the search's consistency (bounded staleness: a
  Strong read waits for the next server time tick); only the ids it did not find
  are then looked up in the fold index (`milvus.history.HistoryStore.folded_into`,
  a primary-key read too). A stored id costs one query and nothing else: a fold
  read beside it costs the server and the client a second query's work. A tenant
  whose recent reads mostly missed (`MissRate` above `MISS_LIKELY`: reading back
  ids the gate dropped, unknown ids) gets the fold read beside the lookup, so its
  missing ids cost one round trip's latency. A folded id answers with its
  survivor's row plus ``folded_id``; chains of folds are followed for at most
  `MAX_HOPS`. Fold edges never change once written (an id is folded once), so the
  reader shares the process' `milvus.history.FoldEdges`: the edges dedup wrote
  here, the history recorder filed from the ``merged`` events and earlier reads
  found. A folded id whose edge is known costs one round trip (the id and its
  survivor in one lookup), its first read included; one whose edge is not known
  costs two or three (the id, its fold edge, then the survivor).
- Pages (`MemoryReader.page`): newest first, keyset pagination on
  (``created_ts``, id): the cursor is the last item's pair, so a walk is stable
  while memories are written and resumes anywhere. A page that has no hint reads
  the keys (id, created_ts) of a time window below the cursor, sized from the
  scope's density to hold about `WINDOW_PAGES` pages and widened until it holds
  more than a page, then the page's rows by primary key. The density is learned
  from one read of the scope's keys and re-estimated from every window (writes
  come in bursts), per scope, in this worker. The keys read also tell where the
  next pages start: the cursor carries up to `MAX_BOUNDS` of those (created_ts,
  id) lower bounds, so each of the next pages is ONE query of its rows between
  its bound and its cursor (about a page and one row). A bound is only a hint:
  the page is always the newest rows below the cursor that the query finds, and
  a window that no longer holds more than a page (memories forgotten or moved
  since) or holds more than `HINT_CAP` pages (written since, or a forged cursor)
  is answered the hintless way instead.
- History (`MemoryReader.history`): the memory's events from the history
  collection, oldest first.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from milvus import expr as E
from milvus.history import FOLD_CACHE, FoldEdges
from milvus.schema import PARTITIONS, PRIMARY_FIELD, VECTOR_FIELD, scalar_fields
from schemas import MemoryListQuery
from schemas.errors import InvalidRecord
from schemas.limits import INT64_MAX
from streams.respond.responder import Responder, filter_terms

__all__ = ["FOLD_CACHE", "MAX_HOPS", "Cursor", "MemoryReader", "MissRate", "decode_cursor",
           "encode_cursor", "list_query", "read_cursor", "scope_of"]  # fmt: skip

MAX_HOPS = 8
#: Milvus' largest result window of one query (``limit``): more rows take an iterator
WINDOW = 16_384
KEY_FIELDS = ["id", "created_ts"]
#: a hintless page reads the keys of a window sized to hold about this many pages
WINDOW_PAGES = 10
#: at most this many next-page bounds ride in a cursor (and it stays under `CURSOR_CHARS`)
MAX_BOUNDS = 8
CURSOR_CHARS = 1000
#: a hinted window holding this many pages or more is not trusted (read hintless)
HINT_CAP = 4
#: the fields of a memory as the HTTP API shows it (everything but the vector)
FIELDS = [f for f in scalar_fields() if f not in (PRIMARY_FIELD, VECTOR_FIELD)]
#: `MissRate`: the weight of a read's share of misses in the moving average, and the
#: average above which the fold read goes beside the lookup: beside, it costs every
#: stored id a second query and saves a missing one less, so it pays only when most ids
#: read are not stored (the break-even, measured: docs/design/2026-12-03-read-round-trips.md)
MISS_ALPHA = 0.2
MISS_LIKELY = 0.75
_FILTER_PARAMS = ("valence", "partition", "since_ms", "until_ms", "min_utility")
_QUERY_PARAMS = ("tenant", "agent_id", "limit", "cursor")


class MissRate:
    """Per tenant, a moving average of the share of ids its reads by id did not find
    stored (the last `size` tenants read; the least recently read is dropped first).
    A tenant above ``threshold`` is ``likely`` to ask for ids that are not stored:
    the fold-index read then goes beside the lookup instead of after it. It decides
    the order of two reads, never an answer."""

    def __init__(self, alpha: float = MISS_ALPHA, threshold: float = MISS_LIKELY,
                 size: int = 4096) -> None:  # fmt: skip
        self.alpha, self.threshold, self.size = alpha, threshold, size
        self._rate: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def likely(self, tenant: str) -> bool:
        with self._lock:
            return self._rate.get(tenant, 0.0) > self.threshold

    def observe(self, tenant: str, missed: int, asked: int) -> None:
        """A read asked the store for ``asked`` ids and ``missed`` of them were not there."""
        if asked <= 0:
            return
        with self._lock:
            old = self._rate.pop(tenant, 0.0)
            self._rate[tenant] = old + self.alpha * (missed / asked - old)
            while len(self._rate) > self.size:
                self._rate.popitem(last=False)


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: below (``ts``, ``id``). ``bounds``: the (created_ts, id)
    of the first row of each page after the next (nearest first), as the keys read
    showed them; ``floor``: after those, the rest held at most a page. Hints of
    cost only: the rows a page answers do not depend on them."""

    ts: int
    id: str
    bounds: tuple[tuple[int, str], ...] = ()
    floor: bool = False
    #: the listing it belongs to (`scope_of`: tenant, agent and filters); None in a
    #: cursor that names none
    scope: str | None = None


def scope_of(q: MemoryListQuery) -> str:
    """A short digest of what a listing lists (tenant, agent, filters): a cursor is only
    good for the listing that issued it."""
    key = orjson.dumps(q.model_dump(exclude={"cursor", "limit"}), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(key, digest_size=6).hexdigest()


def encode_cursor(created_ts: int, memory_id: str, bounds: Sequence[tuple[int, str]] = (),
                  floor: bool = False, scope: str | None = None) -> str:  # fmt: skip
    """The cursor of a page below (``created_ts``, ``memory_id``) of the listing
    ``scope``, with as many of ``bounds`` (and ``floor`` when all fit) as keep it under
    `CURSOR_CHARS`."""
    bounds = list(bounds[:MAX_BOUNDS])
    floor = floor and len(bounds) <= MAX_BOUNDS
    while True:
        d: dict[str, Any] = {"t": created_ts, "i": memory_id}
        if scope is not None:
            d["s"] = scope
        if bounds:
            d["b"] = [[t, i] for t, i in bounds]
        if floor:
            d["f"] = 1
        out = base64.urlsafe_b64encode(orjson.dumps(d)).decode().rstrip("=")
        if len(out) <= CURSOR_CHARS or not (bounds or floor):
            return out
        floor = False
        bounds = bounds[:-1]


def _key(ts: Any, mid: Any) -> bool:
    """Is (``ts``, ``mid``) a (created_ts, id) a page could have issued: an int (not a
    bool) a Milvus INT64 created_ts holds, at or after the epoch, and a non-empty id?"""
    return type(ts) is int and 0 <= ts <= INT64_MAX and isinstance(mid, str) and bool(mid)


def read_cursor(cursor: str) -> Cursor:
    """The `Cursor` of a ``next_cursor``; `InvalidRecord` when it is not one (a forged
    one included: every created_ts must be one `_key` accepts)."""
    bad = InvalidRecord("cursor is not a next_cursor of this API")
    try:
        d = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        ts, mid = d["t"], d["i"]
        raw = d.get("b", [])
        bounds = tuple((t, i) for t, i in raw if _key(t, i))
    except (ValueError, TypeError, KeyError, AttributeError, orjson.JSONDecodeError) as exc:
        raise bad from exc
    scope = d.get("s")
    if not _key(ts, mid) or len(bounds) != len(raw):
        raise bad
    if scope is not None and not isinstance(scope, str):
        raise bad
    return Cursor(ts, mid, bounds[:MAX_BOUNDS], d.get("f") == 1, scope)


def decode_cursor(cursor: str) -> tuple[int, str]:
    """(created_ts, id) of a cursor; `InvalidRecord` when it is not one."""
    c = read_cursor(cursor)
    return c.ts, c.id


def _below(ts: int, mid: str) -> str:
    """Rows after (ts, mid) in the newest-first order."""
    return f"(created_ts < {ts}) || (created_ts == {ts} && id < {E.literal(mid)})"


def _at_or_above(ts: int, mid: str) -> str:
    """Rows at (ts, mid) or before it in the newest-first order."""
    return f"(created_ts > {ts}) || (created_ts == {ts} && id >= {E.literal(mid)})"


def _order(r: Mapping[str, Any]) -> tuple[int, str]:
    return int(r["created_ts"]), str(r["id"])


def _scalar(value: str) -> Any:
    """A metadata filter value: a JSON number, boolean or string literal, else the text."""
    try:
        v = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    return v if isinstance(v, str | int | float | bool) else value


#: integer parameters: ASCII digits only (pydantic's lax parsing of text would also
#: take "+5", "5_0" and other scripts' digits); their bounds are `MemoryListQuery`'s
_INT_PARAMS = ("limit", "since_ms", "until_ms")


def ascii_int(name: str, value: str) -> int:
    """A query parameter's non-negative integer: ASCII digits only (no sign, no digit
    separator, no other script's digits), at most 19 significant ones (bounded before
    ``int()``: a 5000-digit value is refused, not parsed); else `InvalidRecord`."""
    if not (value.isascii() and value.isdigit() and len(value.lstrip("0")) <= 19):
        raise InvalidRecord(
            f"{name} must be a non-negative integer (ASCII digits), got {value!r:.40}"
        )
    return int(value)


def unknown_params(params: Iterable[str], allowed: Iterable[str]) -> str | None:
    """The error for the query parameters of ``params`` not in ``allowed``, or None."""
    unknown = sorted(set(params) - set(allowed))
    return f"unknown query parameters {unknown}" if unknown else None


def list_query(params: Mapping[str, str]) -> dict[str, Any]:
    """Query parameters of ``GET /v1/memories`` -> the `MemoryListQuery` payload.

    ``meta.<key>=<value>`` is a metadata equality (the value a JSON literal, else
    text); an unknown parameter is an error, not silently ignored.
    """
    out: dict[str, Any] = {}
    filters: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    unknown = []
    for key, value in params.items():
        if key in _QUERY_PARAMS:
            out[key] = ascii_int(key, value) if key in _INT_PARAMS else value
        elif key in _INT_PARAMS:
            filters[key] = ascii_int(key, value)
        elif key in _FILTER_PARAMS:  # numbers as numbers (a Literal does not coerce text)
            v = _scalar(value)
            filters[key] = v if isinstance(v, int | float) and not isinstance(v, bool) else value
        elif key.startswith("meta.") and len(key) > 5:
            meta[key[5:]] = _scalar(value)
        else:
            unknown.append(key)
    if unknown and (why := unknown_params(unknown, ())):
        raise InvalidRecord(why)
    if meta:
        filters["metadata_equals"] = meta
    if filters:
        out["filters"] = filters
    return out


def item(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as the API shows it: ``memory_id`` and ``merged_ids`` added."""
    row.pop(VECTOR_FIELD, None)
    row.pop("distance", None)
    row["memory_id"] = str(row["id"])
    row["merged_ids"] = Responder.merged_ids([row]).get(row["memory_id"], [])
    return row


class MemoryReader:
    """By id, pages and history over one store (see the module doc)."""

    def __init__(self, store: Any, consistency_level: str | None = "Bounded",
                 edges: FoldEdges | None = None) -> None:  # fmt: skip
        self.store = store
        self.consistency_level = consistency_level
        #: per list scope (tenant, agent, filters): how densely memories lie in time
        self._density: OrderedDict[str, _Density] = OrderedDict()
        #: fold edges known in this process (they never change): (tenant, id) -> survivor id
        self._folds = edges if edges is not None else FoldEdges()
        self._lock = threading.Lock()
        #: per tenant: do its reads by id mostly miss (then the fold read goes alongside)
        self.misses = MissRate()
        #: the fold-index reads that run beside a lookup
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dmem-reads")

    # -- by id -----------------------------------------------------------------------
    def get(self, tenant: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """``{id: row}`` for the ids stored or folded (a folded id's row is its
        survivor's, with ``folded_id``); ids neither are absent."""
        want = list(dict.fromkeys(ids))
        rows: dict[str, dict[str, Any]] = {}
        edges: dict[str, str] = {}  # folded id -> the id it went into
        looked: set[str] = set()  # ids read from the store and the fold index
        for _ in range(MAX_HOPS + 1):
            todo = {c for c in (self._follow(m, rows, edges) for m in want)
                    if c not in rows and c not in looked}  # fmt: skip
            if not todo:
                break
            found, into = self._round(tenant, sorted(todo))
            rows.update(found)
            edges.update(into)
            looked |= todo
        out: dict[str, dict[str, Any]] = {}
        for m in want:
            c = self._follow(m, rows, edges)
            if c in rows:
                out[m] = rows[c] if c == m else {**rows[c], "folded_id": m}
        return out

    @staticmethod
    def _follow(m: str, rows: Mapping[str, Any], edges: Mapping[str, str]) -> str:
        """The id that stands for ``m`` so far: itself when stored, else along its folds."""
        c = m
        for _ in range(MAX_HOPS):
            if c in rows or c not in edges:
                break
            c = edges[c]
        return c

    def _round(self, tenant: str, ids: list[str]) -> tuple[dict[str, dict[str, Any]],
                                                           dict[str, str]]:  # fmt: skip
        """One round: the rows of ``ids`` (and of the survivors of their cached folds),
        then the fold edges of those neither stored nor cached; for a tenant whose
        reads mostly miss (`MissRate`) the fold read runs beside the lookup instead.
        Returns (rows by id, fold edges)."""
        known = self._folds.chains(tenant, ids, MAX_HOPS)  # cached edges from these ids on
        ask = [m for m in ids if m not in known]
        level = self.consistency_level
        pending: Future[dict[str, str]] | None = None
        if ask and self.misses.likely(tenant):
            pending = self._pool.submit(self.store.history.folded_into, tenant, ask, level)
        read = list(dict.fromkeys([*ids, *known.values()]))
        try:
            found = {str(r["id"]): item(r) for r in self.store.lookup(
                read, tenant=tenant, output_fields=FIELDS, consistency_level=level)}  # fmt: skip
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        absent = [m for m in ask if m not in found]
        self.misses.observe(tenant, len(absent), len(ask))
        into = dict(known)
        fetched: dict[str, str] = {}
        if pending is not None:
            if absent:
                fetched = pending.result()
            else:  # all stored: the fold read is not needed
                pending.cancel()
        elif absent:
            fetched = self.store.history.folded_into(tenant, absent, level)
        if fetched:
            into.update(fetched)
            self._folds.add(tenant, fetched)
        return found, into

    # -- pages -----------------------------------------------------------------------
    def _rows(self, tenant: str, ids: list[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        return list(self.store.lookup(ids, tenant=tenant, output_fields=FIELDS,
                                      consistency_level=self.consistency_level))  # fmt: skip

    def _query(self, flt: str, parts: list[str], fields: list[str],
               every: bool = False) -> list[dict[str, Any]]:  # fmt: skip
        """Rows (``fields`` only, no partition) matching ``flt``: at most `WINDOW`, or all
        of them (``every``)."""
        level = self.consistency_level
        # forgotten keys stay in: the page's rows are read by key (`_rows`), which
        # leaves them out, and a window is judged by what Milvus holds
        rows = self.store.query_rows(flt, parts, fields, limit=WINDOW, consistency_level=level,
                                     stamp=False, hide=False)  # fmt: skip
        if every and len(rows) >= WINDOW:  # more than one answer holds: page through them
            rows = self.store.query_rows(flt, parts, fields, limit=None, consistency_level=level,
                                         stamp=False, hide=False)  # fmt: skip
        return list(rows)

    def page(self, q: MemoryListQuery) -> tuple[list[dict[str, Any]], str | None]:
        """One page of `q`: (memories newest first, the next page's cursor or None).

        A cursor names the listing that issued it (`scope_of`); one from another
        tenant, agent or filter set is refused (`InvalidRecord`): it would only start
        this listing at a foreign position.
        """
        scope = scope_of(q)
        cur = read_cursor(q.cursor) if q.cursor else None
        if cur is not None and cur.scope is not None and cur.scope != scope:
            raise InvalidRecord(
                "cursor belongs to another listing (its tenant, agent or filters differ): "
                "list again without a cursor"
            )
        rows, nxt = self._page(q, cur)
        if nxt is None:
            return rows, None
        c = read_cursor(nxt)
        return rows, encode_cursor(c.ts, c.id, c.bounds, c.floor, scope)

    def _page(
        self, q: MemoryListQuery, cur: Cursor | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """`page` without the cursor's listing check: the rows and an unbound cursor.

        Keyset pagination on (created_ts, id): the page is the newest ``limit``
        memories below the cursor. With a bound in the cursor it is one query
        (`_hinted`); else it is read from a window ``created_ts >= lo`` sized from
        the scope's density (`_Density`) to hold about `WINDOW_PAGES` pages,
        widened until it holds more than a page or reaches the oldest memory;
        without a density yet, the scope's keys are read once to learn it.
        """
        f = q.filters
        base = E.build_filter(tenant=q.tenant, agent_id=q.agent_id,
                              extra_filter=filter_terms(f) or None)  # fmt: skip
        parts: list[str] = [f.partition] if f.partition else list(PARTITIONS)
        terms = [base]
        if cur is not None:
            terms.append(_below(cur.ts, cur.id))
            if cur.bounds or cur.floor:
                hinted = self._hinted(q, terms, parts, cur)
                if hinted is not None:
                    return hinted
        top = cur.ts if cur is not None else None
        scope = orjson.dumps(q.model_dump(exclude={"cursor", "limit"}),
                             option=orjson.OPT_SORT_KEYS).decode()  # fmt: skip
        with self._lock:
            dens = self._density.get(scope)
        keys: list[dict[str, Any]] | None = None
        if dens is not None:
            top_ts = top if top is not None else dens.newest
            width = max(1, int(WINDOW_PAGES * q.limit / dens.rate))
            for _ in range(8):
                lo = top_ts - width
                got = self._query(E.and_all([*terms, f"created_ts >= {lo}"]), parts, KEY_FIELDS)
                if len(got) >= WINDOW:  # a burst of writes: a narrower window
                    width = max(1, width // 8)
                    continue
                if len(got) > q.limit:  # the next window follows this one's density
                    keys = got
                    self._learn(scope, _Density(dens.oldest, max(dens.newest, top_ts),
                                                len(got) / width))  # fmt: skip
                    break
                if lo <= dens.oldest:  # the rest is small: read it without a window
                    break
                width *= 4
        complete = keys is None  # every key below the cursor is in hand
        if keys is None:  # no density yet (or it was far off): the scope's keys, once
            keys = self._query(E.and_all(terms), parts, KEY_FIELDS, every=True)
            if not q.cursor and keys:
                ts = [int(k["created_ts"]) for k in keys]
                self._learn(scope, _Density.of(min(ts), max(ts), len(ts)))
        keys.sort(key=_order, reverse=True)
        rows = self._rows(q.tenant, [str(k["id"]) for k in keys[: q.limit]])
        return [item(r) for r in rows], self._next(keys, q.limit, complete)

    @staticmethod
    def _next(keys: list[dict[str, Any]], limit: int, complete: bool,
              rest: Cursor | None = None) -> str | None:  # fmt: skip
        """The next page's cursor from the sorted keys (or rows) read for this page:
        with the bound of every later page the keys show, and ``floor`` when they
        are every key below the cursor; without bounds of its own, ``rest``'s."""
        if len(keys) <= limit:
            return None
        last = keys[limit - 1]
        bounds = [_order(keys[i]) for i in range(2 * limit, len(keys), limit)]
        if not bounds and not complete and rest is not None:
            return encode_cursor(*_order(last), rest.bounds, rest.floor)
        return encode_cursor(*_order(last), bounds, complete)

    def _hinted(self, q: MemoryListQuery, terms: list[str], parts: list[str],
                cur: Cursor) -> tuple[list[dict[str, Any]], str | None] | None:  # fmt: skip
        """The page as one query of the rows between the cursor's first bound (none
        when only ``floor`` is left) and the cursor; None when the window does not
        hold more than a page, or holds `HINT_CAP` pages or more."""
        cap = HINT_CAP * q.limit + 1
        bound = cur.bounds[0] if cur.bounds else None
        flt = E.and_all([*terms, _at_or_above(*bound)] if bound else terms)
        rows = self.store.query_rows(flt, parts, FIELDS, limit=cap, hide=False,
                                     consistency_level=self.consistency_level)  # fmt: skip
        if len(rows) >= cap or (bound is not None and len(rows) <= q.limit):
            return None
        rows.sort(key=_order, reverse=True)
        page = rows[: q.limit]
        unstamped = [str(r["id"]) for r in page if r.get("partition") is None]
        if unstamped:  # written by another client: its partition from a primary-key read
            again = {str(r["id"]): r for r in self._rows(q.tenant, unstamped)}
            page = [again.get(str(r["id"]), r) for r in page]
        rest = Cursor(cur.ts, cur.id, cur.bounds[1:], cur.floor)
        # the cursor from every row Milvus returned; the page without those forgotten lately
        return ([item(r) for r in self.store.visible(q.tenant, page)],
                self._next(rows, q.limit, bound is None, rest))  # fmt: skip

    def _learn(self, scope: str, d: _Density) -> None:
        with self._lock:
            self._density[scope] = d
            self._density.move_to_end(scope)
            while len(self._density) > 256:
                self._density.popitem(last=False)

    # -- history ---------------------------------------------------------------------
    def history(self, tenant: str, memory_id: str, limit: int) -> list[dict[str, Any]]:
        return list(self.store.history.events(tenant, memory_id, limit))


@dataclass(frozen=True)
class _Density:
    """A scope's memories in time: oldest and newest created_ts, memories per ms."""

    oldest: int
    newest: int
    rate: float

    @staticmethod
    def of(oldest: int, newest: int, n: int) -> _Density:
        return _Density(oldest, newest, max(n, 1) / max(newest - oldest, 1))
