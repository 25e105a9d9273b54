"""A forget wins over writes in flight (`MemoryStore.forget`, `milvus.tombstones`).

CI caught a thumbs-up applied right after a forget writing the memory back: the
credit applier had read the row before the forget and upserted it after. Every
writer that rewrites a row it read must find the key refused.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from milvus import MemoryStore
from milvus import expr as E
from schemas import storage_key
from streams.jobs.forget import forget_scope
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration

Factory = Callable[..., MemoryStore]


def test_forgotten_rows_stay_forgotten_against_every_writer(store_factory: Factory) -> None:
    store = store_factory(dim=8)
    store.upsert([make_record(m, seed=i) for i, m in enumerate(("a", "b", "c"))], "core")
    read = store.get(["a", "b", "c"], tenant="acme", with_vector=True)  # a writer reads ...
    assert store.forget(["a", "b"], tenant="acme") == 2
    assert store.forget(["a"], tenant="acme") == 0  # already gone: nothing found
    # ... and writes back what it read, by every write path of the store
    rows = [{k: v for k, v in r.items() if k != "partition"} for r in read]
    assert store.upsert(rows, "buffer") == 1
    assert store.update_fields([{"id": m, "utility": 0.9} for m in "abc"], tenant="acme") == 1
    assert store.move(["a", "b", "c"], "core", tenant="acme") == 1
    assert sorted(r["id"] for r in store.get(["a", "b", "c"], tenant="acme")) == ["c"]
    # another tenant's same id is not tombstoned
    assert store.upsert([make_record("a", tenant="other")], "core") == 1
    assert [r["id"] for r in store.get(["a"], tenant="other")] == ["a"]
    # a plain delete (dedup, eviction) does not tombstone: the row may come back
    assert store.delete(["c"], tenant="acme") == 1
    assert store.upsert([make_record("c")], "core") == 1


def test_tombstones_expire_after_their_ttl(store_factory: Factory) -> None:
    store = store_factory(dim=8, tombstone_ttl_s=600)
    store.upsert([make_record("x")], "core")
    store.forget(["x"], tenant="acme", at=0.0)  # a notice from long ago: already expired
    assert store.upsert([make_record("x")], "core") == 1
    assert store.forget(["x"], tenant="acme") == 1
    assert store.upsert([make_record("x")], "core") == 0


def test_a_forget_racing_with_writers_always_wins(store_factory: Factory) -> None:
    store = store_factory(dim=8)
    ids = [f"m{i}" for i in range(20)]
    store.upsert([make_record(m, seed=i) for i, m in enumerate(ids)], "core")
    read = [{k: v for k, v in r.items() if k != "partition"}
            for r in store.get(ids, tenant="acme", with_vector=True)]  # fmt: skip
    stop = threading.Event()

    def rewrite() -> None:  # a read-modify-writer replaying what it read
        while not stop.is_set():
            store.upsert(read, "core")

    writers = [threading.Thread(target=rewrite) for _ in range(2)]
    for w in writers:
        w.start()
    try:
        assert store.forget(ids[:10], tenant="acme") == 10
    finally:
        stop.set()
        for w in writers:
            w.join(30)
    left = sorted(r["id"] for r in store.get(ids, tenant="acme"))
    assert left == sorted(ids[10:])


def test_reads_leave_out_keys_forgotten_lately(store_factory: Factory) -> None:
    """A row whose key is tombstoned is what a bounded read finds for a moment after
    its delete: every read of the store leaves it out until the tombstone expires."""
    now = [1_000.0]
    store = store_factory(dim=8)
    store.tombstones.clock = lambda: now[0]
    recs = [make_record(m, seed=i) for i, m in enumerate(("a", "b"))]
    store.upsert([*recs, make_record("a", tenant="other", seed=0)], "core")
    # the row is still stored: the state of a stale replica right after the delete
    store.tombstones.add([storage_key("acme", "a")])
    query = recs[0]["vector"]

    def seen() -> dict[str, list[str]]:
        flt = E.build_filter(tenant="acme")
        return {
            "search": [h["id"] for h in store.search(query, tenant="acme", k=5)],
            "lookup": [r["id"] for r in store.lookup(["a", "b"], tenant="acme")],
            "get": [r["id"] for r in store.get(["a", "b"], tenant="acme")],
            "query_rows": sorted(
                r["id"] for r in store.query_rows(flt, ["core"], ["id"], limit=10)
            ),  # fmt: skip
        }

    assert seen() == {"search": ["b"], "lookup": ["b"], "get": ["b"], "query_rows": ["b"]}
    # the same id in another tenant is another key
    assert [h["id"] for h in store.search(query, tenant="other", k=5)] == ["a"]
    # expired: the key may be written again, so a row with it is real
    now[0] += store.tombstones.ttl_s + 1
    assert seen() == {"search": ["a", "b"], "lookup": ["a", "b"], "get": ["a", "b"],
                      "query_rows": ["a", "b"]}  # fmt: skip


def test_a_forget_again_deletes_a_row_written_back_while_tombstoned(
    store_factory: Factory,
) -> None:
    """A writer of another process put the row back before the forget's notice reached
    it (its key is tombstoned here, the row stored): reads leave it out, and forgetting
    the id again still finds and deletes it instead of answering "not found"."""
    store = store_factory(dim=8)
    store.upsert([make_record("a")], "core")
    store.tombstones.add([storage_key("acme", "a")])
    assert store.get(["a"], tenant="acme") == []
    assert [r["id"] for r in store.get(["a"], tenant="acme", include_forgotten=True)] == ["a"]
    events = forget_scope(store, "acme", memory_id="a")
    assert [e.memory_id for e in events] == ["a"]
    assert store.get(["a"], tenant="acme", include_forgotten=True) == []


def test_forgetting_a_folded_id_forgets_its_survivor(store_factory: Factory) -> None:
    """A folded id reads as its survivor, which holds its content: forgetting the id
    forgets the survivor (along a chain of folds), so nothing reads back afterwards;
    an id folded into a memory already gone, or another agent's, forgets nothing."""
    from streams.respond.browse import MemoryReader

    store = store_factory(dim=8)
    store.upsert([make_record(m, seed=i) for i, m in enumerate(("s", "t", "u"))], "core")
    store.history.fold("acme", {"a": "s", "b": "c", "c": "t", "g": "gone"}, ts=1)
    reader = MemoryReader(store, None)
    assert reader.get("acme", ["a"])["a"]["memory_id"] == "s"  # reads as its survivor
    events = forget_scope(store, "acme", memory_id="a")
    assert [(e.memory_id, e.kind) for e in events] == [("s", "forgotten")]
    assert "folded into s" in events[0].reason
    assert store.get(["s"], tenant="acme") == [] and reader.get("acme", ["a", "s"]) == {}
    # the named id is tombstoned too: a replay of its write stores nothing again
    assert store.upsert([make_record("a")], "core") == 0
    # b -> c -> t: the chain is followed to the stored memory
    assert [e.memory_id for e in forget_scope(store, "acme", memory_id="b")] == ["t"]
    assert forget_scope(store, "acme", memory_id="g") == []  # its survivor is gone
    assert [r["id"] for r in store.get(["u"], tenant="acme")] == ["u"]  # untouched
    store.history.fold("acme", {"h": "u"}, ts=2)
    assert forget_scope(store, "acme", memory_id="h", agent_id="agent-2") == []
    assert [e.memory_id for e in forget_scope(store, "acme", memory_id="h",
                                              agent_id="agent-1")] == ["u"]  # fmt: skip
