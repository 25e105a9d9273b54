"""MemoryStore against Milvus Lite and a real Milvus server (same tests for both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from milvus import MemoryStore
from schemas.errors import ConfigError, InvalidRecord
from tests.integration.milvus_fixtures import make_record, unit_vector

pytestmark = pytest.mark.integration

Factory = Callable[..., MemoryStore]
DIM = 8


def test_create_makes_partitions_and_indexes(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    c = store.client
    assert {"core", "buffer"} <= set(c.list_partitions(store.collection))
    assert "vector" in c.list_indexes(store.collection)
    assert store.count() == 0
    # connecting again to an existing collection is fine
    again = store_factory(dim=DIM, collection=store.collection)
    assert again.count() == 0


def test_upsert_is_idempotent(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    recs = [make_record(f"m{i}", seed=i) for i in range(20)]
    assert store.upsert(recs, "buffer") == 20
    assert store.upsert(recs, "buffer") == 20
    assert store.count() == 20
    assert store.count("buffer") == 20
    assert store.count("core") == 0
    # duplicate ids inside one call: last one wins
    dup = [make_record("m0", text="first"), make_record("m0", text="second")]
    assert store.upsert(dup, "buffer") == 1
    (row,) = store.get(["m0"], tenant="acme")
    assert row["text"] == "second"
    assert store.count() == 20


def test_upsert_into_other_partition_relocates(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record("a", seed=1), make_record("b", seed=2)], "buffer")
    store.upsert([make_record("a", seed=1, reward=9.0)], "core")
    rows = store.get(["a"], tenant="acme")
    assert len(rows) == 1
    assert rows[0]["partition"] == "core"
    assert rows[0]["reward"] == 9.0
    assert store.count("core") == 1
    assert store.count("buffer") == 1
    # replaying the same write changes nothing
    store.upsert([make_record("a", seed=1, reward=9.0)], "core")
    assert store.count("core") == 1 and store.count("buffer") == 1


def test_move_and_get_partition(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    v = unit_vector(DIM, 7)
    store.upsert([make_record(f"x{i}", seed=i) for i in range(5)], "buffer")
    store.upsert([make_record("keep", vector=v, metadata={"k": "v"})], "core")
    assert store.move(["x1", "x3", "missing", "keep"], "core", tenant="acme") == 2
    rows = {r["id"]: r for r in store.get(["x0", "x1", "x3", "keep", "nope"], tenant="acme")}
    assert set(rows) == {"x0", "x1", "x3", "keep"}
    assert rows["x0"]["partition"] == "buffer"
    assert rows["x1"]["partition"] == rows["x3"]["partition"] == "core"
    assert store.count("core") == 3 and store.count("buffer") == 3
    # moved rows keep their vector and fields
    (keep,) = store.get(["keep"], tenant="acme", with_vector=True)
    assert keep["metadata"] == {"k": "v"}
    np.testing.assert_allclose(keep["vector"], v, rtol=1e-6)
    assert store.move(["x1"], "buffer", tenant="acme") == 1
    assert [r["partition"] for r in store.get(["x1"], tenant="acme")] == ["buffer"]
    # get keeps request order
    assert [r["id"] for r in store.get(["x3", "x0", "x1"], tenant="acme")] == ["x3", "x0", "x1"]


def test_delete(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record(f"d{i}", seed=i) for i in range(4)], "buffer")
    store.upsert([make_record("c0", seed=9)], "core")
    assert store.delete(["d0", "c0", "ghost"], tenant="acme") == 2
    assert store.get(["d0", "c0"], tenant="acme") == []
    assert store.count() == 3
    assert store.delete([], tenant="acme") == 0


def test_count_per_partition_and_tenant(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record(f"a{i}", tenant="alpha", seed=i) for i in range(3)], "core")
    store.upsert([make_record(f"b{i}", tenant="beta", seed=i) for i in range(5)], "buffer")
    store.upsert([make_record("a9", tenant="alpha", seed=9)], "buffer")
    assert store.count() == 9
    assert store.count(tenant="alpha") == 4
    assert store.count("core", tenant="alpha") == 3
    assert store.count("buffer", tenant="alpha") == 1
    assert store.count("core", tenant="beta") == 0
    assert store.count(tenant="nobody") == 0
    with pytest.raises(InvalidRecord):
        store.count("archive")


def test_scan_pages(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record(f"s{i:03d}", seed=i) for i in range(23)], "buffer")
    store.upsert([make_record(f"c{i:03d}", seed=i) for i in range(6)], "core")
    store.upsert([make_record(f"o{i:03d}", tenant="other", seed=i) for i in range(4)], "core")
    rows = list(store.scan(tenant="acme", batch_size=5))
    assert len(rows) == 29
    assert len({r["id"] for r in rows}) == 29
    assert {r["partition"] for r in rows if r["id"].startswith("s")} == {"buffer"}
    assert {r["partition"] for r in rows if r["id"].startswith("c")} == {"core"}
    core = list(store.scan(partition="core", batch_size=3, output_fields=["id", "tenant"]))
    assert sorted(r["id"] for r in core) == sorted(
        [f"c{i:03d}" for i in range(6)] + [f"o{i:03d}" for i in range(4)]
    )
    assert set(core[0]) == {"id", "tenant", "partition"}
    with_vec = next(store.scan(partition="core", batch_size=2, with_vector=True))
    assert with_vec["vector"].shape == (DIM,)


def test_search_nearest_within_tenant(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    q = unit_vector(DIM, 100)
    near = unit_vector(DIM, base=q, noise=0.05, seed=1)
    mid = unit_vector(DIM, base=q, noise=0.3, seed=2)
    recs = [make_record("near", vector=near), make_record("mid", vector=mid, agent_id="agent-2")]
    recs += [
        make_record(f"far{i}", vector=unit_vector(DIM, base=-q, noise=0.5, seed=200 + i))
        for i in range(10)
    ]
    store.upsert(recs, "buffer")
    store.upsert([make_record("near", vector=near)], "core")  # lives in core now
    # another tenant's exact match must never show up
    store.upsert([make_record("spy", tenant="evil", vector=q)], "core")
    hits = store.search(q, tenant="acme", k=3)
    assert [h["id"] for h in hits][:2] == ["near", "mid"]
    assert hits[0]["partition"] == "core" and hits[1]["partition"] == "buffer"
    assert hits[0]["distance"] >= hits[1]["distance"] >= hits[2]["distance"]
    assert 0.9 < hits[0]["distance"] <= 1.0001
    assert all(h["tenant"] == "acme" for h in hits)
    assert "vector" not in hits[0]
    assert len(store.search(q, tenant="acme", k=50)) == 12
    # scoped by agent, partition and structured filters
    assert [h["id"] for h in store.search(q, "acme", 5, agent_id="agent-2")] == ["mid"]
    assert [h["id"] for h in store.search(q, "acme", 1, partitions=("buffer",))] == ["mid"]
    got = store.search(q, "acme", 5, extra_filter={"valence": [1], "metadata.task": "demo"})
    assert got[0]["id"] == "near"
    assert store.search(q, "acme", 5, extra_filter={"created_ts": {">": 1_800_000_000_000}}) == []
    assert store.search(q, "evil", 5)[0]["id"] == "spy"


@pytest.mark.parametrize(
    "hostile",
    [
        'acme" || tenant != "',
        "acme' or '1'=='1",
        'acme\\" or true or "',
        "acme) || (true",
        "ac\nme",
        "acmé ☃ 🚀",
        "",
    ],
)
def test_hostile_filter_values_do_not_widen_scope(store_factory: Factory, hostile: str) -> None:
    store = store_factory(dim=DIM)
    q = unit_vector(DIM, 5)
    store.upsert([make_record("victim", tenant="acme", vector=q)], "core")
    store.upsert([make_record("victim2", tenant="other", vector=q, metadata={"t": "x"})], "buffer")
    if hostile == "":
        with pytest.raises(InvalidRecord):
            store.search(q, tenant=hostile, k=5)
        return
    assert store.search(q, tenant=hostile, k=5) == []
    assert store.search(q, tenant="acme", k=5, agent_id=hostile) == []
    assert store.search(q, "acme", 5, extra_filter={"metadata.task": hostile}) == []
    assert store.search(q, "acme", 5, extra_filter={f"metadata.{hostile}": "x"}) == []
    assert store.count(tenant=hostile) == 0
    assert list(store.scan(tenant=hostile)) == []
    assert store.get([hostile], tenant="acme") == []
    assert store.delete([hostile], tenant="acme") == 0
    assert store.count() == 2
    # a row whose values contain the hostile text round-trips and is matched exactly
    store.upsert([make_record("h", tenant="acme", vector=q, metadata={"task": hostile})], "core")
    hits = store.search(q, "acme", 5, extra_filter={"metadata.task": hostile})
    assert [h["id"] for h in hits] == ["h"]
    assert store.get(["h"], tenant="acme")[0]["metadata"] == {"task": hostile}


def test_invalid_inputs_are_rejected(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    with pytest.raises(InvalidRecord):
        store.upsert([make_record("bad", vector=np.ones(DIM + 1))], "core")
    with pytest.raises(InvalidRecord):
        store.upsert([make_record("nan", reward=float("nan"))], "core")
    with pytest.raises(InvalidRecord):
        store.upsert([make_record("x", bogus=1)], "core")
    with pytest.raises(InvalidRecord):
        store.upsert([make_record("x")], "archive")  # type: ignore[arg-type]
    with pytest.raises(InvalidRecord):
        store.search(unit_vector(DIM, 1), "acme", 5, extra_filter={"vector": 1})
    with pytest.raises(InvalidRecord):
        store.search(unit_vector(DIM, 1), "acme", 5, extra_filter={"step": {"; drop": 1}})
    with pytest.raises(InvalidRecord):
        store.search(unit_vector(DIM, 1), "acme", 5, extra_filter={"step": "1 || true"})
    assert store.count() == 0


def test_update_fields(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    v = unit_vector(DIM, 3)
    store.upsert([make_record("u", vector=v)], "core")
    assert (
        store.update_fields(
            [{"id": "u", "utility": 0.75, "uses": 3}, {"id": "nope"}], tenant="acme"
        )
        == 1
    )
    (row,) = store.get(["u"], tenant="acme", with_vector=True)
    assert row["utility"] == 0.75 and row["uses"] == 3 and row["partition"] == "core"
    assert row["text"] == "memory u"
    np.testing.assert_allclose(row["vector"], v, rtol=1e-6)
    assert store.count() == 1


def test_dim_mismatch_on_reconnect(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    with pytest.raises(ConfigError, match="dim"):
        store_factory(dim=DIM * 2, collection=store.collection)


def test_data_persists_across_close_and_reconnect(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record(f"p{i}", seed=i) for i in range(7)], "buffer")
    store.upsert([make_record("pc", seed=99)], "core")
    store.close()
    again = store_factory(dim=DIM, collection=store.collection)
    assert again.count() == 8
    assert again.count("core") == 1
    assert [r["partition"] for r in again.get(["pc"], tenant="acme")] == ["core"]
    hits = again.search(unit_vector(DIM, 99), "acme", 1)
    assert hits[0]["id"] == "pc"


def test_wait_indexed_returns_once_every_row_is_indexed(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    n = 3000 if not store.is_lite else 50
    store.upsert([make_record(f"w{i}", seed=i) for i in range(n)], "buffer")
    store.upsert([make_record(f"w{i}", seed=i) for i in range(0, n, 10)], "core")  # deletes
    store.client.flush(store.collection)
    took = store.wait_indexed(timeout_s=120, poll_s=0.2)
    assert set(took) == {"compact_s", "index_s"} and min(took.values()) >= 0.0
    if not store.is_lite:
        d = store.client.describe_index(store.collection, "vector")
        assert int(d["pending_index_rows"]) == 0
        assert int(d["indexed_rows"]) >= int(d["total_rows"]) > 0
    # the search sees every row afterwards
    assert store.count() == n
    # HNSW is approximate: among 3,000 random 8-d vectors another may come first, but the
    # row's own vector finds it among the first few
    hits = store.search(unit_vector(DIM, 3), tenant="acme", k=5)
    assert "w3" in [h["id"] for h in hits]


def test_one_call_search_labels_partitions_after_every_kind_of_write(
    store_factory: Factory,
) -> None:
    """Search over both partitions is one Milvus call labelled by the write-time stamp."""
    store = store_factory(dim=DIM)
    q = unit_vector(DIM, 100)
    vecs = {f"p{i}": unit_vector(DIM, base=q, noise=0.05 * (i + 1), seed=i) for i in range(4)}
    store.upsert([make_record(m, vector=v, metadata={"k": m}) for m, v in vecs.items()], "buffer")
    store.upsert([make_record("p0", vector=vecs["p0"], metadata={"k": "p0"})], "core")  # relocate
    store.move(["p1"], "core", tenant="acme")
    store.move(["p0"], "buffer", tenant="acme")  # and back
    store.update_fields([{"id": "p2", "utility": 0.5}], tenant="acme")  # rewrite in place (buffer)
    want = {"p0": "buffer", "p1": "core", "p2": "buffer", "p3": "buffer"}
    calls: list[list[str]] = []
    real = store.client.search

    def counting(*a: Any, **kw: Any) -> Any:
        calls.append(list(kw["partition_names"]))
        return real(*a, **kw)

    store.client.search = counting  # type: ignore[method-assign]
    hits = store.search(q, tenant="acme", k=10, output_fields=["id", "metadata"])
    assert calls == [["core", "buffer"]]  # one request
    assert {h["id"]: h["partition"] for h in hits} == want
    # the stamp never leaks into what callers read
    assert all(h["metadata"] == {"k": h["id"]} for h in hits)
    assert all("_partition" not in r["metadata"] for r in store.get(list(want), tenant="acme"))
    assert all("_partition" not in r["metadata"] for r in store.scan(tenant="acme"))
    assert {r["id"]: r["partition"] for r in store.get(list(want), tenant="acme")} == want
    assert "metadata" not in store.search(q, tenant="acme", k=2, output_fields=["id"])[0]


def test_search_falls_back_per_partition_for_unstamped_rows(store_factory: Factory) -> None:
    """Rows written without the stamp (older data, other clients) are still labelled right."""
    store = store_factory(dim=DIM)
    q = unit_vector(DIM, 100)
    store.upsert([make_record("new", vector=unit_vector(DIM, base=q, noise=0.1, seed=1))], "core")
    legacy = store._row(make_record("old", vector=q))  # noqa: SLF001 - bypass the stamp
    store.client.upsert(store.collection, [legacy], partition_name="buffer")
    hits = store.search(q, tenant="acme", k=5)
    assert [(h["id"], h["partition"]) for h in hits] == [("old", "buffer"), ("new", "core")]
