"""Write isolation between tenants on the store (issue 21), on Milvus Lite and a server.

Memory ids are client-chosen and only unique within a tenant: two tenants using
the same ids must each keep exactly their own rows, whatever the other does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymilvus import CollectionSchema, DataType, FieldSchema, MilvusClient

from milvus import MemoryStore
from milvus.schema import field_specs
from schemas.errors import ConfigError
from tests.integration.milvus_fixtures import make_record, unit_vector

pytestmark = pytest.mark.integration

Factory = Callable[..., MemoryStore]
DIM = 8
TENANTS = ("alpha", "beta")
IDS = ("shared-1", "shared-2", "ep-1:0")


def _state(store: MemoryStore, tenant: str) -> dict[str, tuple[str, float, str]]:
    """(partition, reward, text) per id of one tenant, by id lookup and by scan (must agree)."""
    got = {r["id"]: (r["partition"], r["reward"], r["text"])
           for r in store.get(list(IDS), tenant=tenant)}  # fmt: skip
    scanned = {r["id"]: (r["partition"], r["reward"], r["text"])
               for r in store.scan(tenant=tenant)}  # fmt: skip
    assert got == scanned
    assert all(r["tenant"] == tenant for r in store.get(list(IDS), tenant=tenant))
    return got


def test_same_ids_in_two_tenants_never_touch_each_other(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    q = unit_vector(DIM, 1)
    a = [make_record(m, tenant="alpha", vector=q, text=f"alpha secret {m}", reward=1.0)
         for m in IDS]  # fmt: skip
    store.upsert(a, "core")
    before = _state(store, "alpha")
    # beta reuses every id: upserts into both partitions, moves, updates, deletes
    store.upsert([make_record(m, tenant="beta", text="beta", reward=-1.0) for m in IDS], "buffer")
    store.upsert([make_record(IDS[0], tenant="beta", text="beta", reward=-2.0)], "core")
    assert store.move(list(IDS), "buffer", tenant="beta") == 1  # only beta's core row
    assert store.update_fields([{"id": m, "reward": 9.0} for m in IDS], tenant="beta") == 3
    assert store.delete([IDS[1]], tenant="beta") == 1
    assert _state(store, "alpha") == before
    assert store.count(tenant="alpha") == 3 and store.count(tenant="beta") == 2
    assert _state(store, "beta") == {m: ("buffer", 9.0, "beta") for m in (IDS[0], IDS[2])}
    # a search by alpha sees its own rows only, with the client-facing ids
    hits = store.search(q, tenant="alpha", k=10)
    assert sorted(h["id"] for h in hits) == sorted(IDS) and "key" not in hits[0]
    # deleting alpha's ids as beta (already gone for beta) removes nothing of alpha
    assert store.delete(list(IDS), tenant="beta") == 2
    assert _state(store, "alpha") == before


def test_store_key_is_derived_not_taken_from_the_caller(store_factory: Factory) -> None:
    store = store_factory(dim=DIM)
    store.upsert([make_record("m", tenant="alpha", text="mine")], "core")
    # a row that names alpha's storage key but belongs to beta lands under beta's key
    store.upsert([make_record("m", tenant="beta", text="forged", key="alpha|m")], "core")
    assert [r["text"] for r in store.get(["m"], tenant="alpha")] == ["mine"]
    assert [r["text"] for r in store.get(["m"], tenant="beta")] == ["forged"]
    assert "key" not in store.get(["m"], tenant="alpha")[0]


OPS = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.sampled_from(
            ["upsert_core", "upsert_buffer", "move_core", "move_buffer", "delete", "update"]
        ),  # fmt: skip
        st.sampled_from(IDS),
        st.integers(-5, 5),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(ops=OPS)
def test_interleaved_writes_with_colliding_ids(store_factory: Factory, ops: list[Any]) -> None:
    """Random interleavings of two tenants' writes on the same ids: each tenant reads
    back exactly its own last write (a model of per-tenant state is the oracle)."""
    store = _shared_store(store_factory)
    store.client.delete(store.collection, filter='key != ""')
    model: dict[tuple[str, str], tuple[str, float, str]] = {}
    for n, (tenant, op, mid, value) in enumerate(ops):
        cur = model.get((tenant, mid))
        if op.startswith("upsert"):
            part = op.split("_")[1]
            text = f"{tenant} write {n}"
            store.upsert(
                [make_record(mid, tenant=tenant, seed=n, reward=float(value), text=text)], part
            )  # type: ignore[arg-type]
            model[(tenant, mid)] = (part, float(value), text)
        elif op.startswith("move"):
            part = op.split("_")[1]
            moved = store.move([mid], part, tenant=tenant)  # type: ignore[arg-type]
            assert moved == int(cur is not None and cur[0] != part)
            if cur is not None:
                model[(tenant, mid)] = (part, cur[1], cur[2])
        elif op == "delete":
            assert store.delete([mid], tenant=tenant) == int(cur is not None)
            model.pop((tenant, mid), None)
        else:
            updated = store.update_fields([{"id": mid, "reward": float(value)}], tenant=tenant)
            assert updated == int(cur is not None)
            if cur is not None:
                model[(tenant, mid)] = (cur[0], float(value), cur[2])
    for tenant in TENANTS:
        want = {m: v for (t, m), v in model.items() if t == tenant}
        assert _state(store, tenant) == want
        assert store.count(tenant=tenant) == len(want)


_STORES: dict[int, MemoryStore] = {}


def _shared_store(factory: Factory) -> MemoryStore:
    """One store for all examples of a run (a server collection costs seconds); the
    factory closes it and returns the collection to the pool after the test."""
    if id(factory) not in _STORES:
        _STORES[id(factory)] = factory(dim=DIM)
    return _STORES[id(factory)]


def _legacy_collection(uri: str, name: str, rows: list[dict[str, Any]]) -> None:
    """A collection as created before issue 21: primary key ``id``, no ``key`` field."""
    fields = []
    for s in field_specs():
        if s.primary:
            continue
        kw: dict[str, Any] = {}
        if s.dtype == DataType.VARCHAR:
            kw["max_length"] = s.max_length
        if s.vector:
            kw["dim"] = DIM
        if s.name == "id":
            kw.update(is_primary=True, auto_id=False)
        fields.append(FieldSchema(s.name, s.dtype, **kw))
    c = MilvusClient(uri=uri)
    try:
        c.create_collection(name, schema=CollectionSchema(fields), consistency_level="Strong")
        for p in ("core", "buffer"):
            c.create_partition(name, p)
        ip = c.prepare_index_params()
        ip.add_index(field_name="vector", index_type="FLAT", metric_type="COSINE")
        c.create_index(name, ip)
        c.load_collection(name)
        for part in ("core", "buffer"):
            mine = [{**r, "vector": [float(x) for x in r["vector"]],
                     "metadata": {**r["metadata"], "_partition": part}}
                    for r in rows if r["partition"] == part]  # fmt: skip
            for r in mine:
                r.pop("partition")
            c.insert(name, mine, partition_name=part)
    finally:
        c.close()


def test_legacy_collection_refused_then_migrated(store_factory: Factory) -> None:
    probe = store_factory(dim=DIM, connect=False)
    uri, name = probe.uri, f"legacy_{uuid.uuid4().hex[:8]}"
    rows = [make_record(f"m{i}", tenant=TENANTS[i % 2], seed=i, reward=float(i), utility=0.0,
                        uses=0, merged_count=1) | {"partition": "core" if i % 3 else "buffer"}
            for i in range(9)]  # fmt: skip
    _legacy_collection(uri, name, rows)
    try:
        with pytest.raises(ConfigError) as err:
            store_factory(dim=DIM, collection=name)
        msg = str(err.value)
        assert "dmem migrate" in msg and "\n" not in msg and name in msg
        out = store_factory(dim=DIM, collection=name, connect=False).migrate_storage_keys()
        assert out["status"] == "migrated" and out["rows"] == {"core": 6, "buffer": 3}
        store = store_factory(dim=DIM, collection=name)
        for tenant in TENANTS:
            mine = {r["id"]: r for r in rows if r["tenant"] == tenant}
            got = {r["id"]: r for r in store.get(list(mine), tenant=tenant)}
            assert set(got) == set(mine)
            for mid, r in mine.items():
                assert got[mid]["partition"] == r["partition"]
                assert got[mid]["reward"] == r["reward"] and got[mid]["text"] == r["text"]
                assert got[mid]["metadata"] == r["metadata"]  # stamp stripped again
        store.close()
        again = store_factory(dim=DIM, collection=name, connect=False).migrate_storage_keys()
        assert again["status"] == "current"
    finally:
        c = MilvusClient(uri=uri)
        try:
            c.drop_collection(name)
        finally:
            c.close()


def test_the_write_paths_evictions_delete_each_tenants_own_rows(store_factory: Factory) -> None:
    """`StoreService.evict` (what the write role does with `BatchResult.retract`): each
    (tenant, id) deletes that tenant's row only; an id that is not there is no error."""
    import asyncio

    from streams.settings import Settings
    from streams.store import StoreService

    store = store_factory(dim=DIM)
    for t in TENANTS:
        store.upsert([make_record(m, tenant=t, text=f"{t} {m}") for m in IDS], "core")

    async def evict() -> None:
        svc = StoreService(Settings(), DIM)
        svc.store = store
        await svc.evict([("alpha", IDS[0]), ("beta", IDS[1]), ("alpha", "never-written")])

    asyncio.run(evict())
    assert set(_state(store, "alpha")) == {IDS[1], IDS[2]}
    assert set(_state(store, "beta")) == {IDS[0], IDS[2]}


