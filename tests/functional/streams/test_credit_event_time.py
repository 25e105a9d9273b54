"""The credit job joins in event-time order; the applier waits for rows not stored yet.

The store is an in-memory fake with the calls the applier makes (functional tier).
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from operators.credit import CreditStats
from schemas import EpisodeOutcome, MemoryUsage, UtilityUpdate, encode, storage_key
from streams.jobs.credit import CreditJob, EventTimeQueue, UtilityApplier
from streams.settings import Settings


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.history = SimpleNamespace(record=lambda events: None)

    def add(self, tenant: str, mid: str) -> None:
        row = {"id": mid, "tenant": tenant, "utility": 0.0, "uses": 0, "partition": "core"}
        self.rows[storage_key(tenant, mid)] = {**row, "metadata": {}}

    def get_keys(self, keys: list[str], with_vector: bool = False) -> list[dict[str, Any]]:
        return [dict(self.rows[k], metadata=dict(self.rows[k]["metadata"]))
                for k in keys if k in self.rows]  # fmt: skip

    def survivors_of(self, tenant: str, ids: list[str]) -> dict[str, dict[str, Any]]:
        return {}

    def upsert(self, rows: list[dict[str, Any]], partition: str) -> None:
        for r in rows:
            self.rows[storage_key(r["tenant"], r["id"])] = {**r, "partition": partition}


def update(uid: str, mid: str, credit: float) -> UtilityUpdate:
    return UtilityUpdate(update_id=uid, memory_id=mid, tenant="t", credit=credit, ts=1)


def test_queue_releases_in_event_time_order_whatever_the_arrival() -> None:
    records = [(ts, rank, f"id{ts}-{rank}") for ts in range(0, 10_000, 1000) for rank in (0, 1)]
    released = []
    for seed in range(3):  # each record late by up to the lateness: any such arrival order
        rng = random.Random(seed)
        arrival = sorted(records, key=lambda r: r[0] + rng.uniform(0, 3000))
        q = EventTimeQueue(lateness_ms=3000)
        got = []
        for ts, rank, ident in arrival:
            q.push("t", ts, rank, ident, (ts, rank))
            got += q.due()
        assert all(ts <= 9000 - 3000 for ts, _ in got)  # nothing before the watermark passed
        assert got, "the watermark passed the early records"
        got += q.due(flush=True)
        assert len(q) == 0
        released.append(got)
    assert released[0] == sorted(released[0])  # usage (rank 0) before feedback at one time
    assert released[1] == released[0] == released[2]


def test_queue_tenants_have_their_own_watermark() -> None:
    q = EventTimeQueue(lateness_ms=10)
    q.push("a", 100, 0, "x", "a100")
    q.push("b", 5, 0, "y", "b5")
    q.push("a", 200, 1, "z", "a200")
    assert q.due() == ["a100"]  # b's watermark (5) has not passed b's record
    q.push("b", None, 1, "", "b-untimed")  # takes b's watermark
    assert q.due(flush=True) == ["a200", "b5", "b-untimed"]


def test_applier_holds_an_update_until_its_row_exists_keeping_the_memory_order() -> None:
    store = FakeStore()
    store.add("t", "m0")
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    ups = [update("u1", "m1", 1.0), update("u0", "m0", 1.0), update("u2", "m1", -1.0)]
    assert applier.apply(ups, now_s=0.0) == 1  # m0 applied; m1's two wait, in order
    assert [u.update_id for _, u in applier.held] == ["u1", "u2"]
    store.add("t", "m1")  # a hindsight write stores it
    assert applier.apply([], now_s=1.0) == 1 and not applier.held
    d = Settings().jobs.credit_discount
    want = CreditStats.of({}).fold(1.0, d).fold(-1.0, d).mean  # u1 then u2, as emitted
    assert want != pytest.approx(CreditStats.of({}).fold(-1.0, d).fold(1.0, d).mean)
    assert store.rows[storage_key("t", "m1")]["utility"] == pytest.approx(want)
    # a row that never comes: skipped once the hold ran out
    applier.apply([update("u3", "gone", 1.0)], now_s=2.0)
    assert applier.held and applier.skipped == 0
    applier.apply([], now_s=2.0 + Settings().jobs.credit_hold_s)
    assert not applier.held and applier.skipped == 1


def test_applier_holds_an_outcomes_update_until_hindsight_committed_it() -> None:
    """However long the write role takes (a restart, a loaded machine), an update earned
    by a feedback record waits for its row until the hindsight agent has committed that
    record; then a row still missing is skipped, whatever the clock says."""
    store = FakeStore()
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    late = UtilityUpdate(update_id="u1", memory_id="m1", tenant="t", credit=1.0, ts=1,
                         feedback_partition=2, feedback_offset=7)  # fmt: skip
    never = late.model_copy(update={"update_id": "u2", "memory_id": "gone"})
    hold_s = Settings().jobs.credit_hold_s
    assert applier.apply([late, never], now_s=0.0, hindsight_done={2: 7}) == 0
    assert applier.apply([], now_s=10 * hold_s, hindsight_done={}) == 0  # nothing known yet
    assert len(applier.held) == 2 and applier.skipped == 0
    store.add("t", "m1")  # the hindsight agent's retrospective write, then its commit
    assert applier.apply([], now_s=10 * hold_s, hindsight_done={2: 8}) == 1
    assert not applier.held and applier.skipped == 1  # "gone": committed, no row
    assert store.rows[storage_key("t", "m1")]["utility"] == pytest.approx(1.0)


def test_where_credit_was_earned_goes_from_usage_through_the_job_to_the_row() -> None:
    """The responder's record names each hit's similarity; the agent's record for the
    same request names what it acted on; the job's update carries the similarity of the
    acted-on memory, and the applier folds it into the row's credit statistics."""
    s = Settings()
    job = CreditJob(s)
    sent: list[tuple[str, bytes]] = []

    async def send(topic: str, value: bytes, key: bytes | None = None, headers: Any = None) -> None:
        sent.append((topic, value))

    job.producer = SimpleNamespace(send=send)  # type: ignore[assignment]
    served = MemoryUsage(tenant="t", episode_id="e", request_id="r", memory_ids=["a", "b"],
                         weights=[0.6, 0.4], similarities=[0.9, 0.4], ts=1)  # fmt: skip
    agent = MemoryUsage(tenant="t", episode_id="e", request_id="r", memory_ids=["a", "b"],
                        weights=[0.0, 1.0], ts=1, source="agent")  # fmt: skip
    outcome = EpisodeOutcome(tenant="t", episode_id="e", reward=1.0, outcome_id="o")
    records = [(s.topic("usage"), encode(served)), (s.topic("usage"), encode(agent)),
               (s.topic("feedback"), encode(outcome))]  # fmt: skip
    assert b"similarities" not in encode(agent)  # older jobs refuse unknown fields

    async def go() -> None:
        for i, (topic, value) in enumerate(records):
            await job._handle(SimpleNamespace(topic=topic, value=value, key=b"k", headers=[],
                                              partition=0, offset=i))  # fmt: skip

    asyncio.run(go())
    ups = {u.memory_id: u for u in (UtilityUpdate.model_validate(orjson.loads(v))
                                    for t, v in sent if t == s.topic("credit"))}  # fmt: skip
    assert ups["b"].similarity == pytest.approx(0.4) and ups["a"].similarity is None
    store = FakeStore()
    store.add("t", "a")
    store.add("t", "b")
    applier = UtilityApplier(s, SimpleNamespace(store=store))
    assert applier.apply(list(ups.values()), now_s=0.0) == 2
    stats = CreditStats.of(store.rows[storage_key("t", "b")])
    assert stats.sim == pytest.approx(0.4) and stats.n == 1
    assert CreditStats.of(store.rows[storage_key("t", "a")]).sim_w == 0.0


def test_a_store_failure_part_way_keeps_the_held_updates_for_the_retry() -> None:
    """The applier retries `apply` with the batch's updates after a store failure; the
    updates it held from earlier batches must still be held then (their offsets are
    committed past once they leave it)."""
    from schemas.errors import StoreUnavailable

    store = FakeStore()
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    assert applier.apply([update("u1", "m1", 1.0)], now_s=0.0) == 0  # m1 not stored yet
    store.add("t", "m1")
    store.add("t", "m2")
    reads = store.get_keys

    def down(keys: list[str], with_vector: bool = False) -> list[dict[str, Any]]:
        store.get_keys = reads  # type: ignore[method-assign]  # back for the retry
        raise StoreUnavailable("Milvus went away")

    store.get_keys = down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        applier.apply([update("u2", "m2", 1.0)], now_s=1.0)
    assert [u.update_id for _, u in applier.held] == ["u1"]
    assert applier.apply([update("u2", "m2", 1.0)], now_s=1.0) == 2  # the retry: both
    assert store.rows[storage_key("t", "m1")]["utility"] == pytest.approx(1.0)
