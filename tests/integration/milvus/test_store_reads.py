"""Reads by id, pages and history on the store (`streams.respond.browse`), on Milvus
Lite and a server: folded ids, tenant scoping, a stable newest-first walk with the
search's filters, bounded history that outlives the process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from milvus import MemoryStore
from schemas import MemoryListQuery, SearchFilters, storage_key
from schemas.errors import InvalidRecord
from streams.respond.browse import (
    MemoryReader,
    MissRate,
    encode_cursor,
    read_cursor,
    scope_of,
)
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration

Factory = Callable[..., MemoryStore]


def _load(store: MemoryStore, n: int = 120) -> None:
    rows = [make_record(f"m{i:03d}", seed=i, agent_id=f"a{i % 3}", created_ts=1000 + i // 2,
                        utility=(i % 5) / 5, valence=1 if i % 2 else -1,
                        metadata={"user": {"room": "kitchen" if i % 4 == 0 else "hall"}})
            for i in range(n)]  # fmt: skip
    store.upsert(rows[: n // 2], "core")
    store.upsert(rows[n // 2 :], "buffer")
    store.upsert([make_record("m001", tenant="other", text="secret")], "core")


@pytest.mark.parametrize("mostly_missing", [False, True], ids=["lookup-first", "fold-beside"])
def test_get_stored_folded_missing_and_other_tenant(store_factory: Factory,
                                                    mostly_missing: bool) -> None:  # fmt: skip
    store = store_factory(dim=8)
    _load(store)
    # a chain of folds: f2 -> f1 -> m005; the answer is the stored survivor
    store.history.fold("acme", {"f1": "m005", "f2": "f1"}, 5)
    reader = MemoryReader(store, "Strong")  # its own fold edges: it reads the fold index
    if mostly_missing:  # reads of ids not stored: the fold read goes beside each lookup
        for i in range(8):
            assert reader.get("acme", [f"gone{i}"]) == {}
    assert reader.misses.likely("acme") is mostly_missing
    got = reader.get("acme", ["m001", "m100", "nope"])
    assert set(got) == {"m001", "m100"}
    assert got["m001"]["memory_id"] == "m001" and got["m001"]["partition"] == "core"
    assert got["m100"]["partition"] == "buffer" and "vector" not in got["m100"]
    assert got["m001"]["text"] != "secret"
    assert reader.get("other", ["m002"]) == {}
    if mostly_missing:  # the stored reads above lowered the rate: every read from here beside
        reader.misses = MissRate(threshold=-1.0)
    assert reader.misses.likely("acme") is mostly_missing
    folded = reader.get("acme", ["f2", "f1"])
    assert folded["f2"]["memory_id"] == "m005" and folded["f2"]["folded_id"] == "f2"
    assert folded["f1"]["folded_id"] == "f1"
    assert reader.get("other", ["f1"]) == {}  # the fold index is tenant-scoped too
    assert reader.get("other", ["m001"])["m001"]["text"] == "secret"


def test_pages_newest_first_stable_with_filters(store_factory: Factory) -> None:
    store = store_factory(dim=8)
    _load(store)
    reader = MemoryReader(store, "Strong")
    seen: list[tuple[int, str]] = []
    cursor = None
    for _ in range(20):
        page, cursor = reader.page(MemoryListQuery(tenant="acme", limit=25, cursor=cursor))
        seen += [(m["created_ts"], m["memory_id"]) for m in page]
        if cursor is None:
            break
    assert len(seen) == 120 and len(set(seen)) == 120
    assert seen == sorted(seen, reverse=True)
    # a second walk uses the learned density (windowed pages): the same order
    again: list[tuple[int, str]] = []
    cursor = None
    while True:
        page, cursor = reader.page(MemoryListQuery(tenant="acme", limit=7, cursor=cursor))
        again += [(m["created_ts"], m["memory_id"]) for m in page]
        if cursor is None:
            break
    assert again == seen
    q = MemoryListQuery.model_validate({"tenant": "acme", "agent_id": "a1", "limit": 500,
        "filters": {"partition": "buffer", "valence": 1, "min_utility": 0.4,
                    "metadata_equals": {"room": "hall"}}})  # fmt: skip
    page, cursor = reader.page(q)
    assert cursor is None and page
    want = {f"m{i:03d}" for i in range(60, 120)
            if i % 3 == 1 and i % 2 == 1 and (i % 5) / 5 >= 0.4 and i % 4 != 0}  # fmt: skip
    assert {m["memory_id"] for m in page} == want
    assert reader.page(MemoryListQuery(tenant="nobody"))[0] == []
    with pytest.raises(InvalidRecord):
        reader.page(MemoryListQuery(tenant="acme", cursor="not-a-cursor"))


class Counting:
    """The store, counting the queries a page makes."""

    def __init__(self, store: MemoryStore) -> None:
        self.store, self.history, self.queries = store, store.history, 0

    def query_rows(self, *args: object, **kw: object) -> object:
        self.queries += 1
        return self.store.query_rows(*args, **kw)  # type: ignore[arg-type]

    def lookup(self, *args: object, **kw: object) -> object:
        self.queries += 1
        return self.store.lookup(*args, **kw)  # type: ignore[arg-type]

    def visible(self, *args: object) -> object:
        return self.store.visible(*args)  # type: ignore[arg-type]


def _walk(reader: MemoryReader, limit: int) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    cursor = None
    while True:
        page, cursor = reader.page(MemoryListQuery(tenant="acme", limit=limit, cursor=cursor))
        seen += [(m["created_ts"], m["memory_id"]) for m in page]
        if cursor is None:
            return seen


def test_hinted_pages_are_one_query_and_stay_right_when_rows_change(
    store_factory: Factory,
) -> None:
    store = store_factory(dim=8)
    _load(store)
    counting = Counting(store)
    reader = MemoryReader(counting, "Strong")  # type: ignore[arg-type]
    truth = sorted(((1000 + i // 2, f"m{i:03d}") for i in range(120)), reverse=True)
    assert _walk(reader, 7) == truth
    # the cursor carries the next pages' bounds: after the first page (keys + rows),
    # most pages are one query each
    counting.queries = 0
    assert _walk(reader, 7) == truth
    pages = -(-120 // 7)
    assert counting.queries < 1.5 * pages, counting.queries
    first, cursor = reader.page(MemoryListQuery(tenant="acme", limit=7))
    assert cursor is not None and read_cursor(cursor).bounds
    # rows forgotten and written inside the next page's window since the cursor was
    # made: the page is still the newest rows below the cursor
    below = [t for t in truth if t < (first[-1]["created_ts"], first[-1]["memory_id"])]
    store.forget([m for _, m in below[:5]], tenant="acme")
    store.upsert([make_record("n000", seed=1, created_ts=below[3][0])], "core")
    want = sorted([*below[5:], (below[3][0], "n000")], reverse=True)[:7]
    page, _ = reader.page(MemoryListQuery(tenant="acme", limit=7, cursor=cursor))
    assert [(m["created_ts"], m["memory_id"]) for m in page] == want
    # a cursor with a forged bound far below (a window of every row) costs a hintless
    # read, never a wrong page
    c = read_cursor(cursor)
    forged = encode_cursor(c.ts, c.id, [(0, "a")])
    page, _ = reader.page(MemoryListQuery(tenant="acme", limit=7, cursor=forged))
    assert [(m["created_ts"], m["memory_id"]) for m in page] == want
    assert all(m["partition"] in ("core", "buffer") for m in page)
    # a cursor is good for the listing that issued it only (any page size)
    assert read_cursor(cursor).scope == scope_of(MemoryListQuery(tenant="acme", limit=50))
    for other in (MemoryListQuery(tenant="zeta", limit=7, cursor=cursor),
                  MemoryListQuery(tenant="acme", agent_id="a", limit=7, cursor=cursor),
                  MemoryListQuery(tenant="acme", limit=7, cursor=cursor,
                                  filters=SearchFilters(valence=1))):  # fmt: skip
        with pytest.raises(InvalidRecord, match="another listing"):
            reader.page(other)


def test_a_walk_leaves_out_rows_forgotten_lately_and_misses_no_other(
    store_factory: Factory,
) -> None:
    """Rows whose keys are tombstoned but still stored (what a bounded read finds for a
    moment after a forget) are on no page, in the hintless and the hinted pages alike,
    and the cursors still reach every other row once."""
    store = store_factory(dim=8)
    _load(store)
    reader = MemoryReader(store, "Strong")
    truth = sorted(((1000 + i // 2, f"m{i:03d}") for i in range(120)), reverse=True)
    first, _ = reader.page(MemoryListQuery(tenant="acme", limit=7))  # learns the density
    hidden = {m for _, m in truth[3::9]}
    store.tombstones.add([storage_key("acme", m) for m in hidden])
    want = [t for t in truth if t[1] not in hidden]
    assert _walk(reader, 7) == want
    assert _walk(reader, 7) == want  # the second walk's pages are hinted
    assert _walk(MemoryReader(store, "Strong"), 50) == want  # no density yet: keys read once


def test_history_ordered_bounded_tenant_scoped_and_durable(store_factory: Factory) -> None:
    store = store_factory(dim=8)
    store.history.per_memory = 8
    evs = [
        {
            "tenant": "acme",
            "memory_id": "m1",
            "kind": "credited",
            "ts": 100 + i,
            "utility_before": i / 10,
            "utility_after": (i + 1) / 10,
        }
        for i in range(20)
    ]
    evs.append({"tenant": "acme", "memory_id": "m1", "kind": "written", "ts": 50,
                "route": "core", "reason": "surprise"})  # fmt: skip
    store.history.record(evs)
    store.history.record(evs[-3:])  # a replay rewrites the same rows
    store.history.trim(["acme|m1"])
    got = store.history.events("acme", "m1")
    assert len(got) == 8
    assert [e["ts"] for e in got] == sorted(e["ts"] for e in got)
    assert got[-1]["utility_after"] == pytest.approx(2.0)  # the newest kept
    assert store.history.events("other", "m1") == []
    name, uri = store.collection, store.uri
    store.close()
    reopened = store_factory(dim=8, collection=name, uri=uri)
    assert reopened.history.events("acme", "m1") == got