def test_the_write_paths_store_refusal_leaves_out_only_the_bad_row(store_factory: Factory) -> None:
    """`StoreService.write`: a row Milvus cannot hold (metadata JSON over its 64 KiB) is
    returned as refused with the reason; the rest of the partition's rows are stored."""
    import asyncio

    from schemas import storage_key
    from streams.settings import Settings
    from streams.store import StoreService
    from streams.write.replays import reconcile

    store = store_factory(dim=DIM)
    good = [make_record(m, tenant="alpha") for m in IDS]
    bad = make_record("too-big", tenant="alpha", metadata={"note": "\u20ac" * 30_000})

    async def write() -> dict[str, str]:
        svc = StoreService(Settings(), DIM)
        svc.store = store
        refused, replays = await svc.write({"core": [good[0], bad, *good[1:]]}, reconcile)
        assert not replays  # nothing was stored before
        return refused

    refused = asyncio.run(write())
    assert list(refused) == [storage_key("alpha", "too-big")]
    assert "JSON" in refused[storage_key("alpha", "too-big")]
    assert set(_state(store, "alpha")) == set(IDS)


def test_the_write_path_refuses_a_forgotten_id_with_its_reason(store_factory: Factory) -> None:
    """`StoreService.write`: a memory sent again after its forget is returned as refused
    with the reason (the write role dead-letters it), where the store's own check
    dropped it without a word; the other tenant's same id and the other rows are stored."""
    import asyncio

    from schemas import storage_key
    from streams.settings import Settings
    from streams.store import StoreService, forgotten_reason
    from streams.write.replays import reconcile

    store = store_factory(dim=DIM)
    store.upsert([make_record(IDS[0], tenant="alpha")], "core")
    assert store.forget([IDS[0]], tenant="alpha") == 1
    again = [make_record(m, tenant="alpha") for m in IDS] + [make_record(IDS[0], tenant="beta")]

    async def write() -> dict[str, str]:
        svc = StoreService(Settings(), DIM)
        svc.store = store
        refused, _ = await svc.write({"core": again}, reconcile)
        return refused

    refused = asyncio.run(write())
    assert refused == {storage_key("alpha", IDS[0]): forgotten_reason(store)}
    assert "forgotten" in forgotten_reason(store)
    assert set(_state(store, "alpha")) == set(IDS[1:])
    assert set(_state(store, "beta")) == {IDS[0]}
